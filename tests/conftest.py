import pytest
import torch
from helpers import seconds

# A test with no time limit of its own gets this one, so none can hang the suite.
DEFAULT_LIMIT_S = 300


@pytest.fixture(autouse=True)
def _restore_torch_globals():
    """Gears flip process-wide switches; give every test the defaults back."""
    benchmark = torch.backends.cudnn.benchmark
    precision = torch.get_float32_matmul_precision()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn_deterministic = torch.backends.cudnn.deterministic
    yield
    torch.backends.cudnn.benchmark = benchmark
    torch.set_float32_matmul_precision(precision)
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    torch.backends.cudnn.deterministic = cudnn_deterministic


@pytest.fixture
def no_wandb_key(monkeypatch, tmp_path):
    """W&B as on a machine without a key: offline, into the run folder."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no ~/.config/wandb
    monkeypatch.setenv("WANDB_SILENT", "true")


# GPT-2's pre-tokenizer (tiktoken_ext/openai_public.py), for a tiny encoding built here:
# GPT-2's vocabulary cannot be downloaded in a test
GPT2_SPLIT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@pytest.fixture
def tiny_gpt2(monkeypatch):
    """A byte-pair encoding on GPT-2's pattern with 256 bytes and a few merges, served as
    tiktoken.get_encoding("gpt2") (tiktoken's own registry of loaded encodings)."""
    import tiktoken  # the dev extra

    ranks = {bytes([i]): i for i in range(256)}
    for merged in (b"th", b"the", b" the", b"ca", b"cat", b" cat", b" a", b"do", b"dog", b" dog"):
        ranks[merged] = len(ranks)
    encoding = tiktoken.Encoding(
        name="gpt2", pat_str=GPT2_SPLIT, mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": len(ranks)},
    )  # fmt: skip
    monkeypatch.setitem(tiktoken.registry.ENCODINGS, "gpt2", encoding)
    return encoding


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(seconds(DEFAULT_LIMIT_S)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
