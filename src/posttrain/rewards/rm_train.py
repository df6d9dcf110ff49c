"""``posttrain rm train``: fit a Bradley-Terry reward model to a trajectory store's preference pairs.

The store's pairs (successes over failures of the same prompt, :mod:`posttrain.data.pairs`) are
split by task: ``reward_model.eval_fraction`` of the tasks are held out, so the pairwise accuracy
measured on them is on prompts the model never saw. Accuracy is measured before training (the
fresh head's chance level) and after.
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
from posttrain.rewards.reward_model import load_reward_model, pair_loss, pairwise_accuracy
from posttrain.train.epochs import epoch_batches
from posttrain.train.metrics import MetricsLogger
from posttrain.train.optimizer import adamw
from posttrain.train.stopping import RunGuard


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


def train_reward_model(cfg: RunConfig, progress=None) -> RewardModelResult:
    """Train as ``cfg.reward_model`` says; save the model and ``training.json`` under its output directory."""
    rm, start = cfg.reward_model, time.time()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    torch.manual_seed(cfg.seed)
    train, held = split_by_task(load_pairs(cfg), rm.eval_fraction, cfg.seed)
    if not train:
        raise DataError(f"reward_model.eval_fraction ({rm.eval_fraction}) leaves no training pairs")
    model, tokenizer = load_reward_model(rm.model or cfg.model.name)
    pad = int(tokenizer.pad_token_id)
    output = Path(rm.output or Path(cfg.output_dir) / "reward_model")
    logger = MetricsLogger(output.parent / f"{output.name}-logs")
    before = pairwise_accuracy(model, held, pad, rm.max_length)
    optimizer = adamw(list(model.parameters()), rm.learning_rate, cfg.train.weight_decay)
    rng, step = random.Random(cfg.seed), 0
    total = rm.epochs * -(-len(train) // rm.batch_size)

    def save() -> Path:
        model.save_pretrained(output)
        tokenizer.save_pretrained(output)
        return output

    # A signal or a failing disk stops training after the step in flight, the model saved first.
    with RunGuard(save, lambda: step) as guard:
        try:
            for epoch, batch in epoch_batches(len(train), rm.batch_size, rm.epochs, rng):
                guard.check()
                model.train()
                optimizer.zero_grad(set_to_none=True)
                loss, gap = pair_loss(model, [train[i] for i in batch], pad, rm.max_length, rm.center_coefficient)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
                optimizer.step()
                step += 1
                metrics = {"loss": loss.item(), "accuracy": float((gap > 0).float().mean()),
                           "margin": float(gap.mean()), "grad_norm": float(grad_norm), "epoch": float(epoch + 1)}
                logger.log("rm_train", step, metrics)
                if progress:
                    progress("train", step, total, metrics)
            guard.check()
            after = pairwise_accuracy(model, held, pad, rm.max_length)
            logger.log("rm_eval", step, {"pairwise_accuracy": after})
        finally:
            logger.close()
    save()
    result = RewardModelResult(str(output), len(train), len(held), before, after, step, time.time() - start)
    (output / "training.json").write_text(json.dumps(asdict(result), indent=2))
    return result
