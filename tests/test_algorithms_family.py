import math

import pytest
import torch

from posttrain.algorithms import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdaptiveKLController,
    FixedKLController,
    RunningMeanStd,
    aggregate,
    clip_advantages,
    dynamic_sampling_keep,
    explained_variance,
    grpo_loss,
    gspo_loss,
    kl_estimate,
    normalize_rewards,
    outcome_token_rewards,
    overlong_penalty,
    reinforce_pp_advantages,
    reinforce_pp_returns,
    rloo_advantages,
    value_loss,
    whiten,
)

# ---------------------------------------------------------------- sequence-level advantages


def test_rloo_hand_computed():
    # Group [1, 0, 0]: baselines (0+0)/2 = 0, (1+0)/2 = 0.5, 0.5 -> [1, -0.5, -0.5].
    # Group [0, 2, 4]: baselines 3, 2, 1 -> [-3, 0, 3] (= 3/2 * (r - mean 2)).
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0]), group_size=3)
    assert torch.allclose(adv, torch.tensor([1.0, -0.5, -0.5, -3.0, 0.0, 3.0]))


def test_rloo_rejects_groups_of_one_and_partial_groups():
    with pytest.raises(ValueError, match="group_size"):
        rloo_advantages(torch.ones(4), group_size=1)
    with pytest.raises(ValueError, match="group_size"):
        rloo_advantages(torch.ones(5), group_size=2)


def test_advantage_registry():
    assert set(ADVANTAGE_ESTIMATORS) >= {"grpo", "dr_grpo", "rloo"}
    rewards = torch.tensor([2.0, 0.0, 1.0, 1.0])
    # Dr. GRPO: centred only -> [1, -1, 0, 0]. RLOO with G = 2: r_i - r_other -> [2, -2, 0, 0].
    assert torch.equal(ADVANTAGE_ESTIMATORS["dr_grpo"](rewards, 2), torch.tensor([1.0, -1.0, 0.0, 0.0]))
    assert torch.equal(ADVANTAGE_ESTIMATORS["rloo"](rewards, 2), torch.tensor([2.0, -2.0, 0.0, 0.0]))
    # GRPO: centred, divided by the unbiased std sqrt(2) (+ 1e-4).
    assert ADVANTAGE_ESTIMATORS["grpo"](rewards, 2)[0].item() == pytest.approx(1 / (math.sqrt(2) + 1e-4))


def test_dynamic_sampling_keeps_groups_with_signal():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert dynamic_sampling_keep(rewards, 2).tolist() == [False, True, False]


