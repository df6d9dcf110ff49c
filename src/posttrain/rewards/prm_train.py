"""``posttrain prm train``: label sampled solutions step by step, fit a process reward model, measure it.

1. Sample ``prm.solutions`` solutions to each of ``prm.tasks`` training tasks with the policy.
2. Label each step (see :mod:`posttrain.rewards.prm`): Math-Shepherd's Monte Carlo estimate from
   ``prm.rollouts`` continuations of the step's prefix, or the environment's own step marks.
3. Train the PRM with binary cross-entropy at the step ends.
4. On fresh solutions to ``prm.eval_tasks`` held-out tasks, measure how well the PRM ranks steps
   that are right (the environment's ``info["step_correct"]`` marks) above steps that are wrong:
   the ROC AUC, the probability that a random right step scores above a random wrong one.

Solutions are sampled and labelled in chunks of tasks, each saved to ``<output>-logs/labels.pt``
with the generators the next chunk draws from; a signal stops after the chunk in flight, and
``--resume`` continues the labelling, then the training (checkpoints: :mod:`posttrain.rewards.fitting`),
as the uninterrupted run would have gone on.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from posttrain.config import ConfigError, RunConfig
from posttrain.data.store import fsync_dir, row_trajectory, trajectory_row
from posttrain.envs import make_env
from posttrain.models import Policy
from posttrain.rewards.fitting import Fit, HeadModel, open_fit_run, run_paths, start_fresh
from posttrain.rewards.prm import load_prm, prm_loss, step_ends, step_logits
from posttrain.rollout import EnvPool, HFBackend, SamplingParams, run_episodes
from posttrain.train.epochs import examples_digest
from posttrain.train.metrics import MetricsLogger
from posttrain.train.resume import latest_checkpoint, load_state_file, restoring
from posttrain.train.stopping import RunGuard
from posttrain.types import Trajectory

# Tasks sampled and labelled between two saves of the labels: a signal waits for one chunk at most.
LABEL_CHUNK = 8
# What `prm train` reads: a resumed run must agree with the first on these (keys, or prefixes ending in ".").
FIELDS = ("seed", "model.", "env.", "rollout.", "prm.", "train.weight_decay", "train.max_grad_norm", "train.threads")


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


def _solution_state(s: LabelledSolution) -> dict:
    return {"trajectory": trajectory_row(s.trajectory, "prm", 0), "ends": s.ends, "labels": s.labels, "mc": s.mc,
            "truth": s.truth}


def _solution(state: dict) -> LabelledSolution:
    trajectory = row_trajectory(state["trajectory"])
    trajectory.metadata = json.loads(state["trajectory"]["metadata"])  # as sampled, without the store's run keys
    return LabelledSolution(trajectory, list(state["ends"]), list(state["labels"]), list(state["mc"]),
                            None if state["truth"] is None else list(state["truth"]))


@dataclass
class Labelling:
    """The solutions sampled and labelled so far: the training tasks' (labelled as ``prm.labels`` says), then the
    held-out tasks' (marked by the environment), and the time it took."""

    train: list[LabelledSolution]
    held: list[LabelledSolution]
    tasks_done: int = 0
    seconds: float = 0.0


def save_labelling(path: Path, labelling: Labelling, rng: dict) -> None:
    """``labels.pt``, replaced atomically: the labelling so far and the generators the next chunk draws from."""
    state = {"train": [_solution_state(s) for s in labelling.train],
             "held": [_solution_state(s) for s in labelling.held], "tasks_done": labelling.tasks_done,
             "seconds": labelling.seconds, "rng": rng}
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def load_labelling(path: Path) -> tuple[Labelling, dict]:
    state = load_state_file(path, ("train", "held", "tasks_done", "seconds", "rng"), "labelling")
    with restoring(path.parent, path.name):
        labelling = Labelling([_solution(x) for x in state["train"]], [_solution(x) for x in state["held"]],
                              int(state["tasks_done"]), float(state["seconds"]))
    return labelling, state["rng"]


