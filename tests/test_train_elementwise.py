"""The training pass's RMSNorm and SwiGLU on our own kernels compute what transformers' modules compute,
forward and backward, and a model routed to them trains as it did; the LM head's softmax statistics on our
kernel are what PyTorch's operations give, or closer to exact."""

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from posttrain.config import ModelSection
from posttrain.models import cpu_probe, load_model, load_tokenizer, train_elementwise
from posttrain.models.logprobs import policy_forward, torch_softmax_statistics
from posttrain.models.policy import Policy
from posttrain.models.train_elementwise import rms_norm, softmax_statistics, swiglu, use_fused_norm_mlp

needs_kernels = pytest.mark.skipif(train_elementwise.unavailable_reason() is not None,
                                   reason=f"no training kernels: {train_elementwise.unavailable_reason()}")


@needs_kernels
@pytest.mark.parametrize("shape", [(3, 7, 64), (600, 576), (2, 5, 44), (1, 3)])  # 600 x 576: both threads
def test_rms_norm_matches_transformers_forward_and_backward(shape):
    g = torch.Generator().manual_seed(shape[-1])
    norm = LlamaRMSNorm(shape[-1], eps=1e-5)
    norm.weight.data = torch.rand(shape[-1], generator=g) + 0.5
    x = (3 * torch.randn(shape, generator=g)).requires_grad_()
    grad = torch.randn(shape, generator=g)
    results = []
    for forward in (norm, lambda t: rms_norm(t, norm.weight, norm.variance_epsilon)):
        x.grad = norm.weight.grad = None
        out = forward(x)
        out.backward(grad)
        results.append([out.detach(), x.grad, norm.weight.grad])
    for a, b in zip(*results):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


@needs_kernels
@pytest.mark.parametrize("shape", [(3, 7, 128), (20, 1536), (13,)])  # 20 x 1536: both threads; 13: a tail
def test_swiglu_matches_silu_times_up_forward_and_backward(shape):
    g = torch.Generator().manual_seed(len(shape))
    gate = (4 * torch.randn(shape, generator=g)).requires_grad_()
    up = torch.randn(shape, generator=g).requires_grad_()
    with torch.no_grad():  # saturated gates: silu(g) -> g above, -> 0 below, without overflow
        gate.view(-1)[:4] = torch.tensor([100.0, -100.0, 90.0, -90.0])
    grad = torch.randn(shape, generator=g)
    results = []
    for forward in (lambda: F.silu(gate) * up, lambda: swiglu(gate, up)):
        gate.grad = up.grad = None
        out = forward()
        out.backward(grad)
        results.append([out.detach(), gate.grad, up.grad])
    for a, b in zip(*results):
        assert torch.isfinite(b).all()
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


