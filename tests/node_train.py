"""train.py as tests/test_multinode.py starts it on each node: the real task, plus what the
test needs to see. Every variable is optional:

  GEARSHIFT_TEST_OUT     each rank saves the parameters it ends with and the training steps
                         this process ran to OUT/rank<RANK>.pt
  GEARSHIFT_TEST_COPIES  each copy that data.stage_to makes appends a line to this file
  GEARSHIFT_TEST_DIE_AT  after this optimizer step the rank kills itself (SIGKILL), once:
                         it first writes GEARSHIFT_TEST_DIED, and a rank that finds that file
                         lives on
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402

import gearshift  # noqa: E402
import gearshift.data.images  # noqa: E402
import train  # noqa: E402

optimizer_steps = 0


def count_step(optimizer, args, kwargs) -> None:
    global optimizer_steps
    # not a training step: a resume creates the optimizer state that DCP loads into with
    # one zero-gradient step at lr 0 (torch.distributed.checkpoint.state_dict), which
    # moves no parameter
    if all(group["lr"] == 0 for group in optimizer.param_groups):
        return
    optimizer_steps += 1
    die_at, died = os.environ.get("GEARSHIFT_TEST_DIE_AT"), os.environ.get("GEARSHIFT_TEST_DIED")
    if die_at and optimizer_steps == int(die_at) and not Path(died).exists():
        Path(died).write_text(f"rank {os.environ['RANK']} died after step {optimizer_steps}\n")
        os.kill(os.getpid(), signal.SIGKILL)


def counted_copy(source: Path, target: Path) -> None:
    with open(os.environ["GEARSHIFT_TEST_COPIES"], "a") as copies:
        copies.write(f"{source} -> {target}\n")
    shutil.copytree(source, target)


def fit_and_save(cfg, run_dir, run_name=None):
    result = fit(cfg, run_dir, run_name)
    params = {k: v.detach().clone() for k, v in result.model.state_dict().items()}
    torch.save(
        {
            "params": params,
            "optimizer_steps": optimizer_steps,
            "summary": result.summary,
        },
        Path(os.environ["GEARSHIFT_TEST_OUT"]) / f"rank{os.environ['RANK']}.pt",
    )
    return result


register_optimizer_step_post_hook(count_step)
if "GEARSHIFT_TEST_COPIES" in os.environ:
    gearshift.data.images.stage = partial(gearshift.data.images.stage, copy=counted_copy)
fit = train.fit
if "GEARSHIFT_TEST_OUT" in os.environ:
    train.fit = fit_and_save  # main passes the module's `fit` when it runs

if __name__ == "__main__":
    gearshift.preflight(train.CONF)
    train.main()