def label_all(cfg: RunConfig, labels: Path, resumed: bool, started: Callable[[], None], progress=None) -> Labelling:
    """Sample and label the solutions of ``prm.tasks`` training tasks, then of ``prm.eval_tasks`` held-out tasks,
    in chunks of :data:`LABEL_CHUNK` tasks, saving ``labels`` after each; a resumed run continues after the last
    chunk saved, from the generators it saved, so its labels are the ones an uninterrupted run draws. A signal
    stops after the chunk in flight. ``started()`` is called once the policy has loaded, in a fresh run."""
    p = cfg.prm
    labelling, rng = load_labelling(labels) if resumed and labels.is_file() else (Labelling([], []), None)
    envs = EnvPool(lambda: make_env(cfg.env.id, cfg.env.kwargs), seed=cfg.seed)
    train_tasks = random.Random(cfg.seed).sample(envs.tasks("train"), min(p.tasks, len(envs.tasks("train"))))
    held_tasks = envs.tasks("eval")[: p.eval_tasks]
    chunks = [(train_tasks[i : i + LABEL_CHUNK], True) for i in range(0, len(train_tasks), LABEL_CHUNK)]
    chunks += [(held_tasks[i : i + LABEL_CHUNK], False) for i in range(0, len(held_tasks), LABEL_CHUNK)]
    total = len(train_tasks) + len(held_tasks)
    if labelling.tasks_done >= total:
        return labelling
    policy = Policy.load(cfg.model)
    backend = HFBackend(policy.model, policy.tokenizer, cfg.rollout.batch_size, cfg.seed, cfg.model.pack_weights)
    if not resumed:
        started()
    if rng is not None:
        with restoring(labels.parent, labels.name):
            random.setstate(rng["python"])
            torch.set_rng_state(rng["torch"])
            backend.generator.set_state(rng["backend"])
            envs.load_rng_states(rng["envs"])
    with RunGuard(lambda: labels, lambda: labelling.tasks_done, f"labelling {{}} of {total} tasks".format,
                  "labels") as guard:
        done = 0
        for tasks, training in chunks:
            done += len(tasks)
            if done <= labelling.tasks_done:
                continue
            guard.check()
            t0 = time.time()
            out = label_solutions(cfg, envs, backend, policy.tokenizer, tasks, training and p.labels == "mc")
            after = Labelling(labelling.train + out if training else labelling.train,
                              labelling.held if training else labelling.held + out,
                              done, labelling.seconds + time.time() - t0)
            save_labelling(labels, after, {"python": random.getstate(), "torch": torch.get_rng_state(),
                                           "backend": backend.generator.get_state(), "envs": envs.rng_states()})
            labelling = after
            if progress:
                progress("label", done, total, {})
        guard.check()
    return labelling


def train_prm(cfg: RunConfig, progress=None, resume: str | Path | None = None, overwrite: bool = False) -> PRMResult:
    """Label, train and measure as ``cfg.prm`` says; save the PRM and ``training.json`` under its output.
    ``resume``: the output_dir of a run to continue, from its saved labels and newest checkpoint (see
    :mod:`posttrain.rewards.fitting`); ``overwrite`` replaces a previous run's logs."""
    p, start = cfg.prm, time.time()
    if cfg.rollout.max_turns != 1:
        raise ConfigError("`posttrain prm train` labels single-turn solutions: set rollout.max_turns=1")
    if resume is not None:
        cfg = cfg.model_copy(update={"output_dir": str(resume)})
    output, logs = run_paths(cfg, p.output, "prm")
    with open_fit_run(cfg, output, logs, FIELDS, overwrite, resume is not None):
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        labelling = label_all(cfg, logs / "labels.pt", resume is not None, lambda: start_fresh(cfg, output, logs),
                              progress)
        train, held = labelling.train, labelling.held
        if not train:
            raise ConfigError(f"env {cfg.env.id!r}: no labelled steps (prm.labels={p.labels} needs solutions with "
                              "steps" + (" and info['step_correct'] marks)" if p.labels == "env" else ")"))
        torch.manual_seed(cfg.seed)  # the head's initial weights, whatever the sampling drew
        model, tokenizer = load_prm(p.model or cfg.model.name)
        pad = int(tokenizer.pad_token_id)
        fit = Fit(cfg, FIELDS, HeadModel(model, tokenizer), logs, p.learning_rate, len(train), p.batch_size, p.epochs,
                  examples_digest([s.trajectory for s in train + held], [[s.labels for s in train], len(train)]),
                  str(logs / "labels.pt"))
        checkpoint = latest_checkpoint(logs, required=False) if resume is not None else None
        if checkpoint is not None:
            fit.restore(checkpoint)
        else:
            fit.measured["auc_before"] = step_auc(model, pad, held)[0]

        def step_loss(indices: list[int]):
            batch = [train[i] for i in indices]
            return prm_loss(_logits(model, pad, batch), [x.labels for x in batch]), {}

        logger = MetricsLogger(logs)
        try:
            fit.run(step_loss, "prm_train", logger, progress)
            auc_after, eval_steps = step_auc(model, pad, held)
            logger.log("prm_eval", fit.step, {"step_auc": auc_after})
        finally:
            logger.close()
        fit.head.save(output)
    marked = [x for x in train if x.truth is not None]
    result = PRMResult(
        output=str(output), train_solutions=len(train), train_steps=sum(len(x.ends) for x in train),
        train_success=sum(x.trajectory.correct for x in train) / len(train), eval_steps=eval_steps,
        label_auc=roc_auc([m for x in marked for m in x.mc], [t for x in marked for t in x.truth]),
        auc_before=fit.measured["auc_before"], auc_after=auc_after, seconds=time.time() - start,
        label_seconds=labelling.seconds)
    (output / "training.json").write_text(json.dumps(asdict(result), indent=2))
    return result