@needs_kernels
@pytest.mark.parametrize("rows,vocab", [(300, 49157), (3, 7)])  # both threads and a tail; rows shorter than a vector
def test_softmax_statistics_match_exact_values_at_least_as_closely_as_pytorch(rows, vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = 4 * torch.randn(rows, vocab, generator=g)
    logits[0, 1] = 80.0  # a row whose mass sits on one token
    targets = torch.randint(0, vocab, (rows,), generator=g)
    targets[0] = 1
    exact = logits.double().log_softmax(-1)
    want = {"probs": exact.exp(), "logp": exact.gather(-1, targets[:, None]).squeeze(-1),
            "entropy": -(exact.exp() * exact).sum(-1), "lse": logits.double().logsumexp(-1)}
    ours = dict(zip(want, [p := logits.clone(), *softmax_statistics(p, targets)]))
    theirs = dict(zip(want, torch_softmax_statistics(logits.clone(), targets)))
    for name, exact_value in want.items():
        error, pytorch_error = ((got[name].double() - exact_value).abs().max().item() for got in (ours, theirs))
        assert error <= 1.5 * pytorch_error + 1e-7, (name, error, pytorch_error)
        assert ours[name].dtype == torch.float32 and ours[name].shape == exact_value.shape
    assert ours["probs"].data_ptr() == p.data_ptr()  # in place of the logits


@needs_kernels
@pytest.mark.parametrize("keep_probs_bytes", [0, 2**30])  # backward recomputes the probabilities, or keeps them
def test_the_heads_softmax_on_the_kernel_gives_pytorchs_logprobs_entropies_and_gradients(monkeypatch,
                                                                                        keep_probs_bytes):
    from posttrain.models import logprobs

    monkeypatch.setattr(logprobs, "KEEP_PROBS_BYTES", keep_probs_bytes)
    ids = torch.randint(0, 49152, (3, 40), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    torch.manual_seed(0)
    model = load_model("tiny-random")
    results = []
    for pays in (False, True):
        monkeypatch.setattr(cpu_probe, "train_elementwise_pays", lambda: pays)
        model.zero_grad()
        out = policy_forward(model, ids, mask)
        (out.logprobs.sum() + out.entropy.sum().detach()).backward()
        results.append([out.logprobs.detach(), out.entropy] + [p.grad.clone() for p in model.parameters()])
    for a, b in zip(*results):
        assert torch.allclose(a, b, atol=2e-5, rtol=1e-4)


def test_the_kernels_say_what_does_not_fit():
    with pytest.raises(ValueError, match=r"an RMSNorm weight of \[32\] does not fit rows of 64"):
        rms_norm(torch.randn(3, 64), torch.ones(32), 1e-5)
    with pytest.raises(ValueError, match=r"gate \[3, 8\] and up \[3, 4\] differ"):
        swiglu(torch.randn(3, 8), torch.randn(3, 4))
    with pytest.raises(ValueError, match=r"token ids below the vocabulary's 10, got 3 \.\. 10"):
        softmax_statistics(torch.randn(2, 10), torch.tensor([3, 10]))
    with pytest.raises(ValueError, match=r"expected contiguous logits \[rows, vocab\] and targets \[rows\]"):
        softmax_statistics(torch.randn(10, 2).t(), torch.tensor([0, 1]))


def test_training_elementwise_kernels_build_wherever_they_can_run(buildable_kernels):
    """Not a silent fallback: on an x86-64 CPU with AVX2/FMA and a C compiler, a broken build fails here."""
    assert train_elementwise.unavailable_reason() is None


def _pass(model, ids, mask):
    """Log-probabilities and every weight's gradient of one training pass."""
    model.zero_grad()
    out = policy_forward(model, ids, mask)
    out.logprobs.sum().backward()
    return [out.logprobs.detach()] + [p.grad.clone() for p in model.parameters()]


@needs_kernels
@pytest.mark.parametrize("rows,length", [(2, 9), (4, 80)])  # 4 x 80 tokens: the kernels' threaded path
def test_a_model_on_the_fused_layers_trains_as_on_transformers_modules(monkeypatch, rows, length):
    ids = torch.randint(0, 49152, (rows, length), generator=torch.Generator().manual_seed(rows))
    mask = torch.ones_like(ids)
    mask[0, length - 3:] = 0
    torch.manual_seed(0)
    plain = load_model("tiny-random")
    fused = copy.deepcopy(plain)
    use_fused_norm_mlp(fused)
    monkeypatch.setattr(cpu_probe, "train_elementwise_pays", lambda: True)
    for a, b in zip(_pass(plain, ids, mask), _pass(fused, ids, mask)):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    # where the probe finds PyTorch's operations faster, the modules' own code runs: the same numbers
    monkeypatch.setattr(cpu_probe, "train_elementwise_pays", lambda: False)
    assert all(torch.equal(a, b) for a, b in zip(_pass(plain, ids, mask), _pass(fused, ids, mask)))


@needs_kernels
def test_the_routing_survives_mode_switches_copies_and_pickling(monkeypatch):
    """transformers resets its hub-kernel layers' instance ``forward`` at every train() / eval(): the routing
    is a subclass, which that leaves alone, as it does deep copies (the reference model, the critic's trunk)."""
    monkeypatch.setattr(cpu_probe, "train_elementwise_pays", lambda: True)
    policy = Policy(load_model("tiny-random"), load_tokenizer("tiny-random"),
                    ModelSection(name="tiny-random", device="cpu"))
    model = policy.model
    model.train()
    model.eval()
    layer = model.model.layers[0]
    assert isinstance(layer.mlp, LlamaMLP) and isinstance(layer.input_layernorm, LlamaRMSNorm)
    calls = []
    monkeypatch.setattr(train_elementwise, "_RMSNorm", type("Spy", (), {"apply": lambda *a: calls.append(a) or a[0]}))
    model(input_ids=torch.tensor([[1, 2, 3]]))
    assert len(calls) == 2 * len(model.model.layers) + 1  # every norm, after the mode switches
    monkeypatch.undo()
    monkeypatch.setattr(cpu_probe, "train_elementwise_pays", lambda: True)
    x = torch.randn(1, 5, model.config.hidden_size)
    for twin in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert type(twin.input_layernorm) is type(layer.input_layernorm) and type(twin.mlp) is type(layer.mlp)
        with torch.no_grad():
            twin.input_layernorm.weight.mul_(2)  # its own weights
            assert torch.allclose(twin.input_layernorm(x), 2 * layer.input_layernorm(x), atol=1e-6)
    # under bf16 autocast the MLP's gate and up are bf16: the module's own code, as before
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(layer.mlp(x), LlamaMLP.forward(layer.mlp, x))
