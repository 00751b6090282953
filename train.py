"""The training loop, yours to edit: `python train.py amp=on accum=4` (see README).

`main` is Hydra's entry point: it checks the config, runs `fit` in this process or in
`distributed.nproc_per_node` ranks, and ends a failure in one line. `fit` builds the run's
parts from the config (gearshift/build.py: each gear decided once for this machine, with
its reason; a checkpoint restored into them when resuming) and then trains in the loop
below, one optimizer step at a time. For a step of your own (two optimizers, a teacher,
two views of a sample) edit the step here: docs/make-it-yours.md.

The host waits for the device only at log steps, validations and checkpoints. The tips of
docs/gears.md are tagged where they act (`# tip N`).
"""

from __future__ import annotations

from pathlib import Path

import gearshift

CONF = Path(__file__).parent / "conf"
if __name__ == "__main__":  # first: bad input ends in one line before the parts load
    gearshift.preflight(CONF)  # exit 2 and no run folder for a config that would fail

import logging
import math
from itertools import islice

import hydra
import torch
from omegaconf import DictConfig

from gearshift.build import Run, build_run, distributed_job
from gearshift.data import DataError
from gearshift.data.loading import to_device
from gearshift.engine.failures import TrainingFailed
from gearshift.engine.optim import clip_grad_norm
from gearshift.observe.console import ProgressBar
from gearshift.observe.loggers import build_logger
from gearshift.observe.summary import finished_summary
from gearshift.observe.throughput import Interval
from gearshift.parallel.distributed import grad_sync
from gearshift.reporting import RunResult, read_log_point, summarize
from gearshift.state.preemption import StopRequest
from gearshift.validation import Validation

log = logging.getLogger("gearshift.train")


def fit(cfg: DictConfig, run_dir: Path, run_name: str | None = None) -> RunResult:
    """Train as `cfg` says; summary.json, checkpoints and the logs go to `run_dir` (rank 0's)."""
    with distributed_job(cfg.distributed, cfg.device, run_dir) as job:  # tip 18: DDP, not DP
        run = build_run(cfg, job.run_dir, job.ranks, job.strategy, job.device)
        return train(run, job.run_dir, run_name)


