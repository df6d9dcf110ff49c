"""Preference pairs from stored trajectories, and sequence log-probabilities over the agent's tokens only."""

import torch

from posttrain.config import ModelSection
from posttrain.data.pairs import preference_pairs, split_by_success
from posttrain.models import Policy
from posttrain.train.offline import mismatched, sequence_logps
from posttrain.types import Task, Trajectory


def traj(task: str, reward: float, tokens: list[int], prompt=(1, 2, 3), mask=None, error=None) -> Trajectory:
    return Trajectory(task=Task(task, "p"), prompt_ids=list(prompt), completion_ids=tokens,
                      loss_mask=mask or [1] * len(tokens), behaviour_logprobs=[0.0] * len(tokens), reward=reward,
                      error=error)


def test_successes_pair_with_failures_of_the_same_task_only():
    data = [traj("a", 1.0, [5]), traj("a", 0.0, [6]), traj("a", 0.0, [7]), traj("a", 1.0, [8]),
            traj("b", 1.0, [9]), traj("b", 1.0, [10]),  # all successes: no pair
            traj("c", 0.0, [11]), traj("c", 1.0, [12]),
            traj("c", 0.0, [13], error="step: TimeoutError")]  # an env failure is not the agent's
    pairs = preference_pairs(data)
    assert len(pairs) == 2 * 2 + 1
    for p in pairs:
        assert p.chosen.task.id == p.rejected.task.id and p.chosen.reward == 1.0 and p.rejected.reward == 0.0
        assert p.rejected.error is None
    assert {(p.chosen.completion_ids[0], p.rejected.completion_ids[0]) for p in pairs if p.task_id == "a"} == {
        (5, 6), (5, 7), (8, 6), (8, 7)}


def test_different_prompts_of_one_task_are_not_paired():
    data = [traj("a", 1.0, [5], prompt=(1, 2)), traj("a", 0.0, [6], prompt=(1, 3))]
    assert preference_pairs(data) == []


def test_graded_rewards_rank_largest_gap_first_with_a_threshold():
    data = [traj("a", 0.9, [1]), traj("a", 0.5, [2]), traj("a", 0.1, [3]), traj("a", 0.45, [4])]
    pairs = preference_pairs(data, min_reward_gap=0.1)
    gaps = [round(p.chosen.reward - p.rejected.reward, 3) for p in pairs]
    assert gaps == sorted(gaps, reverse=True) and gaps[0] == 0.8
    assert (0.5, 0.45) not in {(p.chosen.reward, p.rejected.reward) for p in pairs}  # gap 0.05 < 0.1
    assert len(pairs) == 5


def test_pair_limit_spreads_the_trajectories_used():
    data = [traj("a", 1.0, [s]) for s in (1, 2)] + [traj("a", 0.0, [f]) for f in (3, 4, 5, 6)]
    pairs = preference_pairs(data, max_pairs_per_task=4)
    assert len(pairs) == 4
    assert sorted(p.rejected.completion_ids[0] for p in pairs) == [3, 4, 5, 6]  # every failure once
    assert sorted(p.chosen.completion_ids[0] for p in pairs) == [1, 1, 2, 2]


def test_split_by_success_uses_the_threshold_and_drops_errors():
    data = [traj("a", 1.0, [1]), traj("a", 0.4, [2]), traj("a", 0.6, [3]), traj("a", 0.0, [4], error="x"),
            traj("a", 1.0, [], mask=[])]  # nothing sampled: nothing to learn from
    good, bad = split_by_success(data, 0.5)
    assert [t.completion_ids for t in good] == [[1], [3]] and [t.completion_ids for t in bad] == [[2]]


def test_sequence_logprobs_score_only_the_agent_tokens_of_a_multi_turn_pair(tiny_model, tokenizer):
    policy = Policy(tiny_model, tokenizer, ModelSection(name="tiny-random"))
    prompt = [1, 9707, 28, 2]
    # agent turn, environment observation (mask 0), agent turn
    chosen = traj("g", 1.0, [33, 34, 2, 198, 70, 71, 72, 35, 2], prompt=prompt, mask=[1, 1, 1, 0, 0, 0, 0, 1, 1])
    rejected = traj("g", 0.0, [40, 2, 198, 80, 81, 41, 42, 2], prompt=prompt, mask=[1, 1, 0, 0, 0, 1, 1, 1])
    got = sequence_logps(policy, [chosen, rejected])

    for i, t in enumerate([chosen, rejected]):
        ids = torch.tensor([t.prompt_ids + t.completion_ids])
        with torch.no_grad():
            logp = torch.log_softmax(tiny_model(input_ids=ids).logits[0, :-1].float(), -1)
        per_token = logp.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)[len(prompt) - 1 :]
        mask = torch.tensor(t.loss_mask, dtype=torch.bool)
        assert torch.allclose(got.logps[i], per_token[mask].sum(), atol=1e-4)
        assert not torch.allclose(got.logps[i], per_token.sum(), atol=1e-2)  # observations are not scored
        assert got.tokens[i] == mask.sum()


def test_kto_mismatched_pairs_keep_each_prompt_and_take_another_completion():
    data = [traj(f"t{i}", float(i % 2), [10 + i], prompt=(i,)) for i in range(6)]
    out = mismatched(data, seed=0)
    assert [t.prompt_ids for t in out] == [t.prompt_ids for t in data]
    completions = [t.completion_ids[0] for t in out]
    assert sorted(completions) == [10 + i for i in range(6)]
    assert all(c != 10 + i for i, c in enumerate(completions))
