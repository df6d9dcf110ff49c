"""The training pass's matmuls on oneDNN: the same values and gradients as PyTorch's own path."""

import pytest
import torch
import torch.nn.functional as F

from posttrain.models import cpu_probe
from posttrain.models.logprobs import policy_forward
from posttrain.models.onednn_linear import OneDNNLinear, active, onednn_training, onednn_weight_grad, weight_grad
from posttrain.models.packed_linear import packing_available

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN linear op")


@pytest.mark.parametrize("bias", [False, True])
def test_onednn_linear_matches_f_linear_values_and_gradients(bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 24, generator=g, requires_grad=True)
    w = torch.randn(40, 24, generator=g, requires_grad=True)
    b = torch.randn(40, generator=g, requires_grad=True) if bias else None
    upstream = torch.randn(3, 7, 40, generator=g)
    ours = OneDNNLinear.apply(x, w, b)
    grads = torch.autograd.grad((ours * upstream).sum(), [x, w] + ([b] if bias else []))
    theirs = F.linear(x, w, b)
    expected = torch.autograd.grad((theirs * upstream).sum(), [x, w] + ([b] if bias else []))
    assert ours.shape == theirs.shape
    assert torch.allclose(ours, theirs, atol=1e-5)
    for got, want in zip(grads, expected):
        assert torch.allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("onednn", [False, True])
@pytest.mark.parametrize("width", [24, 130])
def test_weight_gradient_is_the_same_product_on_either_kernel(monkeypatch, onednn, width):
    """The weight gradient takes oneDNN or MKL by a per-machine measurement (thin products always MKL);
    both give dY^T x."""
    monkeypatch.setattr(cpu_probe, "onednn_weight_grad_pays", lambda: onednn)
    g = torch.Generator().manual_seed(2)
    grad, rows = torch.randn(50, 40, generator=g), torch.randn(50, width, generator=g)
    assert torch.allclose(weight_grad(grad, rows), (grad.T.double() @ rows.double()).float(), atol=1e-4)
    assert torch.allclose(onednn_weight_grad(grad, rows), (grad.T.double() @ rows.double()).float(), atol=1e-4)
    assert cpu_probe.onednn_weight_grad_speedup() > 0  # the measurement runs on this torch


def _pass(model, enabled):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (4, 10), generator=g)
    ids[2:, :4] = ids[0, :4]  # two groups of two rows sharing a 4-token prompt
    ids[1, :4] = ids[0, :4]
    mask = torch.ones_like(ids)
    mask[3, 8:] = 0
    with onednn_training(model, enabled):
        assert active() is enabled
        completions = (torch.arange(10) >= 4).long().expand(4, 10)
        out = policy_forward(model, ids, mask, completions, prompt_lengths=torch.full((4,), 4))
    (out.logprobs * torch.linspace(-1, 1, 10)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out.logprobs.detach(), grads


def test_policy_pass_on_onednn_gives_the_same_logprobs_and_gradients(tiny_model):
    """Every linear layer and the LM head switch kernels; log-probs and every parameter's gradient
    stay what PyTorch's own matmuls give, and the model is left as it was."""
    plain_lp, plain_grads = _pass(tiny_model, False)
    ours_lp, ours_grads = _pass(tiny_model, True)
    assert torch.allclose(ours_lp, plain_lp, atol=1e-5)
    assert ours_grads.keys() == plain_grads.keys() and len(ours_grads) > 10
    for name, grad in plain_grads.items():
        assert torch.allclose(ours_grads[name], grad, rtol=1e-4, atol=1e-6), name
    assert not any("forward" in vars(m) for m in tiny_model.modules() if type(m) is torch.nn.Linear)
    assert not active()
