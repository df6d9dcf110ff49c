"""``posttrain rm train``: fit a Bradley-Terry reward model to a trajectory store's preference pairs.

The store's pairs (successes over failures of the same prompt, :mod:`posttrain.data.pairs`) are
split by task: ``reward_model.eval_fraction`` of the tasks are held out, so the pairwise accuracy
measured on them is on prompts the model never saw. Accuracy is measured before training (the
fresh head's chance level) and after. Checkpoints and ``--resume``: see :mod:`posttrain.rewards.fitting`.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from posttrain.config import ConfigError, RunConfig
from posttrain.data.pairs import PreferencePair, preference_pairs
from posttrain.data.store import DataError, TrajectoryStore
from posttrain.rewards.fitting import Fit, HeadModel, open_fit_run, run_paths, start_fresh
from posttrain.rewards.reward_model import load_reward_model, pair_loss, pairwise_accuracy
from posttrain.train.epochs import examples_digest
from posttrain.train.metrics import MetricsLogger
from posttrain.train.resume import latest_checkpoint

# What `rm train` reads: a resumed run must agree with the first on these (keys, or prefixes ending in ".").
FIELDS = ("seed", "model.name", "reward_model.", "offline.min_reward_gap", "offline.max_pairs_per_task",
          "train.weight_decay", "train.max_grad_norm", "train.threads")


@dataclass
class RewardModelResult:
    output: str
    train_pairs: int
    eval_pairs: int
    accuracy_before: float
    accuracy_after: float
    steps: int
    seconds: float


def split_by_task(pairs: list[PreferencePair], eval_fraction: float, seed: int):
    """(train, held-out) pairs; a task's pairs all go to one side."""
    tasks = sorted({p.task_id for p in pairs})
    random.Random(seed).shuffle(tasks)
    held = set(tasks[: round(len(tasks) * eval_fraction)])
    return [p for p in pairs if p.task_id not in held], [p for p in pairs if p.task_id in held]


def load_pairs(cfg: RunConfig) -> list[PreferencePair]:
    rm = cfg.reward_model
    if not rm.store:
        raise ConfigError("`posttrain rm train` reads a trajectory store: set reward_model.store")
    store = TrajectoryStore(rm.store)
    if not store.files():
        raise DataError(f"trajectory store {rm.store} holds no trajectories (write one with `posttrain collect`)")
    pairs = preference_pairs(store.trajectories(), cfg.offline.min_reward_gap, cfg.offline.max_pairs_per_task)
    if not pairs:
        raise DataError(f"trajectory store {rm.store}: no preference pairs (no task has samples with different "
                        "rewards)")
    return pairs


def train_reward_model(cfg: RunConfig, progress=None, resume: str | Path | None = None,
                       overwrite: bool = False) -> RewardModelResult:
    """Train as ``cfg.reward_model`` says; save the model and ``training.json`` under its output directory.
    ``resume``: the output_dir of a run to continue from its newest checkpoint (see
    :mod:`posttrain.rewards.fitting`); ``overwrite`` replaces a previous run's logs."""
    rm, start = cfg.reward_model, time.time()
    if resume is not None:
        cfg = cfg.model_copy(update={"output_dir": str(resume)})
    output, logs = run_paths(cfg, rm.output, "reward_model")
    train, held = split_by_task(load_pairs(cfg), rm.eval_fraction, cfg.seed)
    if not train:
        raise DataError(f"reward_model.eval_fraction ({rm.eval_fraction}) leaves no training pairs")
    with open_fit_run(cfg, output, logs, FIELDS, overwrite, resume is not None):
        checkpoint = latest_checkpoint(logs) if resume is not None else None
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        torch.manual_seed(cfg.seed)
        model, tokenizer = load_reward_model(rm.model or cfg.model.name)
        if checkpoint is None:
            start_fresh(cfg, output, logs)
        pad = int(tokenizer.pad_token_id)
        rows = [t for p in train + held for t in (p.chosen, p.rejected)]
        fit = Fit(cfg, FIELDS, HeadModel(model, tokenizer), logs, rm.learning_rate, len(train), rm.batch_size,
                  rm.epochs, examples_digest(rows, len(train)), f"reward_model.store ({rm.store})")
        if checkpoint is not None:
            fit.restore(checkpoint)
        else:
            fit.measured["accuracy_before"] = pairwise_accuracy(model, held, pad, rm.max_length)

        def step_loss(batch: list[int]):
            loss, gap = pair_loss(model, [train[i] for i in batch], pad, rm.max_length, rm.center_coefficient)
            return loss, {"accuracy": float((gap > 0).float().mean()), "margin": float(gap.mean())}

        logger = MetricsLogger(logs)
        try:
            fit.run(step_loss, "rm_train", logger, progress)
            after = pairwise_accuracy(model, held, pad, rm.max_length)
            logger.log("rm_eval", fit.step, {"pairwise_accuracy": after})
        finally:
            logger.close()
        fit.head.save(output)
    result = RewardModelResult(str(output), len(train), len(held), fit.measured["accuracy_before"], after, fit.step,
                               time.time() - start)
    (output / "training.json").write_text(json.dumps(asdict(result), indent=2))
    return result