def test_overlong_penalty_hand_computed():
    # max 20, cache 4: free up to 16, then (16 - L) / 4 down to -1 at 20, -1 beyond.
    lengths = torch.tensor([10, 16, 17, 18, 20, 25])
    out = overlong_penalty(lengths, max_length=20, cache_length=4)
    assert torch.allclose(out, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(lengths, max_length=20, cache_length=0)


# ---------------------------------------------------------------- REINFORCE++


def test_outcome_reward_goes_on_last_sampled_token():
    mask = torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    out = outcome_token_rewards(torch.tensor([2.0, 3.0, 5.0]), mask)
    assert torch.equal(out, torch.tensor([[0.0, 0, 2, 0], [0, 3, 0, 0], [0, 0, 0, 0]]))


def _reinforce_pp_batch():
    rewards = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    logprobs = torch.tensor([[-1.0, -1.0, -1.0, 0.0], [-2.0, -2.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5, 0.0], [-1.0, -2.0, 0.0, 0.0]])
    return rewards, mask, logprobs, ref


def test_reinforce_pp_returns_hand_computed():
    rewards, mask, logprobs, ref = _reinforce_pp_batch()
    # k1 = logp - ref: row 0 [0.5, 0, -0.5], row 1 [-1, 0]. beta 0.1 -> token rewards
    # row 0 [-0.05, 0, 1 + 0.05], row 1 [0.1, 0 + 0].
    # gamma 1:   row 0 [1.0, 1.05, 1.05], row 1 [0.1, 0].
    # gamma 0.5: row 0 t2 1.05, t1 0.525, t0 -0.05 + 0.2625 = 0.2125; row 1 [0.1, 0].
    out = reinforce_pp_returns(rewards, mask, logprobs, ref, beta=0.1)
    assert torch.allclose(out, torch.tensor([[1.0, 1.05, 1.05, 0], [0.1, 0, 0, 0]]), atol=1e-6)
    out = reinforce_pp_returns(rewards, mask, logprobs, ref, beta=0.1, gamma=0.5)
    assert torch.allclose(out, torch.tensor([[0.2125, 0.525, 1.05, 0], [0.1, 0, 0, 0]]), atol=1e-6)
    with pytest.raises(ValueError, match="ref_logprobs"):
        reinforce_pp_returns(rewards, mask, beta=0.1)


def test_reinforce_pp_advantages_are_whitened_over_the_batch():
    rewards, mask, logprobs, ref = _reinforce_pp_batch()
    # Sampled returns [1.0, 1.05, 1.05, 0.1, 0.0]: mean 3.2 / 5 = 0.64; squared deviations
    # 0.1296 + 0.1681 + 0.1681 + 0.2916 + 0.4096 = 1.167, unbiased var 1.167 / 4 = 0.29175.
    adv = reinforce_pp_advantages(rewards, mask, logprobs, ref, beta=0.1)
    std = math.sqrt(0.29175)
    expected = torch.tensor([[0.36, 0.41, 0.41, 0], [-0.54, -0.64, 0, 0]]) / std
    assert torch.allclose(adv, expected, atol=1e-5)


# ---------------------------------------------------------------- normalisation


def test_whiten_hand_computed():
    # Masked entries 1, 2, 3: mean 2, unbiased std 1. Padding (99) is ignored and comes out 0.
    values = torch.tensor([[1.0, 2.0, 99.0], [3.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert torch.allclose(whiten(values, mask), torch.tensor([[-1.0, 0, 0], [1.0, 0, 0]]), atol=1e-6)
    assert torch.allclose(whiten(values, mask, shift_mean=False), torch.tensor([[1.0, 2, 0], [3.0, 0, 0]]), atol=1e-6)


def test_running_mean_std_merges_batches_exactly():
    # 1..5 seen in two batches: mean 3, unbiased var 10 / 4 = 2.5.
    running = RunningMeanStd()
    running.update(torch.tensor([1.0, 2.0, 3.0]))
    running.update(torch.tensor([4.0, 5.0]))
    running.update(torch.tensor([]))
    assert running.count == 5
    assert running.mean == pytest.approx(3.0) and running.std == pytest.approx(math.sqrt(2.5))
    assert torch.allclose(running.normalise(torch.tensor([3.0, 5.0])), torch.tensor([0.0, 2 / math.sqrt(2.5)]))


def test_normalize_rewards_modes():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert torch.equal(normalize_rewards(rewards, "none"), rewards)
    # Groups [1, 0] and [0, 0]: (r - mean) / (unbiased std + 1e-4) -> [0.5, -0.5] / 0.7072, [0, 0].
    group = normalize_rewards(rewards, "group", group_size=2)
    assert torch.allclose(group, torch.tensor([0.5, -0.5, 0, 0]) / (math.sqrt(0.5) + 1e-4))
    # Whole batch: mean 0.25, unbiased std 0.5 -> [1.5, -0.5, -0.5, -0.5].
    expected = torch.tensor([1.5, -0.5, -0.5, -0.5])
    assert torch.allclose(normalize_rewards(rewards, "batch"), expected, atol=1e-6)
    # A fresh running normaliser has seen only this batch, so it matches "batch".
    assert torch.allclose(normalize_rewards(rewards, "running", running=RunningMeanStd()), expected, atol=1e-6)
    with pytest.raises(ValueError, match="group_size"):
        normalize_rewards(rewards, "group")
    with pytest.raises(ValueError, match="RunningMeanStd"):
        normalize_rewards(rewards, "running")
    with pytest.raises(ValueError, match="unknown"):
        normalize_rewards(rewards, "global")


def test_clip_advantages():
    assert torch.equal(clip_advantages(torch.tensor([-3.0, 0.5, 2.0]), 1.0), torch.tensor([-1.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match="positive"):
        clip_advantages(torch.zeros(1), 0.0)


# ---------------------------------------------------------------- policy losses


def test_constant_aggregation_divides_by_budget():
    # (1 + 2 + 3) / (max_tokens 4 * 2 sequences) = 0.75, whatever the sampled lengths.
    values = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert aggregate(values, mask, "constant", max_tokens=4).item() == pytest.approx(0.75)
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate(values, mask, "constant")


def test_constant_aggregation_microbatches_add_up():
    torch.manual_seed(0)
    lp, old, adv = torch.randn(4, 6), torch.randn(4, 6), torch.randn(4, 6)
    mask = (torch.rand(4, 6) > 0.3).float()
    full, _ = grpo_loss(lp, old, adv, mask, aggregation="constant", max_tokens=6)
    parts = sum(grpo_loss(lp[i : i + 2], old[i : i + 2], adv[i : i + 2], mask[i : i + 2], aggregation="constant",
                          max_tokens=6, total_sequences=4.0)[0] for i in (0, 2))
    assert parts.item() == pytest.approx(full.item(), abs=1e-6)


def test_gspo_loss_hand_computed():
    # Sequence 0: log-ratios [0.1, 0.3] -> s = exp(0.2) = 1.2214 > 1.2, A = +1: clipped, loss -1.2.
    # Sequence 1: log-ratio [-0.1] -> s = exp(-0.1) = 0.904837 inside [0.8, 1.2], A = -1: loss 0.904837.
    # Mean over sequences: (-1.2 + 0.904837) / 2 = -0.1475815.
    # Gradient: sequence 0 is clipped (none); sequence 1's token gets -A * s / |y| / G = 0.904837 / 2.
    old = torch.zeros(2, 3)
    lp = torch.tensor([[0.1, 0.3, 5.0], [-0.1, 5.0, 5.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, stats = gspo_loss(lp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.2)
    assert loss.item() == pytest.approx(-0.1475815, abs=1e-6)
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[0.0, 0.0, 0.0], [0.904837 / 2, 0.0, 0.0]]), atol=1e-6)
    assert stats["clip_high"].item() == pytest.approx(2 / 3) and stats["clip_low"].item() == 0
    assert stats["ratio_max"].item() == pytest.approx(math.exp(0.2), abs=1e-6)
    assert stats["ratio_min"].item() == pytest.approx(math.exp(-0.1), abs=1e-6)


def test_gspo_token_form_matches_sequence_level_gspo():
    # Sequence-level GSPO written directly: -mean_i min(s_i A_i, clip(s_i) A_i), gradient through s_i.
    torch.manual_seed(1)
    old = torch.randn(5, 7) * 0.01
    # Log-ratio noise of 0.002 puts 3 of the 5 sequences beyond the default clip range, 2 inside.
    lp = (old + torch.randn(5, 7) * 0.002).requires_grad_(True)
    mask = (torch.rand(5, 7) > 0.3).float()
    mask[:, 0] = 1.0
    seq_adv = torch.randn(5)
    loss, stats = gspo_loss(lp, old, seq_adv[:, None].expand(5, 7), mask)
    assert 0 < stats["clip_low"] + stats["clip_high"] < 1
    (grad,) = torch.autograd.grad(loss, lp)
    s = torch.exp(((lp - old) * mask).sum(-1) / mask.sum(-1))
    direct = -torch.minimum(s * seq_adv, s.clamp(1 - 3e-4, 1 + 4e-4) * seq_adv).mean()
    (direct_grad,) = torch.autograd.grad(direct, lp)
    assert loss.item() == pytest.approx(direct.item(), abs=1e-6)
    assert torch.allclose(grad, direct_grad, atol=1e-6)


def test_policy_loss_registry_shares_the_call():
    lp, old, adv, mask = torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3)
    for name in ("grpo", "gspo"):
        loss, stats = POLICY_LOSSES[name](lp, old, adv, mask)
        assert loss.item() == pytest.approx(-1.0)  # on-policy: ratio 1, loss -A
        assert {"clip_low", "clip_high", "ratio_min", "ratio_max"} <= set(stats)


# ---------------------------------------------------------------- critic


def test_value_loss_hand_computed():
    # t0: V 1, V_old 0, R 2: unclipped (1-2)^2 = 1; clipped V 0.2: (0.2-2)^2 = 3.24 -> 3.24.
    # t1: V 2, V_old 2.5, R 1: unclipped 1; clipped V 2.3: 1.3^2 = 1.69 -> 1.69.  t2 is padding.
    # 0.5 * (3.24 + 1.69) / 2 = 1.2325; without the clip 0.5 * (1 + 1) / 2 = 0.5.
    values = torch.tensor([[1.0, 2.0, 0.0]])
    old = torch.tensor([[0.0, 2.5, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 5.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert value_loss(values, old, returns, mask, clip_range=0.2).item() == pytest.approx(1.2325)
    assert value_loss(values, old, returns, mask, clip_range=None).item() == pytest.approx(0.5)


def test_explained_variance_hand_computed():
    # Returns [1, 2, 3]: unbiased var 1. Values [1, 2, 4]: residual [0, 0, -1], var 1/3 -> 1 - 1/3.
    returns = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(torch.tensor([[1.0, 2.0, 4.0, 0.0]]), returns, mask).item() == pytest.approx(2 / 3)
    assert explained_variance(returns, returns, mask).item() == pytest.approx(1.0)
    assert math.isnan(explained_variance(returns, torch.ones(1, 4), mask).item())


# ---------------------------------------------------------------- KL


def test_kl_estimators_hand_computed():
    # pi = 0.5, pi_ref = 0.25: log(pi / pi_ref) = ln 2.  k1 = ln 2, k2 = (ln 2)^2 / 2,
    # k3 = r - 1 - ln r with r = pi_ref / pi = 0.5: 0.5 - 1 + ln 2.
    lp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    ln2 = math.log(2.0)
    assert kl_estimate(lp, ref, "k1").item() == pytest.approx(ln2)
    assert kl_estimate(lp, ref, "k2").item() == pytest.approx(ln2**2 / 2)
    assert kl_estimate(lp, ref, "k3").item() == pytest.approx(ln2 - 0.5)
    with pytest.raises(ValueError, match="k1"):
        kl_estimate(lp, ref, "k4")


def test_k1_and_k3_are_unbiased_in_expectation():
    # Expectation under pi over a 3-way categorical equals the exact KL(pi || pi_ref).
    pi = torch.tensor([0.5, 0.3, 0.2])
    ref = torch.tensor([0.2, 0.5, 0.3])
    exact = (pi * (pi / ref).log()).sum()
    for kind in ("k1", "k3"):
        expectation = (pi * kl_estimate(pi.log(), ref.log(), kind)).sum()
        assert expectation.item() == pytest.approx(exact.item(), abs=1e-6)


def test_kl_controllers():
    # Target 6, horizon 10000, 1000 samples: KL 9 -> error 0.5 clipped to 0.2: 0.1 * 1.02 = 0.102.
    # KL 5.4 -> error -0.1: 0.102 * (1 - 0.01) = 0.10098.
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    assert ctl.update(9.0, 1000) == pytest.approx(0.102)
    assert ctl.update(5.4, 1000) == pytest.approx(0.10098)
    fixed = FixedKLController(0.05)
    assert fixed.update(100.0, 1000) == 0.05 and fixed.value == 0.05
    with pytest.raises(ValueError, match="positive"):
        AdaptiveKLController(0.1, target=0.0, horizon=1.0)
