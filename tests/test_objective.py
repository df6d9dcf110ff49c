"""How each algorithm turns rewards into advantages (posttrain.algorithms.Algorithm)."""

import pytest
import torch

from posttrain.algorithms import Algorithm
from posttrain.config import AlgorithmSection


def token_advantages(cfg, rewards, mask, beta=0.0, **tensors):
    algo = Algorithm(cfg.model_copy(update={"beta": beta}), max_new_tokens=16)
    return algo.advantages(rewards, mask, **tensors)


def shaped_rewards(cfg, rewards, lengths, max_new_tokens, algo=None):
    return (algo or Algorithm(cfg, max_new_tokens=max_new_tokens)).shaped_rewards(rewards, lengths)


MASK = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]])


def test_group_estimators_spread_one_advantage_over_sampled_tokens():
    rewards = torch.tensor([1.0, 0.0])
    adv, returns = token_advantages(AlgorithmSection(name="dr_grpo", group_size=2), rewards, MASK)
    assert returns is None
    assert torch.equal(adv, torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.0, -0.5, -0.5, -0.5]]))
    adv, _ = token_advantages(AlgorithmSection(name="rloo", group_size=2), rewards, MASK)
    assert torch.equal(adv, torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, -1.0, -1.0, -1.0]]))


def test_ppo_runs_gae_against_the_critic():
    cfg = AlgorithmSection(name="ppo", group_size=2, whiten_advantages=False, lam=1.0, gamma=1.0)
    values = torch.tensor([[0.0, 0.25, 0.5, 0.0], [0.0, 0.5, 0.5, 0.5]])
    adv, returns = token_advantages(cfg, torch.tensor([1.0, 0.0]), MASK, values=values)
    # lambda = gamma = 1: every token's return is the outcome reward; advantage = return - value.
    assert torch.allclose(returns, torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    assert torch.allclose(adv, torch.tensor([[0.0, 0.75, 0.5, 0.0], [0.0, -0.5, -0.5, -0.5]]))


def test_kl_in_the_reward_lowers_returns_of_drifted_tokens():
    cfg = AlgorithmSection(name="ppo", group_size=2, whiten_advantages=False, lam=1.0)
    logprobs = torch.tensor([[0.0, -1.0, -1.0, 0.0], [0.0, -1.0, -1.0, -1.0]])
    ref = logprobs.clone()
    ref[0, 2] = -2.0  # k1 = logp - ref = 1 on that token
    _, returns = token_advantages(cfg, torch.tensor([1.0, 0.0]), MASK, beta=0.1, logprobs=logprobs,
                                  ref_logprobs=ref, values=torch.zeros_like(MASK))
    assert torch.allclose(returns[0], torch.tensor([0.0, 0.9, 0.9, 0.0]))
    assert torch.allclose(returns[1], torch.zeros(4))


def test_reinforce_pp_whitens_over_the_batch():
    adv, _ = token_advantages(AlgorithmSection(name="reinforce_pp", group_size=2), torch.tensor([1.0, 0.0]), MASK)
    sampled = adv[MASK.bool()]
    assert sampled.mean().abs() < 1e-6 and sampled.std().item() == pytest.approx(1.0, abs=1e-5)
    assert (adv[0, 1:3] > 0).all() and (adv[1, 1:] < 0).all()


def test_dapo_overlong_shaping_and_advantage_clip():
    cfg = AlgorithmSection(name="dapo", overlong_buffer=4, group_size=2)
    rewards = shaped_rewards(cfg, torch.tensor([1.0, 1.0, 1.0]), torch.tensor([10, 14, 16]), max_new_tokens=16)
    assert torch.allclose(rewards, torch.tensor([1.0, 0.5, 0.0]))
    cfg = AlgorithmSection(name="grpo", group_size=2, scale_rewards=False, advantage_clip=0.25)
    adv, _ = token_advantages(cfg, torch.tensor([1.0, 0.0]), MASK)
    assert adv.abs().max() == 0.25


def test_turn_ids_split_sampled_runs():
    from posttrain.algorithms.gae import turn_ids

    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0, 0, 0]])
    assert turn_ids(mask).tolist() == [[-1, 0, 0, -1, -1, 1, 1, -1], [0, -1, -1, -1, -1, -1, -1, -1]]


def test_turn_level_gae_hand_computed():
    from posttrain.algorithms.gae import turn_level_gae

    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0]])
    values = torch.tensor([[9.0, 0.2, 7.0, 9.0, 9.0, 0.6, 7.0, 9.0]])  # only each turn's first token counts
    adv, ret = turn_level_gae(torch.tensor([[0.5, 1.0]]), values, mask, gamma=1.0, lam=1.0)
    # returns: turn 0 = 0.5 + 1.0, turn 1 = 1.0; advantages = returns - first-token values.
    assert torch.allclose(ret, torch.tensor([[0.0, 1.5, 1.5, 0.0, 0.0, 1.0, 1.0, 0.0]]))
    assert torch.allclose(adv, torch.tensor([[0.0, 1.3, 1.3, 0.0, 0.0, 0.4, 0.4, 0.0]]))
    # lambda = 0: one-step TD error per turn, delta_0 = 0.5 + V_1 - V_0 = 0.9.
    adv, _ = turn_level_gae(torch.tensor([[0.5, 1.0]]), values, mask, gamma=1.0, lam=0.0)
    assert torch.allclose(adv[0, 1], torch.tensor(0.9))


