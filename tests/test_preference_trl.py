"""Our preference losses agree with TRL's DPOTrainer and KTOTrainer on the same inputs (TRL is a test-only
dependency). TRL computes its losses inside the trainers' ``_compute_loss`` methods; we call those methods on a
minimal stand-in for the trainer's state and a stand-in model that returns the per-token log-probabilities we
want TRL to see, with the reference log-probabilities precomputed (TRL's ``precompute_ref_log_probs``)."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl import DPOTrainer
from trl.experimental.kto import KTOTrainer

from posttrain.algorithms.preference import dpo_loss, ipo_loss, kto_kl_estimate, kto_loss, sft_loss


class _SingleProcess:
    num_processes = 1
    device = torch.device("cpu")

    def gather(self, x):
        return x

    gather_for_metrics = gather


class _TokenLogprobModel:
    """Stands in for TRL's fused-LM-head forward: returns fixed per-token log-probabilities."""

    training = True

    def __init__(self, by_input: dict[int, torch.Tensor]):
        self.by_input = by_input  # id(input_ids tensor) -> [B, T] log-probs, 0 outside the completion

    def __call__(self, input_ids, labels=None, **kwargs):
        lp = self.by_input[id(input_ids)][:, 1:]  # TRL's outputs are shifted: position t-1 scores token t
        zeros = torch.zeros_like(lp)
        return SimpleNamespace(log_probs=lp, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())


def _state(model, **fields):
    return SimpleNamespace(model=model, accelerator=_SingleProcess(), precompute_ref_logps=True,
                           aux_loss_enabled=False, _tp_size=1, _total_train_tokens=0,
                           _metrics=defaultdict(lambda: defaultdict(list)), **fields)


def _sequences(n, t, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(n, t)
    for i in range(n):  # prompt of 2-4 tokens, then 2..t-4 agent tokens, then padding
        start = int(torch.randint(2, 5, (1,), generator=g))
        length = int(torch.randint(2, t - 4, (1,), generator=g))
        mask[i, start : start + length] = 1
    lp = -torch.rand(n, t, generator=g) * 2 * mask
    ref = (lp + 0.3 * torch.randn(n, t, generator=g)) * mask
    return lp, ref, mask


def trl_dpo(loss_type, lp, ref, mask, beta, label_smoothing=0.0):
    """TRL's DPO loss for rows [chosen..., rejected...] with per-token (masked) log-probs."""
    input_ids = torch.zeros(mask.shape, dtype=torch.long)
    model = _TokenLogprobModel({id(input_ids): lp})
    state = _state(model, beta=beta, loss_types=[loss_type], loss_weights=[1.0], ld_alpha=None,
                   f_divergence_type="reverse_kl", label_smoothing=label_smoothing, use_weighting=False)
    ref_c, ref_r = ref.sum(-1).chunk(2)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "completion_mask": mask.long(),
              "ref_chosen_logps": ref_c, "ref_rejected_logps": ref_r}
    return DPOTrainer._compute_loss(state, model, inputs, return_outputs=False)


@pytest.fixture
def pairs():
    lp, ref, mask = _sequences(12, 16, seed=0)  # 6 pairs: rows 0-5 chosen, 6-11 rejected
    return lp, ref, mask


def _ours(lp, ref, mask):
    s, r, tokens = lp.sum(-1), ref.sum(-1), mask.sum(-1)
    return (*s.chunk(2), *r.chunk(2), *tokens.chunk(2))


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_sigmoid_matches_trl(pairs, beta):
    c, r, rc, rr, _, _ = _ours(*pairs)
    expected = trl_dpo("sigmoid", *pairs, beta=beta)
    assert dpo_loss(c, r, rc, rr, beta).mean().item() == pytest.approx(expected.item(), abs=1e-6)


@pytest.mark.parametrize("tau", [0.1, 0.5])
def test_ipo_matches_trl(pairs, tau):
    c, r, rc, rr, tc, tr = _ours(*pairs)
    expected = trl_dpo("ipo", *pairs, beta=tau)
    assert ipo_loss(c, r, rc, rr, tc, tr, tau).mean().item() == pytest.approx(expected.item(), abs=1e-6)


