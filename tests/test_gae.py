import pytest
import torch

from posttrain.algorithms import discounted_returns, gae


def reference_gae(rewards, values, mask, gamma, lam, last_values):
    """Plain loops over one row at a time, on the masked steps only."""
    advantages = [[0.0] * len(row) for row in rewards]
    returns = [[0.0] * len(row) for row in rewards]
    for b in range(len(rewards)):
        steps = [t for t in range(len(rewards[b])) if mask[b][t]]
        next_value = 0.0 if last_values is None else last_values[b]
        running = 0.0
        for t in reversed(steps):
            delta = rewards[b][t] + gamma * next_value - values[b][t]
            running = delta + gamma * lam * running
            advantages[b][t] = running
            returns[b][t] = running + values[b][t]
            next_value = values[b][t]
    return torch.tensor(advantages), torch.tensor(returns)


def test_gae_hand_computed_terminal_and_bootstrapped():
    # Row 0: 3 steps, then padding with garbage the function must ignore. gamma 0.9, lam 0.8.
    # Terminal:  t2: delta = 1 - 0.7 = 0.3                      A2 = 0.3
    #            t1: delta = 0.9 * 0.7 - 0.6 = 0.03             A1 = 0.03 + 0.72 * 0.3 = 0.246
    #            t0: delta = 0.9 * 0.6 - 0.5 = 0.04             A0 = 0.04 + 0.72 * 0.246 = 0.21712
    # Row 1: one step r=2, V=1, terminal: A = 2 - 1 = 1.
    rewards = torch.tensor([[0.0, 0.0, 1.0, 99.0], [2.0, 99.0, 99.0, 99.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 99.0], [1.0, 99.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert torch.allclose(adv, torch.tensor([[0.21712, 0.246, 0.3, 0], [1.0, 0, 0, 0]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.71712, 0.846, 1.0, 0], [2.0, 0, 0, 0]]), atol=1e-6)

    # Truncated row 0 bootstraps from V = 2 after its last step:
    #            t2: delta = 1 + 0.9 * 2 - 0.7 = 2.1            A2 = 2.1
    #            t1: A1 = 0.03 + 0.72 * 2.1 = 1.542;            t0: A0 = 0.04 + 0.72 * 1.542 = 1.15024
    # Row 1 passes 0: terminal in the same batch.
    adv, _ = gae(rewards, values, mask, gamma=0.9, lam=0.8, last_values=torch.tensor([2.0, 0.0]))
    assert torch.allclose(adv, torch.tensor([[1.15024, 1.542, 2.1, 0], [1.0, 0, 0, 0]]), atol=1e-6)


def test_gae_skips_environment_tokens_between_turns():
    # Position 1 is an observation token: the step after t0 is t2.
    # A2 = 1 - 0.7 = 0.3;  A0 = 0.9 * 0.7 - 0.5 + 0.72 * 0.3 = 0.13 + 0.216 = 0.346.
    rewards = torch.tensor([[0.0, 50.0, 1.0]])
    values = torch.tensor([[0.5, 50.0, 0.7]])
    adv, _ = gae(rewards, values, torch.tensor([[1, 0, 1]]), gamma=0.9, lam=0.8)
    assert torch.allclose(adv, torch.tensor([[0.346, 0.0, 0.3]]), atol=1e-6)


@pytest.mark.parametrize("terminal", [True, False])
@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (0.99, 1.0), (1.0, 0.0)])
def test_gae_matches_reference_on_random_padded_batches(terminal, gamma, lam):
    torch.manual_seed(0)
    b, t = 6, 11
    rewards, values = torch.randn(b, t), torch.randn(b, t)
    lengths = torch.tensor([11, 7, 1, 0, 5, 9])  # right padding, one row with no steps
    mask = (torch.arange(t) < lengths[:, None]) & (torch.rand(b, t) > 0.25)  # and gaps inside
    last_values = None if terminal else torch.randn(b)
    adv, ret = gae(rewards, values, mask.int(), gamma, lam, last_values)
    ref_adv, ref_ret = reference_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam,
                                     None if terminal else last_values.tolist())
    assert torch.allclose(adv, ref_adv, atol=1e-5)
    assert torch.allclose(ret, ref_ret, atol=1e-5)


def test_gae_per_turn_steps_and_no_gradient():
    # Turns as steps, [B, K] = [1, 3], gamma 1, lam 1: A_k = sum of later turn rewards - V_k.
    # Rewards [0.5, 0, 1] -> returns [1.5, 1, 1]; V = [1, 1, 1] -> A = [0.5, 0, 0].
    values = torch.ones(1, 3, requires_grad=True)
    adv, ret = gae(torch.tensor([[0.5, 0.0, 1.0]]), values, torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert torch.allclose(ret, torch.tensor([[1.5, 1.0, 1.0]]))
    assert torch.allclose(adv, torch.tensor([[0.5, 0.0, 0.0]]))
    assert not adv.requires_grad and not ret.requires_grad


def test_discounted_returns():
    # gamma 0.5 over steps [1, 0, 2] with a gap at position 1 and padding at 3:
    # R2 = 2, R0 = 1 + 0.5 * 2 = 2 (the gap is not a step, so it does not discount).
    rewards = torch.tensor([[1.0, 7.0, 2.0, 7.0]])
    out = discounted_returns(rewards, torch.tensor([[1, 0, 1, 0]]), gamma=0.5)
    assert torch.equal(out, torch.tensor([[2.0, 0.0, 2.0, 0.0]]))
