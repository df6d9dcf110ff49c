"""Reward composition: the configured components' weighted sum, each logged, failures contained.

``reward.components`` names reward functions with weights; the reward of a trajectory is
sum_c w_c * s_c(trajectory) plus its step scores (``reward.step_scorers``, added turn by turn so
that per-turn credit sees them). A component is either a function of one trajectory (the
built-ins of :mod:`posttrain.rewards.components`, or a user's 'package.module:function') or a
model that scores a whole batch (reward model, process reward model, judges). Rewards come from
untrusted model output, so a component that raises, or returns something that is not a finite
number, scores 0 for that trajectory, is counted in ``reward/<name>_errors`` and training goes
on. Trajectories whose environment failed get reward 0 and are not scored.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from typing import Any, Protocol

from posttrain.config import ConfigError, RewardSection
from posttrain.rewards.components import COMPONENTS, STEP_SCORERS
from posttrain.types import Rewards, Task, Trajectory


class BatchScorer(Protocol):
    """A reward model or judge: one score per trajectory, the batch grouped by task (``group_size`` each)."""

    def score(self, trajectories: list[Trajectory], group_size: int) -> list[float]: ...


class DenseScorer(Protocol):
    """A dense process reward: ``(completion token index, reward)`` pairs per trajectory."""

    def dense(self, trajectories: list[Trajectory]) -> list[list[tuple[int, float]]]: ...


# Components that load a model, imported on use (they pull in transformers' model classes).
MODEL_COMPONENTS = {
    "reward_model": "posttrain.rewards.reward_model:RewardModelScorer",
    "prm": "posttrain.rewards.prm:ProcessRewardScorer",
    "implicit_prm": "posttrain.rewards.implicit_prm:ImplicitPRMScorer",
    "judge": "posttrain.rewards.judge:Judge",
    "group_judge": "posttrain.rewards.judge:GroupJudge",
}


def import_function(path: str, what: str) -> Callable[..., Any]:
    """The callable named 'package.module:function'; a ConfigError naming ``what`` if it is not one."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{what} {path!r}: expected a built-in name or 'package.module:function'")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{what} {path!r}: cannot import it ({e})") from None
    if not callable(fn):
        raise ConfigError(f"{what} {path!r} is not callable")
    return fn


