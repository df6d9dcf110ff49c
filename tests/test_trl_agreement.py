"""Our GRPO-family losses agree with TRL's GRPOTrainer loss on the same inputs (TRL is a test-only
dependency). TRL's loss lives in a method of its trainer; we call that method on a minimal stand-in
for the trainer's state, with the log-probabilities we want it to see."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl import GRPOTrainer

from posttrain.algorithms import grpo_loss, gspo_loss


class _SingleProcess:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def trl_loss(loss_type, logps, old, ref, adv, mask, *, beta=0.0, eps_low=0.2, eps_high=0.2, level="token",
             max_len=8):
    model = SimpleNamespace(training=True)
    trainer = SimpleNamespace(
        model=model, beta=beta, loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high,
        importance_sampling_level=level, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        use_vllm=False, aux_loss_enabled=False, _entropy_bonus_enabled=False, current_gradient_accumulation_steps=1,
        max_completion_length=max_len, accelerator=_SingleProcess(), _metrics=defaultdict(lambda: defaultdict(list)),
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None),
    )
    b, t = logps.shape
    inputs = {
        "prompt_ids": torch.zeros(b, 1, dtype=torch.long), "prompt_mask": torch.ones(b, 1, dtype=torch.long),
        "completion_ids": torch.zeros(b, t, dtype=torch.long), "completion_mask": mask,
        "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    return GRPOTrainer._compute_loss(trainer, model, inputs)


@pytest.fixture
def inputs():
    g = torch.Generator().manual_seed(0)
    b, t = 6, 8
    logps = -torch.rand(b, t, generator=g) * 3
    old = logps + 0.3 * torch.randn(b, t, generator=g)  # ratios well outside the clip range
    ref = logps + 0.5 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    mask = (torch.rand(b, t, generator=g) > 0.25).long()
    mask[:, 0] = 1
    return logps, old, ref, adv, mask


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize(
    "trl_type, ours",
    [("grpo", {"aggregation": "sequence"}), ("dapo", {"aggregation": "token", "epsilon_high": 0.28}),
     ("bnpo", {"aggregation": "token"}), ("dr_grpo", {"aggregation": "constant", "max_tokens": 8.0})],
)
def test_grpo_family_losses_match_trl(inputs, trl_type, ours, beta):
    logps, old, ref, adv, mask = inputs
    eps_high = ours.get("epsilon_high", 0.2)
    expected = trl_loss(trl_type, logps, old, ref, adv.unsqueeze(1), mask, beta=beta, eps_high=eps_high)
    ours = {k: v for k, v in ours.items() if k != "epsilon_high"}
    loss, _ = grpo_loss(logps, old, adv.unsqueeze(1).expand_as(logps), mask, beta=beta, ref_logprobs=ref,
                        epsilon_high=eps_high, **ours)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)


def test_gspo_matches_trl_sequence_level_importance_sampling(inputs):
    logps, old, ref, adv, mask = inputs
    old = logps + 0.001 * torch.randn(logps.shape, generator=torch.Generator().manual_seed(1))
    expected = trl_loss("grpo", logps, old, ref, adv.unsqueeze(1), mask, eps_low=3e-4, eps_high=4e-4,
                        level="sequence")
    loss, _ = gspo_loss(logps, old, adv.unsqueeze(1).expand_as(logps), mask, epsilon_low=3e-4, epsilon_high=4e-4)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
