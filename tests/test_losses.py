import math

import pytest
import torch

from posttrain.algorithms import aggregate, clipped_surrogate, grpo_loss, k3_kl


def test_clipped_surrogate_hand_computed():
    old = torch.zeros(1, 4)
    logprobs = torch.log(torch.tensor([[1.5, 1.5, 0.5, 1.1]]))
    adv = torch.tensor([[1.0, -1.0, -1.0, 2.0]])
    loss, ratio = clipped_surrogate(logprobs, old, adv, epsilon_low=0.2, epsilon_high=0.28)
    # ratio 1.5, A=+1: clipped to 1.28 -> -1.28. ratio 1.5, A=-1: min(-1.5, -1.28) -> 1.5.
    # ratio 0.5, A=-1: clipped to 0.8 -> 0.8.  ratio 1.1, A=2 inside the range -> -2.2.
    assert torch.allclose(loss, torch.tensor([[-1.28, 1.5, 0.8, -2.2]]), atol=1e-6)
    assert torch.allclose(ratio, torch.tensor([[1.5, 1.5, 0.5, 1.1]]), atol=1e-6)


def test_aggregation_token_vs_sequence():
    values = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert aggregate(values, mask, "token").item() == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    assert aggregate(values, mask, "sequence").item() == pytest.approx(2.25)  # (1.5 + 3) / 2


def test_microbatch_losses_add_up_to_batch_loss():
    torch.manual_seed(0)
    lp, old, adv = torch.randn(4, 6), torch.randn(4, 6), torch.randn(4, 6)
    mask = (torch.rand(4, 6) > 0.3).float()
    for mode in ("token", "sequence"):
        full, _ = grpo_loss(lp, old, adv, mask, aggregation=mode)
        parts = sum(
            grpo_loss(lp[i : i + 2], old[i : i + 2], adv[i : i + 2], mask[i : i + 2], aggregation=mode,
                      total_tokens=mask.sum().item(), total_sequences=4.0)[0]
            for i in (0, 2)
        )
        assert parts.item() == pytest.approx(full.item(), abs=1e-6)


def test_k3_kl_hand_computed():
    lp = torch.log(torch.tensor([0.5]))
    ref = torch.log(torch.tensor([0.25]))
    expected = 0.5 - math.log(0.5) - 1.0
    assert k3_kl(lp, ref).item() == pytest.approx(expected, abs=1e-6)
    assert k3_kl(lp, lp).item() == 0.0


def test_on_policy_gradient_is_minus_advantage_over_tokens():
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    adv = torch.tensor([[2.0, 2.0, 2.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    loss, stats = grpo_loss(lp, lp.detach(), adv, mask)
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[0.0, -1.0, -1.0]]))
    assert stats["clip_low"] == 0 and stats["clip_high"] == 0


def test_kl_term_and_clip_statistics():
    old = torch.zeros(1, 2)
    lp = torch.log(torch.tensor([[2.0, 0.5]]))
    ref = torch.log(torch.tensor([[1.0, 1.0]]))
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    loss, stats = grpo_loss(lp, old, adv, mask, beta=0.1, ref_logprobs=ref)
    kl = k3_kl(lp, ref)
    surrogate = torch.tensor([-1.2, 0.8])
    assert loss.item() == pytest.approx((surrogate + 0.1 * kl[0]).mean().item(), abs=1e-6)
    assert stats["kl"].item() == pytest.approx(kl.mean().item(), abs=1e-6)
    assert stats["clip_high"].item() == 0.5 and stats["clip_low"].item() == 0.5
    assert stats["ratio_max"].item() == pytest.approx(2.0) and stats["ratio_min"].item() == pytest.approx(0.5)


def test_beta_without_reference_is_an_error():
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), beta=0.1)


def test_learning_rate_schedules_warm_up_then_decay_to_the_floor():
    from posttrain.train.optimizer import lr_schedule

    def rates(kind):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = lr_schedule(opt, warmup_steps=2, total_steps=10, kind=kind, min_ratio=0.1)
        out = []
        for _ in range(11):
            out.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
        return out

    assert rates("constant")[:3] == [0.5, 1.0, 1.0] and rates("constant")[-1] == 1.0
    cosine, linear = rates("cosine"), rates("linear")
    assert cosine[2] == pytest.approx(1.0) and cosine[10] == pytest.approx(0.1) and cosine[6] == pytest.approx(0.55)
    assert linear[6] == pytest.approx(0.55) and linear[10] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(cosine[2:], cosine[3:]))