def train(run: Run, run_dir: Path, run_name: str | None) -> RunResult:
    cfg, p, ranks, task = run.cfg, run.position, run.ranks, run.task
    model, forward, precision, optimizers = run.model, run.forward, run.precision, run.optimizers
    # plain values for the step: a DictConfig lookup costs microseconds, a local nothing
    accum, non_blocking = cfg.accum, run.gears["non_blocking"]
    clip, set_to_none = cfg.optimizer.clip_grad_norm, cfg.optimizer.set_to_none
    log_every, val_every = cfg.log_every_n_steps, cfg.val_every_n_steps
    always_logged = (cfg.warmup_steps, run.total_steps)  # the warm-up's end, the last step
    max_steps = run.max_steps or math.inf  # a step budget (max_steps, max_tokens) wins over epochs
    max_epochs = math.inf if run.max_steps else cfg.epochs
    validation = Validation(run)  # the metrics, best/, early stopping, a study's pruner

    def finished() -> bool:
        # epochs count on their own: a resume with another batch size takes other steps
        epochs = p.epoch + p.epoch_done
        return p.step >= max_steps or epochs >= max_epochs or validation.stopped

    def logs_at(step: int) -> bool:
        return step % log_every == 0 or step in always_logged

    if (done := finished_summary(run_dir, finished(), run.total_steps)) is not None:
        return RunResult(model, optimizers, done, Interval())
    logger = build_logger(
        cfg.logger, run_dir, run.checkpointer.config, run_name, p.step, enabled=ranks.is_zero
    )
    shown = ranks.is_zero and cfg.progress_bar
    grad_norm: torch.Tensor | None = None  # the last one measured, on the device
    last_loss, stop_agreed, summary = math.nan, False, None
    try:
        with (
            ProgressBar(shown, run.total_steps, completed=p.step) as progress,
            StopRequest.for_ranks(ranks.world_size) as stop,  # SIGTERM, SIGUSR1: save, then stop
        ):
            run.meter.resume()
            run.profiler.begin()
            while not finished():
                run.train_batches.set_epoch(p.epoch, p.epoch_start)  # a resume starts mid-epoch
                p.epoch_batches = len(run.train_batches)  # this rank's, to the epoch's end
                batches = run.meter.timed(run.train_batches)  # the data wait of each batch
                while p.batch < p.epoch_batches and not finished():
                    # One optimizer step over a window of `accum` micro-batches (tip 13); an
                    # epoch's last window may be shorter. Each loss is divided by the window
                    # so that the gradients sum to the window's mean.
                    window, samples = min(accum, p.epoch_batches - p.batch), 0
                    for i, batch in enumerate(islice(batches, window)):
                        # tip 7: an asynchronous copy; tip 16: images channels_last
                        batch = to_device(batch, run.device, non_blocking, run.memory_format)
                        batch = run.transforms.on_batch(batch, train=True)  # augment on device
                        with grad_sync(forward, enabled=i == window - 1):  # tip 13: one all-reduce
                            with precision.autocast():  # tip 11: mixed precision
                                loss, terms = task.loss_terms(forward, batch)
                            if window > 1:
                                loss = loss / window
                            precision.backward(loss)  # fp16: the loss scaled by the GradScaler
                        run.losses.add(loss.detach(), p.step + 1, terms, window)  # tip 5: no sync
                        samples += task.count(batch)
                        p.batch += 1
                        p.trained += p.global_batch
                    if run.losses.update_allowed():  # on_nonfinite=skip: not after a NaN/inf loss
                        if clip is not None or logs_at(p.step + 1):  # else no norm is needed
                            precision.unscale(optimizers)  # fp16: clip the true gradients
                            grad_norm = clip_grad_norm(model.parameters(), clip)
                        precision.step(optimizers)  # tip 11: fp16 steps through the GradScaler
                    elif ranks.is_zero:
                        log.warning(
                            "step %d: non-finite loss, update skipped (on_nonfinite=skip)",
                            p.step + 1,
                        )
                    optimizers.zero_grad(set_to_none=set_to_none)  # tip 12: set_to_none
                    optimizers.step_schedules()
                    p.step += 1
                    if run.ema is not None:
                        run.ema.update(p.step)  # on the device, no sync
                    p.samples += samples
                    run.meter.step(samples)
                    run.profiler.after_step(p.step)

                    if logs_at(p.step):  # tip 5: the loop's one read of the device
                        point = read_log_point(run, grad_norm, stop_requested=bool(stop))
                        last_loss, stop_agreed = point.loss, point.stop_agreed
                        logger.log(point.metrics, step=p.step)
                        progress.update(p.step, point.samples_per_sec, point.loss)
                    if (val_every and p.step % val_every == 0) or finished():
                        # tip 14: under inference_mode; before saving, so that a checkpoint
                        # holds its outcome (best/, early stopping)
                        validation(p.step, logger, last=finished())
                    if stop_agreed if ranks.world_size > 1 else stop:  # ranks stop together
                        saved = run.save()
                        run.checkpointer.wait()  # checkpoint.async_save: written before we go
                        raise stop.stopped(p.step, saved)
                    if run.checkpointer.due(p.step, last=finished()):
                        run.save()
                if p.batch >= p.epoch_batches:
                    p.next_epoch()
            if validation.step != p.step:  # a run resumed at its end validates once
                validation(p.step, logger, last=True)
            run.checkpointer.wait()  # the last background write, before the summary
            summary = summarize(run, run_dir, last_loss, validation, logger)
    except DataError as error:  # found mid-epoch: checkpoint, then one line naming it
        saved = run.save_at_last_step()
        run.checkpointer.wait()
        raise error.after(saved) from None
    except (TrainingFailed, torch.OutOfMemoryError) as error:
        failed = error
        if isinstance(error, torch.OutOfMemoryError):
            failed = TrainingFailed(run.out_of_memory(error, p.step + 1))
        # a study's trial is marked failed now: a sweep killed before it notices the end
        # does not launch the trial again
        run.reporter.fail(str(failed))
        raise failed from None
    finally:
        run.close(quiet=summary is None)  # a checkpoint write in flight still completes
        logger.finish(summary)
    return RunResult(model, optimizers, summary, run.meter.steady_state())


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def main(cfg: DictConfig) -> float:
    """Hydra's task: train as `cfg` says; return what a sweep optimises."""
    return gearshift.run_task(cfg, fit)


if __name__ == "__main__":
    main()
