"""Fitting a reward model to fixed examples, with checkpoints that resume exactly.

``posttrain rm train`` (preference pairs) and ``posttrain prm train`` (labelled steps) both fit a
backbone with a fresh head by minibatch AdamW over a few passes of fixed examples. Each keeps its
run beside the model it saves at ``<output>``: the directory ``<output>-logs/`` holds the run's
``config.json``, ``metrics.jsonl`` and, every ``train.checkpoint_every`` steps and on SIGINT or
SIGTERM, ``checkpoints/step-N/`` (``model/``, itself a loadable reward model, and
``trainer_state.pt``: the optimiser, the step, the RNGs, what was measured before training and a
digest of the examples). ``--resume`` restores the newest checkpoint, draws the batch order again
from the seed and skips the finished batches, so that the resumed run logs the same metrics and
ends on the same weights as a run never stopped; examples that changed since are refused.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from pathlib import Path

import torch

from posttrain.config import ConfigError, RunConfig
from posttrain.train.checkpoint import save_checkpoint
from posttrain.train.epochs import epoch_batches
from posttrain.train.metrics import MetricsLogger
from posttrain.train.optimizer import adamw
from posttrain.train.resume import (
    check_examples,
    check_resumable,
    cut_metrics,
    load_trainer_state,
    load_weights,
    restoring,
)
from posttrain.train.run_dir import RunDir, open_run_dir
from posttrain.train.stopping import RunGuard

# (loss, metrics) of one batch of example indices, gradients flowing.
StepLoss = Callable[[list[int]], tuple[torch.Tensor, dict[str, float]]]


class HeadModel:
    """A reward model and its tokenizer, saved together as one loadable directory."""

    def __init__(self, model, tokenizer):
        self.model = model
        self.tokenizer = tokenizer

    def save(self, path: str | Path, state_dict: dict | None = None) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path, state_dict=state_dict)
        self.tokenizer.save_pretrained(path)


def run_paths(cfg: RunConfig, output: str, default: str) -> tuple[Path, Path]:
    """(where the model is saved: ``output``, else ``<output_dir>/<default>``; the run's ``<that>-logs``)."""
    model = Path(output or Path(cfg.output_dir) / default)
    return model, model.parent / f"{model.name}-logs"


def open_fit_run(cfg: RunConfig, output: Path, logs: Path, fields: tuple[str, ...], overwrite: bool,
                 resume: bool) -> RunDir:
    """Lock the logs directory for this run, as ``train`` locks its output_dir (a previous run in it is refused
    without ``overwrite`` or ``resume``); a resumed run's config must agree with the first one's on ``fields``
    (what the command reads), and a finished one (``training.json`` beside its model) has nothing to continue."""
    if resume and not (logs / "config.json").is_file():
        raise ConfigError(f"--resume: no run to continue in {logs} (it holds no config.json); start the run without "
                          "--resume")
    if resume and (output / "training.json").is_file():
        raise ConfigError(f"--resume: the run finished (its model and training.json are in {output}): nothing to "
                          "continue")
    run = open_run_dir(logs, overwrite=overwrite, resume=resume, what="the run's logs directory")
    try:
        if resume:
            check_resumable(logs, cfg, fields)
    except BaseException:
        run.close()
        raise
    return run


def start_fresh(cfg: RunConfig, output: Path, logs: Path) -> None:
    """Record the run's config, which ``--resume`` checks against, and drop an earlier run's ``training.json``,
    which marks a finished run; done once the models have loaded, so that a run refused at the start (a wrong
    model name) leaves no run behind."""
    (logs / "config.json").write_text(cfg.model_dump_json(indent=2))
    (output / "training.json").unlink(missing_ok=True)


class Fit:
    """The fitting loop of one run; ``measured`` holds what the caller measured before training (saved with
    every checkpoint, since the weights it was measured on are gone after a resume)."""

    def __init__(self, cfg: RunConfig, fields: tuple[str, ...], head: HeadModel, logs: Path, learning_rate: float,
                 examples: int, batch_size: int, epochs: int, digest: str, source: str):
        self.cfg = cfg
        self.fields = fields  # what the command reads of the config (see open_fit_run)
        self.head = head
        self.logs = logs
        self.optimizer = adamw(list(head.model.parameters()), learning_rate, cfg.train.weight_decay)
        self.examples = examples
        self.batch_size = batch_size
        self.epochs = epochs
        self.total = epochs * -(-examples // batch_size)  # optimiser steps
        self.digest = digest
        self.source = source  # what the examples come from, for the error when they changed
        self.step = 0
        self.measured: dict[str, float] = {}

    def save(self) -> Path:
        extra = {"rng": None, "examples": [self.examples, self.digest], "measured": self.measured}
        return save_checkpoint(self.logs, self.step, self.head, self.optimizer, None, extra,
                               config_json=self.cfg.model_dump_json(indent=2))

    def restore(self, checkpoint: Path) -> None:
        """Continue where ``checkpoint`` left off; ``metrics.jsonl`` is cut back to its step (last, so that a
        checkpoint that cannot be restored leaves the logs as they were)."""
        check_resumable(checkpoint, self.cfg, self.fields)  # an earlier run's, left by --overwrite, may differ
        state = load_trainer_state(checkpoint, ("examples", "measured"))
        check_examples(checkpoint, state["examples"], self.examples, self.digest, self.source)
        load_weights(self.head, checkpoint / "model")
        with restoring(checkpoint):
            self.optimizer.load_state_dict(state["optimizer"])
            self.measured = {key: float(value) for key, value in state["measured"].items()}
            self.step = int(state["step"])
            random.setstate(state["python_rng"])
            torch.set_rng_state(state["torch_rng"])
        cut_metrics(self.logs, self.step)

    def run(self, step_loss: StepLoss, split: str, logger: MetricsLogger, progress=None) -> None:
        """The passes over the examples, from the step reached. A signal stops the run after the step in flight,
        a checkpoint saved first (see :class:`~posttrain.train.stopping.RunGuard`)."""
        model, cfg = self.head.model, self.cfg
        # The order is drawn from the seed, so a resumed run draws the batches it has done and skips them.
        batches = epoch_batches(self.examples, self.batch_size, self.epochs, random.Random(cfg.seed))
        with RunGuard(self.save, lambda: self.step) as guard:
            for epoch, batch in itertools.islice(batches, self.step, None):
                guard.check()
                model.train()
                self.optimizer.zero_grad(set_to_none=True)
                loss, metrics = step_loss(batch)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
                self.optimizer.step()
                self.step += 1
                metrics = {"loss": loss.item(), **metrics, "grad_norm": float(grad_norm), "epoch": float(epoch + 1)}
                logger.log(split, self.step, metrics)
                if progress:
                    progress("train", self.step, self.total, metrics)
                if cfg.train.checkpoint_every and self.step % cfg.train.checkpoint_every == 0:
                    self.save()
            guard.check()
        model.eval()
