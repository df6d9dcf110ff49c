"""Offline training data from stored trajectories: preference pairs, successes and failures.

A preference pair is two trajectories of the same task from the same prompt, the chosen one with
the higher reward. With 0/1 rewards this pairs successes with failures; with graded rewards it
ranks by reward. Only the agent's tokens (loss mask 1) are ever scored, so in multi-turn pairs
the environment's observations condition the model but are not compared.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from posttrain.types import Trajectory


@dataclass(frozen=True)
class PreferencePair:
    """Two trajectories of one task and prompt; ``chosen.reward > rejected.reward``."""

    chosen: Trajectory
    rejected: Trajectory

    @property
    def task_id(self) -> str:
        return self.chosen.task.id


def usable(trajectories: list[Trajectory]) -> list[Trajectory]:
    """Trajectories that say something about the policy: no environment error, some sampled tokens."""
    return [t for t in trajectories if t.error is None and t.num_sampled_tokens > 0]


def group_by_prompt(trajectories: list[Trajectory]) -> dict[tuple, list[Trajectory]]:
    """Trajectories keyed by (task id, prompt ids), in input order."""
    groups: dict[tuple, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[(t.task.id, tuple(t.prompt_ids))].append(t)
    return groups


def _pick_pairs(group: list[Trajectory], min_gap: float, limit: int) -> list[PreferencePair]:
    """Pairs of one group: largest reward gap first, then the trajectories used least so far.

    Spreading the picks matters when the limit is below successes x failures: the same success
    paired with every failure would teach one answer many times and the others never.
    """
    candidates = [(i, j) for i, a in enumerate(group) for j, b in enumerate(group) if a.reward > b.reward + min_gap]
    if not limit or limit >= len(candidates):
        chosen = sorted(candidates, key=lambda ij: (-(group[ij[0]].reward - group[ij[1]].reward), ij))
        return [PreferencePair(group[i], group[j]) for i, j in chosen]
    used = [0] * len(group)
    picked: list[PreferencePair] = []
    remaining = set(candidates)
    while remaining and len(picked) < limit:
        i, j = min(remaining, key=lambda ij: (-(group[ij[0]].reward - group[ij[1]].reward),
                                              used[ij[0]] + used[ij[1]], ij))
        remaining.discard((i, j))
        used[i] += 1
        used[j] += 1
        picked.append(PreferencePair(group[i], group[j]))
    return picked


def preference_pairs(
    trajectories: list[Trajectory], min_reward_gap: float = 0.0, max_pairs_per_task: int = 0
) -> list[PreferencePair]:
    """Preference pairs within each (task, prompt) group: chosen reward > rejected reward + gap.

    Trajectories with an environment error are left out: their zero reward is not the agent's.
    ``max_pairs_per_task`` (0: no limit) caps the pairs per group.
    """
    pairs: list[PreferencePair] = []
    for group in group_by_prompt(usable(trajectories)).values():
        pairs += _pick_pairs(group, min_reward_gap, max_pairs_per_task)
    return pairs


def split_by_success(trajectories: list[Trajectory], threshold: float) -> tuple[list[Trajectory], list[Trajectory]]:
    """(successes, failures) of the usable trajectories: reward >= threshold or below."""
    kept = usable(trajectories)
    return [t for t in kept if t.reward >= threshold], [t for t in kept if t.reward < threshold]
