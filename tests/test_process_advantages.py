import pytest
import torch

from posttrain.algorithms.advantages import group_relative_advantages
from posttrain.algorithms.process import dense_token_rewards, process_supervised_advantages


def test_dense_token_rewards_are_placed_after_the_prompt():
    out, ends = dense_token_rewards([[(0, 0.5), (2, 1.0)], []], torch.tensor([2, 1]), torch.Size([2, 6]))
    assert out.tolist() == [[0, 0, 0.5, 0, 1.0, 0], [0] * 6]
    assert ends.tolist() == [[False, False, True, False, True, False], [False] * 6]


def _advantages(outcome, dense, mask, prompt_lengths, group_size):
    return process_supervised_advantages(outcome, *dense_token_rewards(dense, prompt_lengths, mask.shape), mask,
                                         group_size)


def test_process_supervised_advantages():
    """Two solutions of one task, prompt 1 token, completion 4 tokens, steps ending at tokens 1 and 3."""
    mask = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.float32)
    dense = [[(1, 0.9), (3, 0.8)], [(1, 0.7), (3, 0.2)]]
    adv = _advantages(torch.tensor([1.0, 0.0]), dense, mask, torch.tensor([1, 1]), 2)
    steps = torch.tensor([0.9, 0.8, 0.7, 0.2])
    z = ((steps - steps.mean()) / (steps.std() + 1e-4)).tolist()
    outcome = group_relative_advantages(torch.tensor([1.0, 0.0]), 2)
    expected = torch.tensor([
        [0, z[0] + z[1], z[0] + z[1], z[1], z[1]],
        [0, z[2] + z[3], z[2] + z[3], z[3], z[3]],
    ]) + outcome.unsqueeze(-1) * mask
    assert torch.allclose(adv, expected * mask, atol=1e-5)
    # No step rewards at all: exactly GRPO's outcome advantage.
    plain = _advantages(torch.tensor([1.0, 0.0]), [[], []], mask, torch.tensor([1, 1]), 2)
    assert torch.allclose(plain, outcome.unsqueeze(-1) * mask)


def test_groups_are_normalised_separately():
    mask = torch.ones(4, 3)
    dense = [[(2, 1.0)], [(2, 0.0)], [(2, 100.0)], [(2, 50.0)]]
    adv = _advantages(torch.zeros(4), dense, mask, torch.zeros(4, dtype=torch.long), 2)
    assert adv[0, 0].item() == pytest.approx(adv[2, 0].item(), abs=1e-3)
    assert adv[1, 0].item() == pytest.approx(adv[3, 0].item(), abs=1e-3)