def check_arguments(fn: Callable[..., Any], leading: int, kwargs: dict[str, Any], what: str) -> None:
    """ConfigError naming ``what`` unless ``fn`` takes ``leading`` positional arguments and ``kwargs``: a misspelled
    kwarg would otherwise fail every call, each counted as an error, and the run would train on zeros."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (some builtins): the calls will tell
        return
    try:
        signature.bind(*[None] * leading, **kwargs)
    except TypeError as e:
        takes = list(signature.parameters)[leading:]
        raise ConfigError(f"{what}: {e} (its kwargs: {', '.join(takes) or 'none'})") from None


def _finite(value: Any) -> float:
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"score {value!r} is not finite")
    return out


class _Component:
    """One configured component: a per-trajectory function, or a batch scorer."""

    def __init__(self, name: str, weight: float, kwargs: dict[str, Any]):
        self.name, self.weight = name, weight
        self.function: Callable[..., float] | None = None
        self.model: Any = None
        if name in COMPONENTS:
            self.function = COMPONENTS[name]
        elif name in MODEL_COMPONENTS:
            try:
                self.model = import_function(MODEL_COMPONENTS[name], "reward component")(**kwargs)
            except TypeError as e:
                raise ConfigError(f"reward component {name!r}: {e}") from None
        else:
            self.function = import_function(name, "reward component")
        self.kwargs = kwargs if self.function is not None else {}
        if self.function is not None:
            check_arguments(self.function, 1, kwargs, f"reward component {name!r}")
        if name in COMPONENTS:
            # A built-in is ours to try once: a kwarg it rejects (a pattern that does not compile, max_tokens not
            # above free_tokens) fails here, not as an error count on every trajectory of the run.
            try:
                self.function(Trajectory(Task("check", ""), [], [], [], []), **kwargs)
            except Exception as e:  # noqa: BLE001 - whatever the kwarg makes it raise
                raise ConfigError(f"reward component {name!r}: kwargs {kwargs} do not work: {e}") from None

    @property
    def dense(self) -> bool:
        return bool(getattr(self.model, "is_dense", False))

    def scores(self, trajectories: list[Trajectory], group_size: int) -> tuple[list[float], int]:
        """(score per trajectory, errors); a failing trajectory (or a failing batch call) scores 0."""
        if self.model is not None:
            try:
                out = [_finite(s) for s in self.model.score(trajectories, group_size)]
                if len(out) != len(trajectories):
                    raise ValueError(f"{len(out)} scores for {len(trajectories)} trajectories")
                return out, 0
            except Exception:  # noqa: BLE001 - untrusted output: count it, score 0, train on
                return [0.0] * len(trajectories), len(trajectories)
        out, errors = [], 0
        for t in trajectories:
            try:
                out.append(_finite(self.function(t, **self.kwargs)))
            except Exception:  # noqa: BLE001
                out.append(0.0)
                errors += 1
        return out, errors

    def dense_rewards(self, trajectories: list[Trajectory]) -> tuple[list[list[tuple[int, float]]], int]:
        """(``(token index, reward)`` pairs per trajectory, errors); a failing batch gets no dense rewards."""
        try:
            out = [[(int(i), _finite(r)) for i, r in pairs] for pairs in self.model.dense(trajectories)]
            if len(out) != len(trajectories):
                raise ValueError(f"dense rewards for {len(out)} of {len(trajectories)} trajectories")
            return out, 0
        except Exception:  # noqa: BLE001
            return [[] for _ in trajectories], len(trajectories)


class RewardComposer:
    """Turns trajectories into :class:`~posttrain.types.Rewards` as ``reward`` configures."""

    def __init__(self, cfg: RewardSection):
        if not cfg.components:
            raise ConfigError("reward.components is empty: name at least one reward (e.g. correctness)")
        names = [c.name for c in cfg.components]
        if len(set(names)) != len(names):
            raise ConfigError(f"reward.components names a component twice: {names} (each is logged by its name)")
        self.components = [_Component(c.name, c.weight, dict(c.kwargs)) for c in cfg.components]
        self.scorers = [(s.name, s.weight, STEP_SCORERS.get(s.name) or import_function(s.name, "step scorer"),
                         dict(s.kwargs)) for s in cfg.step_scorers]
        for name, _, fn, kwargs in self.scorers:
            check_arguments(fn, 3, kwargs, f"step scorer {name!r}")
        self.correctness_weight = sum(c.weight for c in self.components if c.name == "correctness")

    def __call__(self, trajectories: list[Trajectory], group_size: int = 1) -> Rewards:
        n = len(trajectories)
        ok = [t.error is None for t in trajectories]
        metrics: dict[str, float] = {}
        outcome = [0.0] * n
        dense: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        for c in self.components:
            if c.dense:
                pairs, errors = c.dense_rewards(trajectories)
                dense = [sorted(d + [(i, c.weight * r) for i, r in p]) if good else []
                         for d, p, good in zip(dense, pairs, ok)]
                scores = [sum(r for _, r in p) / len(p) if p else 0.0 for p in pairs]
            else:
                scores, errors = c.scores(trajectories, group_size)
                if c.name != "correctness":  # the environment's return enters turn by turn, below
                    outcome = [o + c.weight * s * good for o, s, good in zip(outcome, scores, ok)]
            scored = [s for s, good in zip(scores, ok) if good]
            metrics[f"reward/{c.name}"] = sum(scored) / len(scored) if scored else 0.0
            metrics[f"reward/{c.name}_errors"] = float(errors)
            # A model component may say more about its last call (a judge: replies it could not read).
            for key, value in getattr(c.model, "last_metrics", {}).items():
                metrics[f"reward/{c.name}/{key}"] = float(value)
        step_rewards = []
        for t, good, extra in zip(trajectories, ok, outcome):
            steps = self._step_rewards(t, metrics) if good else [0.0] * len(t.steps)
            if steps:
                steps[-1] += extra
            step_rewards.append(steps)
        total = [sum(steps) if steps else extra for steps, extra in zip(step_rewards, outcome)]
        metrics["reward/total"] = sum(total) / n if n else 0.0
        for name, *_ in self.scorers:  # accumulated as sums over turns; reported per turn
            turns = metrics.pop(f"_turns/{name}", 0.0)
            metrics[f"reward/step/{name}"] = metrics.get(f"reward/step/{name}", 0.0) / turns if turns else 0.0
            metrics.setdefault(f"reward/step/{name}_errors", 0.0)
        return Rewards(total=total, step_rewards=step_rewards, dense=dense, metrics=metrics)

    def state_dict(self) -> dict[str, Any]:
        """The state of components that learn during the run (PRIME's implicit PRM), by name."""
        return {c.name: c.model.state_dict() for c in self.components if hasattr(c.model, "state_dict")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for c in self.components:
            if c.name in state:
                c.model.load_state_dict(state[c.name])

    def _step_rewards(self, trajectory: Trajectory, metrics: dict[str, float]) -> list[float]:
        """Per turn: the environment's step reward x the correctness weight, plus every step scorer's value."""
        out = [self.correctness_weight * s.reward for s in trajectory.steps]
        for name, weight, fn, kwargs in self.scorers:
            for k, step in enumerate(trajectory.steps):
                try:
                    value = _finite(fn(trajectory, k, step, **kwargs))
                except Exception:  # noqa: BLE001 - a scorer failing on untrusted output scores 0
                    value = 0.0
                    metrics[f"reward/step/{name}_errors"] = metrics.get(f"reward/step/{name}_errors", 0.0) + 1
                out[k] += weight * value
                metrics[f"reward/step/{name}"] = metrics.get(f"reward/step/{name}", 0.0) + value
                metrics[f"_turns/{name}"] = metrics.get(f"_turns/{name}", 0.0) + 1
        return out