@pytest.mark.parametrize("smoothing", [0.1, 0.3])
def test_label_smoothed_dpo_matches_trl(pairs, smoothing):
    """TRL 1.16 applies label_smoothing in its 'aot' loss, which sorts the batch's log-ratio margins before the
    label-smoothed sigmoid; for a single pair sorting is the identity, so 'aot' on one pair is exactly cDPO."""
    lp, ref, mask = pairs
    c, r, rc, rr, _, _ = _ours(lp, ref, mask)
    ours = dpo_loss(c, r, rc, rr, 0.2, label_smoothing=smoothing)
    n = len(c)
    for i in range(n):
        rows = torch.tensor([i, n + i])
        expected = trl_dpo("aot", lp[rows], ref[rows], mask[rows], beta=0.2, label_smoothing=smoothing)
        assert ours[i].item() == pytest.approx(expected.item(), abs=1e-6)
    assert not torch.allclose(ours, dpo_loss(c, r, rc, rr, 0.2))  # smoothing changes the loss


def trl_kto(lp, ref, mask, labels, kl_lp, kl_ref, kl_mask, beta, wd, wu):
    input_ids = torch.zeros(mask.shape, dtype=torch.long)
    kl_ids = torch.ones(kl_mask.shape, dtype=torch.long)
    model = _TokenLogprobModel({id(input_ids): lp, id(kl_ids): kl_lp})
    state = _state(model, beta=beta, loss_type="kto", calculate_KL=True, desirable_weight=wd, undesirable_weight=wu)
    state._compute_kl_logps = lambda m, batch: KTOTrainer._compute_kl_logps(state, m, batch)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "completion_mask": mask.long(),
              "label": labels, "KL_input_ids": kl_ids, "KL_attention_mask": torch.ones_like(kl_ids),
              "KL_completion_mask": kl_mask.long(), "ref_logps": ref.sum(-1), "ref_KL_logps": kl_ref.sum(-1)}
    return KTOTrainer._compute_loss(state, model, inputs, return_outputs=False)


@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 1.5)])
@pytest.mark.parametrize("kl_shift", [0.0, 0.4])  # the KL estimate clamped at 0, and a positive one
def test_kto_matches_trl(weights, kl_shift):
    lp, ref, mask = _sequences(10, 16, seed=1)
    kl_lp, kl_ref, kl_mask = _sequences(10, 16, seed=2)
    kl_lp = (kl_lp + kl_shift) * kl_mask
    labels = torch.tensor([True, False, True, True, False, False, True, False, True, False])
    beta = 0.3
    expected = trl_kto(lp, ref, mask, labels, kl_lp, kl_ref, kl_mask, beta, *weights)
    kl = kto_kl_estimate(kl_lp.sum(-1), kl_ref.sum(-1))
    ours = kto_loss(lp.sum(-1), ref.sum(-1), labels, kl, beta, *weights).mean()
    assert ours.item() == pytest.approx(expected.item(), abs=1e-6)


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_rpo_matches_trl_sigmoid_plus_sft(pairs, alpha):
    """RPO (DPO + alpha x the chosen answers' NLL per token) is TRL's loss_type ['sigmoid', 'sft'] with weights
    [1, alpha]; split into micro-batches, our terms add up to the same batch loss."""
    lp, ref, mask = pairs
    c, r, rc, rr, tc, _ = _ours(lp, ref, mask)
    input_ids = torch.zeros(mask.shape, dtype=torch.long)
    model = _TokenLogprobModel({id(input_ids): lp})
    state = _state(model, beta=0.1, loss_types=["sigmoid", "sft"], loss_weights=[1.0, alpha], ld_alpha=None,
                   f_divergence_type="reverse_kl", label_smoothing=0.0, use_weighting=False)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "completion_mask": mask.long(),
              "ref_chosen_logps": rc, "ref_rejected_logps": rr}
    expected = DPOTrainer._compute_loss(state, model, inputs, return_outputs=False)
    n, total = len(c), float(tc.sum())
    ours = sum(dpo_loss(c[m], r[m], rc[m], rr[m], 0.1).sum() / n
               + alpha * sft_loss(c[m], torch.ones_like(c[m]), total_tokens=total)
               for m in (slice(0, 2), slice(2, n)))  # two micro-batches
    assert ours.item() == pytest.approx(expected.item(), abs=1e-6)
    assert ours.item() > dpo_loss(c, r, rc, rr, 0.1).mean().item()