def test_ppo_turn_level_uses_step_rewards_then_the_outcome():
    cfg = AlgorithmSection(name="ppo", group_size=2, gae_level="turn", whiten_advantages=False, lam=1.0,
                           kl_in_reward=False)
    mask = torch.tensor([[0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    # Row 0: a step reward of 0.25, then the outcome 1.0; its reward is the return, 1.25.
    adv, ret = token_advantages(cfg, torch.tensor([1.25, 0.0]), mask, values=torch.zeros(2, 4),
                                step_rewards=[[0.25, 1.0], [0.0]])
    assert torch.allclose(ret, torch.tensor([[0.0, 1.25, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]]))
    assert torch.equal(adv, ret)


def test_reward_normalisation_modes():
    rewards, lengths = torch.tensor([1.0, 0.0, 3.0, 3.0]), torch.zeros(4)
    group = shaped_rewards(AlgorithmSection(group_size=2, reward_normalization="group"), rewards, lengths, 16)
    assert torch.allclose(group, torch.tensor([0.7071, -0.7071, 0.0, 0.0]), atol=1e-3)
    batch = shaped_rewards(AlgorithmSection(group_size=2, reward_normalization="batch"), rewards, lengths, 16)
    assert batch.mean().abs() < 1e-6 and batch.std().item() == pytest.approx(1.0, abs=1e-5)
    cfg = AlgorithmSection(group_size=2, reward_normalization="running")
    running = Algorithm(cfg, max_new_tokens=16)  # keeps the running statistics across steps
    shaped_rewards(cfg, torch.tensor([0.0, 2.0]), lengths[:2], 16, running)
    # Stats now cover {0, 2, 1, 0, 3, 3}: mean 1.5, sample std sqrt(1.9).
    out = shaped_rewards(cfg, rewards, lengths, 16, running)
    assert torch.allclose(out, (rewards - 1.5) / 1.9**0.5, atol=1e-5)


def test_turn_returns_discount_later_step_rewards():
    from posttrain.algorithms.advantages import turn_returns

    returns = turn_returns(torch.tensor([[0.1, 0.0, 1.0], [0.5, 9.0, 9.0]]), torch.tensor([3, 1]), gamma=0.5)
    # Row 0: G2 = 1, G1 = 0 + 0.5 * 1, G0 = 0.1 + 0.5 * 0.5. Row 1 has one turn: later entries are ignored.
    assert torch.allclose(returns, torch.tensor([[0.35, 0.5, 1.0], [0.5, 0.0, 0.0]]))


def test_turn_advantages_compare_each_turn_with_every_turn_of_its_group():
    import statistics

    from posttrain.algorithms.advantages import group_relative_advantages, group_relative_turn_advantages

    returns = torch.tensor([[0.35, 0.5, 1.0], [0.5, 0.0, 0.0]])
    adv = group_relative_turn_advantages(returns, torch.tensor([3, 1]), group_size=2, eps=0.0)
    valid = [0.35, 0.5, 1.0, 0.5]
    mean, std = statistics.mean(valid), statistics.stdev(valid)
    expected = torch.tensor([[(v - mean) / std for v in valid[:3]], [(0.5 - mean) / std, 0.0, 0.0]])
    assert torch.allclose(adv, expected)
    # One turn per trajectory: exactly GRPO's advantage.
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5])
    single = group_relative_turn_advantages(rewards.unsqueeze(1), torch.ones(4, dtype=torch.long), group_size=2)
    assert torch.allclose(single.squeeze(1), group_relative_advantages(rewards, group_size=2))


def test_turn_credit_gives_each_turn_of_a_trajectory_its_own_advantage():
    # Row 0: two turns (tokens 1-2, then 4), step rewards 0.5 then outcome; row 1: one turn.
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0, 0.0]])
    cfg = AlgorithmSection(name="dr_grpo", group_size=2, credit="turn")
    rewards = torch.tensor([1.5, 0.0])  # the returns: 0.5 + 1.0, and 0
    adv, _ = token_advantages(cfg, rewards, mask, step_rewards=[[0.5, 1.0], [0.0]])
    # Turn returns 1.5 (turn 0), 1.0 (turn 1) and 0 (row 1); group mean 2.5 / 3.
    m = 2.5 / 3
    assert torch.allclose(adv, torch.tensor([[0.0, 1.5 - m, 1.5 - m, 0.0, 1.0 - m], [0.0, -m, -m, -m, 0.0]]))
    with pytest.raises(ValueError, match="credit=turn is for grpo"):
        AlgorithmSection(name="ppo", credit="turn")
