import pytest
import torch

from posttrain.algorithms import group_relative_advantages, zero_variance_groups


def test_group_relative_advantages_hand_computed():
    # Group 1: mean 0.25, unbiased std 0.5. Group 2: all equal -> zero advantage.
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_relative_advantages(rewards, group_size=4)
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]) / torch.tensor([0.5001] * 4 + [1e-4] * 4)
    assert torch.allclose(adv, expected, atol=1e-6)
    assert adv[4:].abs().max() == 0


def test_dr_grpo_keeps_only_centring():
    rewards = torch.tensor([2.0, 0.0, 1.0, 1.0])
    adv = group_relative_advantages(rewards, group_size=2, scale=False)
    assert torch.equal(adv, torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_groups_are_contiguous_samples():
    rewards = torch.tensor([0.0, 1.0, 5.0, 7.0])
    adv = group_relative_advantages(rewards, group_size=2, scale=False)
    assert torch.equal(adv, torch.tensor([-0.5, 0.5, -1.0, 1.0]))


def test_zero_variance_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert zero_variance_groups(rewards, 2).tolist() == [True, False, True]


def test_rejects_partial_groups():
    with pytest.raises(ValueError, match="group_size"):
        group_relative_advantages(torch.ones(5), group_size=2)
