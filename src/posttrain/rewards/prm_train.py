"""``posttrain prm train``: label sampled solutions step by step, fit a process reward model, measure it.

1. Sample ``prm.solutions`` solutions to each of ``prm.tasks`` training tasks with the policy.
2. Label each step (see :mod:`posttrain.rewards.prm`): Math-Shepherd's Monte Carlo estimate from
   ``prm.rollouts`` continuations of the step's prefix, or the environment's own step marks.
3. Train the PRM with binary cross-entropy at the step ends.
4. On fresh solutions to ``prm.eval_tasks`` held-out tasks, measure how well the PRM ranks steps
   that are right (the environment's ``info["step_correct"]`` marks) above steps that are wrong:
   the ROC AUC, the probability that a random right step scores above a random wrong one.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from posttrain.config import ConfigError, RunConfig
from posttrain.envs import make_env
from posttrain.models import Policy
from posttrain.rewards.prm import load_prm, prm_loss, step_ends, step_logits
from posttrain.rollout import EnvPool, HFBackend, SamplingParams, run_episodes
from posttrain.train.epochs import epoch_batches
from posttrain.train.metrics import MetricsLogger
from posttrain.train.optimizer import adamw
from posttrain.train.stopping import RunGuard
from posttrain.types import Trajectory


@dataclass
class LabelledSolution:
    """One sampled solution, its step ends, and per step: the training label, the Monte Carlo share, the truth."""

    trajectory: Trajectory
    ends: list[int]
    labels: list[float]
    mc: list[float]
    truth: list[bool] | None


@dataclass
class PRMResult:
    output: str
    train_solutions: int
    train_steps: int
    train_success: float
    eval_steps: int
    label_auc: float
    auc_before: float
    auc_after: float
    seconds: float
    label_seconds: float


def roc_auc(scores: list[float], positive: list[bool]) -> float:
    """P(score of a random positive > score of a random negative), ties counting one half (Mann-Whitney U)."""
    pos = [s for s, p in zip(scores, positive) if p]
    neg = [s for s, p in zip(scores, positive) if not p]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def _succeeds(env, task, text: str) -> bool:
    try:
        env.reset(options={"task": task})
        _, reward, _, _, info = env.step(text)
    except Exception:  # noqa: BLE001 - an environment failing on a continuation counts as no success
        return False
    return bool(info.get("correct", reward > 0))


def monte_carlo_shares(env, backend, tokenizer, solutions: list[Trajectory], ends: list[list[int]], rollouts: int,
                       params: SamplingParams) -> list[list[float]]:
    """Math-Shepherd's estimate per step: the share of ``rollouts`` continuations of its prefix that succeed.

    The last step's value is the solution's own outcome (nothing is left to continue).
    """
    prefixes = [(b, k) for b, e in enumerate(ends) for k in range(len(e) - 1)]
    prompts = [solutions[b].prompt_ids + solutions[b].completion_ids[: ends[b][k] + 1] for b, k in prefixes]
    generations = backend.generate(prompts, params, rollouts) if prompts else []
    shares = [[0.0] * (len(e) - 1) + [float(solutions[b].correct)] for b, e in enumerate(ends)]
    for j, (b, k) in enumerate(prefixes):
        head = solutions[b].completion_ids[: ends[b][k] + 1]
        wins = sum(_succeeds(env, solutions[b].task, tokenizer.decode(head + g.token_ids, skip_special_tokens=True))
                   for g in generations[j * rollouts : (j + 1) * rollouts])
        shares[b][k] = wins / rollouts
    return shares


def _truth(trajectory: Trajectory, n: int) -> list[bool] | None:
    marks = trajectory.steps[-1].info.get("step_correct") if trajectory.steps else None
    return [bool(m) for m in marks] if isinstance(marks, list) and len(marks) == n else None


def label_solutions(cfg: RunConfig, envs: EnvPool, backend, tokenizer, tasks,
                    monte_carlo: bool) -> list[LabelledSolution]:
    """Sample ``prm.solutions`` per task and label every step as ``prm.labels`` and ``prm.label_type`` say."""
    p, r = cfg.prm, cfg.rollout
    params = SamplingParams(temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens,
                            stop=tuple(r.stop))
    solutions = [t for t in run_episodes(envs, backend, tokenizer, tasks, params, p.solutions, 1, r.max_context_tokens,
                                         cfg.env.step_timeout) if t.error is None and t.num_sampled_tokens]
    ends = [step_ends(tokenizer, t.completion_ids, t.loss_mask, p.step_delimiter) for t in solutions]
    keep = [b for b, e in enumerate(ends) if e]
    solutions, ends = [solutions[b] for b in keep], [ends[b] for b in keep]
    truth = [_truth(t, len(e)) for t, e in zip(solutions, ends)]
    if monte_carlo:
        mc = monte_carlo_shares(envs.take(1)[0], backend, tokenizer, solutions, ends, p.rollouts, params)
    else:
        mc = [[float(m) for m in t] if t is not None else [] for t in truth]
    out = []
    for sol, e, m, t in zip(solutions, ends, mc, truth):
        if len(m) != len(e):
            continue  # env labels asked for, but the environment gave no marks for this solution
        labels = m if p.label_type == "soft" else [float(x > 0) for x in m]
        out.append(LabelledSolution(sol, e, labels, m, t))
    return out


def _logits(model, pad: int, batch: list[LabelledSolution]) -> list[torch.Tensor]:
    rows = [s.trajectory.prompt_ids + s.trajectory.completion_ids for s in batch]
    positions = [[len(s.trajectory.prompt_ids) + e for e in s.ends] for s in batch]
    return step_logits(model, rows, positions, pad)


@torch.no_grad()
def step_auc(model, pad: int, solutions: list[LabelledSolution], batch: int = 8) -> tuple[float, int]:
    """(ROC AUC of the PRM's step scores against the environment's step marks, steps scored)."""
    model.eval()
    marked = [s for s in solutions if s.truth is not None]
    scores: list[float] = []
    for i in range(0, len(marked), batch):
        scores += torch.cat(_logits(model, pad, marked[i : i + batch])).tolist()
    truth = [m for s in marked for m in s.truth]
    return roc_auc(scores, truth), len(truth)


def train_prm(cfg: RunConfig, progress=None) -> PRMResult:
    """Label, train and measure as ``cfg.prm`` says; save the PRM and ``training.json`` under its output."""
    p, start = cfg.prm, time.time()
    if cfg.rollout.max_turns != 1:
        raise ConfigError("`posttrain prm train` labels single-turn solutions: set rollout.max_turns=1")
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    envs = EnvPool(lambda: make_env(cfg.env.id, cfg.env.kwargs))
    policy = Policy.load(cfg.model)
    backend = HFBackend(policy.model, policy.tokenizer, cfg.rollout.batch_size, cfg.seed, cfg.model.pack_weights)
    train_tasks = random.Random(cfg.seed).sample(envs.tasks("train"), min(p.tasks, len(envs.tasks("train"))))
    train = label_solutions(cfg, envs, backend, policy.tokenizer, train_tasks, monte_carlo=p.labels == "mc")
    held = label_solutions(cfg, envs, backend, policy.tokenizer, envs.tasks("eval")[: p.eval_tasks], monte_carlo=False)
    label_seconds = time.time() - start
    if not train:
        raise ConfigError(f"env {cfg.env.id!r}: no labelled steps (prm.labels={p.labels} needs solutions with steps"
                          + (" and info['step_correct'] marks)" if p.labels == "env" else ")"))
    del policy, backend  # the PRM is a separate network; free the sampler's memory before training it
    model, tokenizer = load_prm(p.model or cfg.model.name)
    pad = int(tokenizer.pad_token_id)
    output = Path(p.output or Path(cfg.output_dir) / "prm")
    logger = MetricsLogger(output.parent / f"{output.name}-logs")
    auc_before, eval_steps = step_auc(model, pad, held)
    optimizer = adamw(list(model.parameters()), p.learning_rate, cfg.train.weight_decay)
    rng, step, total = random.Random(cfg.seed), 0, p.epochs * -(-len(train) // p.batch_size)

    def save() -> Path:
        model.save_pretrained(output)
        tokenizer.save_pretrained(output)
        return output

    # A signal or a failing disk stops training after the step in flight, the model saved first.
    with RunGuard(save, lambda: step) as guard:
        try:
            for epoch, indices in epoch_batches(len(train), p.batch_size, p.epochs, rng):
                guard.check()
                model.train()
                batch = [train[i] for i in indices]
                optimizer.zero_grad(set_to_none=True)
                loss = prm_loss(_logits(model, pad, batch), [x.labels for x in batch])
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
                optimizer.step()
                step += 1
                metrics = {"loss": loss.item(), "grad_norm": float(grad_norm), "epoch": float(epoch + 1)}
                logger.log("prm_train", step, metrics)
                if progress:
                    progress("train", step, total, metrics)
            guard.check()
            auc_after, _ = step_auc(model, pad, held)
            logger.log("prm_eval", step, {"step_auc": auc_after})
        finally:
            logger.close()
    save()
    marked = [x for x in train if x.truth is not None]
    result = PRMResult(
        output=str(output), train_solutions=len(train), train_steps=sum(len(x.ends) for x in train),
        train_success=sum(x.trajectory.correct for x in train) / len(train), eval_steps=eval_steps,
        label_auc=roc_auc([m for x in marked for m in x.mc], [t for x in marked for t in x.truth]),
        auc_before=auc_before, auc_after=auc_after, seconds=time.time() - start, label_seconds=label_seconds)
    (output / "training.json").write_text(json.dumps(asdict(result), indent=2))
    return result
