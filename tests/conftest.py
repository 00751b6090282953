import os

import pytest
import torch
from helpers import seconds

# --dist loadgroup keeps each xdist_group on one worker under pytest 9.2 too (its docstring)
pytest_plugins = ["xdist_groups"]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One core per pytest-xdist worker, for its own tensors and for the processes it starts
    # (local_ranks.py and torch read OMP_NUM_THREADS): two workers' thread pools on two cores
    # spin against each other and made in-process runs 10x slower.
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# A test with no time limit of its own gets this one, so none can hang the suite.
DEFAULT_LIMIT_S = 300

# Tests moved to the slow tier (`make test-all`) to keep `make test` a few minutes, each with
# the fast test that covers its mechanism. A key without "[" names every case of a test.
CK = "tests/test_checkpoint.py::"
STOP_SIGNAL = CK + "test_a_stop_signal_is_handed_on_after_the_checkpoint_and_a_rerun_resumes"
SLOW_WITH_FAST_COVER = {
    # SLURM: the submitit path stays fast through a two-point sweep and a failing job
    "tests/test_slurm.py::test_a_signalled_job_checkpoints_is_requeued_and_resumes": STOP_SIGNAL,
    "tests/test_slurm.py::test_a_job_that_dies_without_a_result_fails_the_sweep": "tests/test_slurm.py::test_a_job_that_raises_fails_the_sweep",
    "tests/test_slurm.py::test_a_job_at_its_time_limit_with_no_requeues_left_fails_the_sweep": "tests/test_slurm.py::test_a_job_that_raises_fails_the_sweep",
    "tests/test_slurm.py::test_a_job_with_two_tasks_per_node_trains_as_2_rank_ddp": "tests/test_distributed.py::test_torchrun_leaves_one_run_folder_with_world_size_2",
    "tests/test_optuna_slurm.py::test_an_optuna_search_keeps_two_slurm_jobs_in_flight_and_prunes": "tests/test_optuna_sweeper.py::test_trials_run_side_by_side_and_the_best_is_the_best_run",
    "tests/test_optuna_slurm.py::test_a_killed_optuna_search_waits_for_its_live_jobs_and_relaunches_the_dead": "tests/test_optuna_sweeper.py::"
    "test_a_sigkilled_sweep_stops_its_trials_and_the_rerun_goes_on_as_one_study",
    "tests/test_slurm_two_nodes.py::test_a_two_node_job_requeued_mid_run_ends_as_an_uninterrupted_one": STOP_SIGNAL,
    # launchers and ranks
    "tests/test_launcher_signals.py::"
    "test_sigterm_to_the_launcher_saves_says_one_line_exits_143_and_a_rerun_resumes": STOP_SIGNAL,
    "tests/test_multinode.py::"
    "test_a_rank_killed_on_one_node_restarts_both_which_resume_from_the_checkpoint": "tests/test_distributed.py::"
    "test_a_killed_rank_restarts_the_job_which_resumes_to_the_same_parameters",
    "tests/test_distributed.py::test_fsdp_checkpoints_resume_to_the_same_shards_as_an_uninterrupted_run": "tests/test_resharding.py::"
    "test_a_checkpoint_loads_resharded_at_another_size_and_strategy[2-rank-fsdp-to-1-process]",
    # distributed.nproc_per_node=2 launching, its temporary folder left clean: the same
    # launch and clean-up from train.py on a run whose ranks find its input unusable
    "tests/test_distributed.py::test_nproc_per_node_starts_the_ranks_itself": "tests/test_distributed.py::"
    "test_input_the_ranks_find_unusable_is_one_line_from_rank_0[task-nproc_per_node]",
    # ranks that raise under distributed.nproc_per_node=2: the launcher in the test's process
    # (their failure reported, no error file left), from train.py in the test above
    "tests/test_distributed.py::test_ranks_that_fail_leave_nothing_in_the_temporary_folder": "tests/test_distributed.py::"
    "test_ranks_that_raise_leave_nothing_in_the_temporary_folder",
    # a rank SIGKILLed under torchrun: the agent tears the group down (here, with no restart
    # left, it ends the job; there, it restarts it)
    "tests/test_distributed.py::test_a_failed_rank_ends_the_job_instead_of_hanging": "tests/test_distributed.py::test_a_killed_rank_restarts_the_job_which_resumes_to_the_same_parameters",
    # train.py's exit 2 for a bad value: test_config's process; this message: in this process
    "tests/test_distributed.py::test_bad_distributed_input_is_one_line": "tests/test_distributed.py::test_bad_distributed_input_is_one_line_before_any_run_folder",
    "tests/test_distributed.py::test_a_multirun_sweep_runs_each_job_as_2_rank_ddp": "tests/test_sweeps.py::"
    "test_an_ablation_sweep_runs_each_gear_alone_in_its_own_process_and_reports",
    **{
        "tests/test_distributed.py::"
        f"test_input_the_ranks_find_unusable_is_one_line_from_rank_0[{case}]": "tests/test_distributed.py::"
        f"test_input_the_ranks_find_unusable_is_one_line_from_rank_0[{fast}]"
        for case, fast in (
            ("data-nproc_per_node", "data-gearshift.torchrun"),
            ("data-torchrun", "data-gearshift.torchrun"),
            ("task-torchrun", "task-nproc_per_node"),
            ("task-gearshift.torchrun", "task-nproc_per_node"),
        )
    },
    **{
        "tests/test_resharding.py::"
        f"test_a_checkpoint_loads_resharded_at_another_size_and_strategy[{case}]": "tests/test_resharding.py::"
        "test_a_checkpoint_loads_resharded_at_another_size_and_strategy[2-rank-fsdp-to-1-process]"
        for case in ("1-process-to-2-rank-ddp", "2-rank-ddp-async-to-2-rank-fsdp")
    },
    "tests/test_muon.py::"
    "test_fsdp_shards_step_with_muon_and_resume_to_one_process_with_the_doubled_batch": "tests/test_muon.py::"
    "test_2_ranks_under_ddp_with_muon_reach_one_process_with_the_doubled_batch",
    # a data error the ranks find: the same line from train.py's process without ranks
    "tests/test_foreign_shards.py::"
    "test_a_tar_cut_in_half_stops_the_run_with_one_line_and_exit_2[nproc_per_node]": "tests/"
    "test_foreign_shards.py::test_a_tar_cut_in_half_stops_the_run_with_one_line_and_exit_2[plain]",
    "tests/test_streams.py::test_a_stream_trains_through_the_cli_as_2_rank_ddp_with_tuned_loading": "tests/test_streams.py::test_sigterm_mid_epoch_then_resume_matches_an_uninterrupted_run",
    # sweeps
    "tests/test_optuna_sweeper.py::"
    "test_the_median_pruner_stops_a_hopeless_trial_after_its_first_validations": "tests/test_optuna_sweeper.py::test_the_readme_commands_search_prune_and_report",
    # a sweep SIGKILLed at three moments, rerun each time: the same kill and rerun end to end,
    # and each moment's rule in this process: a failed trial is not launched again (..._while_
    # the_rerun_waits_...), one that ended while no sweep waited counts (..._followed_to_its_
    # result), the report shows each trial as it ended (..._killed_sweep_shows_each_trial_...)
    "tests/test_optuna_sweeper.py::test_a_sweep_killed_at_three_moments_trains_every_trial_once": "tests/test_optuna_sweeper.py::"
    "test_a_sigkilled_sweep_stops_its_trials_and_the_rerun_goes_on_as_one_study",
    "tests/test_sweeps.py::test_logger_group_wins_over_the_sweep_name": "tests/test_sweeps.py::test_sweep_runs_share_a_wandb_group_named_after_the_sweep",
    "tests/test_sweeps.py::test_a_single_run_has_no_group_unless_one_is_set": "tests/test_sweeps.py::test_sweep_runs_share_a_wandb_group_named_after_the_sweep",
    # the user's own code, and checkpoints
    "tests/test_make_it_yours.py::test_sigterm_then_resume_matches_an_uninterrupted_run": STOP_SIGNAL,
    "tests/test_make_it_yours.py::test_the_example_trains_as_2_rank_ddp": "tests/test_make_it_yours.py::test_a_term_logged_beside_the_loss_changes_the_task_file_alone[2]",
    "tests/test_make_it_yours.py::test_a_term_logged_beside_the_loss_changes_the_task_file_alone[1]": "tests/test_make_it_yours.py::test_a_term_logged_beside_the_loss_changes_the_task_file_alone[2]",
    **{
        f"{CK}test_a_save_killed_mid_write_leaves_the_previous_checkpoint_for_resume[{case}]": f"{CK}test_a_save_killed_mid_write_leaves_the_previous_checkpoint_for_resume[mid-shard]"
        for case in ("before-metadata", "mid-shard-async")
    },
    "tests/test_tokens.py::test_a_gpt_learns_a_grammar_well_below_the_unigram_entropy": "tests/test_lm.py::test_a_bigram_model_learns_the_chain_down_to_near_its_entropy",
}


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


def moved_to_slow(nodeid: str) -> str | None:
    """The fast test that covers `nodeid` if it was moved to the slow tier, else None."""
    return SLOW_WITH_FAST_COVER.get(nodeid) or SLOW_WITH_FAST_COVER.get(nodeid.split("[")[0])


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects by the marker
def pytest_collection_modifyitems(config, items):
    collected = {item.nodeid for item in items}
    for item in items:
        cover = moved_to_slow(item.nodeid)
        if cover is None:
            continue
        item.add_marker(pytest.mark.slow)
        # a cover that was renamed, or moved to slow itself, covers nothing
        covered = cover in collected or any(n.startswith(cover + "[") for n in collected)
        cover_file_collected = any(n.startswith(cover.split("::")[0] + "::") for n in collected)
        if cover_file_collected and not covered:
            raise pytest.UsageError(f"{item.nodeid}: its fast cover {cover} is not a test")
        assert moved_to_slow(cover) is None, f"{item.nodeid}: its cover {cover} is slow too"
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(seconds(DEFAULT_LIMIT_S)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
