"""Validation as train.py's loop calls it (docs/architecture.md, "Components"): the metrics,
best/, early stopping, a study's pruner, text samples; the last values, for the summary."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gearshift.engine.failures import TrainingFailed
from gearshift.tasks.metrics import ValidationFailed

if TYPE_CHECKING:
    from gearshift.build import Run
    from gearshift.observe.logger_backend import NullLogger


class Validation:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.values: dict[str, float | None] = dict.fromkeys(run.task.metrics)
        self.ema_values: dict[str, float | None] = dict.fromkeys(run.task.metrics)
        self.step: int | None = None  # the step last validated
        self.pruned_at: int | None = None  # the step the study's pruner stopped the run at

    @property
    def stopped(self) -> bool:
        """Early stopping or the study's pruner ended the run."""
        return self.run.best.should_stop or self.pruned_at is not None

    @property
    def stop_reason(self) -> str:
        pruned, early = self.pruned_at is not None, self.run.best.should_stop
        return "pruned" if pruned else "early_stop" if early else "completed"

    def __call__(self, step: int, logger: NullLogger, last: bool) -> None:
        """Validate the model (and its average) at `step`, log it, keep the best in best/;
        `last`: the run's last validation (text samples are drawn then too)."""
        run = self.run
        if run.val_batches is None:
            return
        self.step = step
        try:
            self.values.update(run.validation_metrics(run.model))  # tip 14: under inference_mode
            if run.ema is not None:
                self.ema_values.update(run.validation_metrics(run.ema.model))
        except ValidationFailed as failed:  # the user's code: keep what trained, then one line
            saved = run.save()
            run.checkpointer.wait()  # checkpoint.async_save: written before we go
            kept = f"checkpoint {saved} holds the weights" if saved else "no checkpoint was saved"
            raise TrainingFailed(f"validation at step {step}: {failed}; {kept}") from None
        metrics = {f"val/{key.removeprefix('val_')}": value for key, value in self.values.items()}
        judged = self.values
        if run.ema is not None:  # the average is what a run with it keeps: it is judged
            judged = self.ema_values
            metrics |= {f"val_ema/{key.removeprefix('val_')}": v for key, v in judged.items()}
        logger.log(metrics, step=step)
        self.log_samples(step, logger, last)
        if run.best.update(judged[run.best.metric], step):  # says so if it stops early
            run.checkpointer.save_best(run.position, check=run.check_finite)
        if run.reporter.report(step, judged[run.best.metric]):  # a study's pruner
            self.pruned_at = step  # `stopped`: the loop saves, then summarizes
        run.meter.resume()  # validation time is not training time

    def log_samples(self, step: int, logger: NullLogger, last: bool) -> None:
        """task.sample_every: text samples of the trained model (rank 0 draws and logs them;
        under FSDP every rank takes part in the forward passes)."""
        run, sampler = self.run, self.run.sampler
        if sampler is None or not sampler.due(step, last=last):
            return
        if run.ranks.is_zero or run.strategy == "fsdp":
            texts = sampler.draw(run.model, run.precision, step)
            logger.log_text("samples", texts, step)  # other ranks hold a null logger
