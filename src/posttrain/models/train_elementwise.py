"""The training pass's RMSNorm and SwiGLU on our own kernels (``train_elementwise.c``): forward and backward;
and the softmax statistics of its LM head's logits.

Besides its matmuls and attention, a decoder layer's training pass is elementwise work that PyTorch
runs as many small operations: Llama's RMSNorm (Zhang & Sennrich, 2019) is six forward and about ten
backward, SwiGLU's ``silu(gate) * up`` (Shazeer, 2020) two forward and three backward, each a pass
over a ``[tokens, width]`` tensor. Here each is one pass forward and one backward, and the forward
keeps only what the backward reads (RMSNorm's input and each row's ``1 / rms``; SwiGLU's two inputs,
not also ``silu(gate)``: a ``[tokens, intermediate]`` tensor less per layer). The LM head's log-probabilities
and entropy (:func:`softmax_statistics`) are seven passes over a ``[rows, vocab]`` block in PyTorch (maximum,
shift, exponential, sum, the entropy's row-wise product, gather, normalisation): 43 ms for 512 rows of a 49k
vocabulary on a Zen 4 EPYC (2 threads), where the kernel, taking a row at a time through the cache, takes 9.

:func:`use_fused_norm_mlp` routes a model's RMSNorm and MLP modules here (the Llama family, whose
modules compute exactly this) for float32 CPU tensors, where the kernels build and
:func:`posttrain.models.cpu_probe.train_elementwise_pays` measured them faster than PyTorch's
operations; other tensors, dtypes and devices take the modules' own code.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import nn

from posttrain.models import native

SOURCE = Path(__file__).with_name("train_elementwise.c")

# transformers' modules that compute Llama's RMSNorm (weight * x / rms(x)) and gated MLP (down(act(gate(x)) *
# up(x))), by the model family whose modeling file defines them.
FAMILIES = {"LlamaRMSNorm": "llama", "MistralRMSNorm": "mistral", "Qwen2RMSNorm": "qwen2", "Qwen3RMSNorm": "qwen3",
            "LlamaMLP": "llama", "MistralMLP": "mistral", "Qwen2MLP": "qwen2", "Qwen3MLP": "qwen3"}


_P, _SIZE, _THREADS = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_KERNELS = native.Kernels(SOURCE, "RMSNorm / SwiGLU / LM head softmax training kernels", {
    "rms_norm_forward": [_P, _P, _SIZE, _SIZE, ctypes.c_float, _P, _P, _THREADS],
    "rms_norm_backward": [_P, _P, _P, _P, _SIZE, _SIZE, _P, _P, _P, _THREADS],
    "swiglu_forward": [_P, _P, _SIZE, _P, _THREADS],
    "swiglu_backward": [_P, _P, _P, _SIZE, _P, _P, _THREADS],
    "softmax_statistics": [_P, _P, _SIZE, _SIZE, _P, _P, _P, _THREADS]})
unavailable_reason = _KERNELS.unavailable_reason


def supports(*tensors: torch.Tensor) -> bool:
    """True when the kernels are built here and the tensors are float32 on the CPU."""
    return unavailable_reason() is None and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        hidden = x.shape[-1]
        rows = x.reshape(-1, hidden).contiguous()
        weight_ = weight.detach().contiguous()
        out, inv = torch.empty_like(rows), torch.empty(rows.shape[0])
        _KERNELS.loaded().rms_norm_forward(rows.data_ptr(), weight_.data_ptr(), rows.shape[0], hidden, eps,
                                           out.data_ptr(), inv.data_ptr(), torch.get_num_threads())
        ctx.save_for_backward(rows, weight_, inv)
        return out.view(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        rows, weight, inv = ctx.saved_tensors
        grad = grad_out.reshape(rows.shape).contiguous()
        grad_x, grad_weight = torch.empty_like(rows), torch.empty_like(weight)
        threads = torch.get_num_threads()
        partial = torch.empty(threads, rows.shape[1])  # each thread's share of the weight gradient
        _KERNELS.loaded().rms_norm_backward(rows.data_ptr(), weight.data_ptr(), inv.data_ptr(), grad.data_ptr(),
                                            rows.shape[0], rows.shape[1], grad_x.data_ptr(), grad_weight.data_ptr(),
                                            partial.data_ptr(), threads)
        return grad_x.view(grad_out.shape), grad_weight, None


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        gate, up = gate.contiguous(), up.contiguous()
        out = torch.empty_like(gate)
        _KERNELS.loaded().swiglu_forward(gate.data_ptr(), up.data_ptr(), gate.numel(), out.data_ptr(),
                                         torch.get_num_threads())
        ctx.save_for_backward(gate, up)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        gate, up = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_gate, grad_up = torch.empty_like(gate), torch.empty_like(up)
        _KERNELS.loaded().swiglu_backward(gate.data_ptr(), up.data_ptr(), grad_out.data_ptr(), gate.numel(),
                                          grad_gate.data_ptr(), grad_up.data_ptr(), torch.get_num_threads())
        return grad_gate, grad_up


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2, -1) + eps)`` (Llama's RMSNorm) for float32 CPU tensors, on our kernels;
    ``x`` ``[..., hidden]``, ``weight`` ``[hidden]``."""
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"an RMSNorm weight of {list(weight.shape)} does not fit rows of {x.shape[-1]}")
    return _RMSNorm.apply(x, weight, eps)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for float32 CPU tensors of one shape, on our kernels."""
    if gate.shape != up.shape:
        raise ValueError(f"gate {list(gate.shape)} and up {list(up.shape)} differ in shape")
    return _SwiGLU.apply(gate, up)


def softmax_statistics(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Turn ``logits`` ``[rows, vocab]`` (contiguous float32 on the CPU, :func:`supports`) into their softmax in
    place, and return each row's log-probability of its entry of ``targets`` ``[rows]``, its entropy and its
    log-normaliser (logsumexp), each ``[rows]``."""
    if logits.dim() != 2 or not logits.is_contiguous() or targets.shape != logits.shape[:1]:
        raise ValueError(f"expected contiguous logits [rows, vocab] and targets [rows], got {list(logits.shape)} "
                         f"({'' if logits.is_contiguous() else 'not '}contiguous) and {list(targets.shape)}")
    rows, vocab = logits.shape
    targets = targets.to(torch.int64).contiguous()
    if rows and not 0 <= int(targets.min()) <= int(targets.max()) < vocab:
        raise ValueError(f"targets must be token ids below the vocabulary's {vocab}, got {targets.min()} .. "
                         f"{targets.max()}")
    logp, entropy, lse = torch.empty(rows), torch.empty(rows), torch.empty(rows)
    _KERNELS.loaded().softmax_statistics(logits.data_ptr(), targets.data_ptr(), rows, vocab, logp.data_ptr(),
                                         entropy.data_ptr(), lse.data_ptr(), torch.get_num_threads())
    return logp, entropy, lse


def _norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    from posttrain.models.cpu_probe import train_elementwise_pays  # cpu_probe imports this module

    if supports(hidden_states, self.weight) and train_elementwise_pays():
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)
    return super(type(self), self).forward(hidden_states)


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    from posttrain.models.cpu_probe import train_elementwise_pays

    if not (x.device.type == "cpu" and train_elementwise_pays()):  # the probe gives 0 without kernels
        return super(type(self), self).forward(x)
    gate, up = self.gate_proj(x), self.up_proj(x)
    product = swiglu(gate, up) if supports(gate, up) else self.act_fn(gate) * up
    return self.down_proj(product)


@functools.cache
def _routed(name: str) -> type:
    """transformers' class ``name`` with our forward: a subclass (named ``Fused<name>``, defined in this module,
    so that a pickled model loads with it), not an instance attribute, because transformers resets the
    instance ``forward`` of its hub-kernel layers (RMSNorm among them) at every ``train()`` and ``eval()``."""
    import importlib

    family = FAMILIES[name]
    base = getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), name)
    forward = _norm_forward if name.endswith("RMSNorm") else _mlp_forward
    return type(f"Fused{name}", (base,), {"forward": forward, "__module__": __name__, "__qualname__": f"Fused{name}"})


def __getattr__(attribute: str) -> type:  # the Fused<name> classes, as pickle looks them up
    if attribute.startswith("Fused") and attribute[5:] in FAMILIES:
        return _routed(attribute[5:])
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


def _is_silu(activation: object) -> bool:
    """nn.SiLU, or transformers' own module for ``hidden_act: silu`` (``SiLUActivation``, F.silu)."""
    return isinstance(activation, nn.SiLU) or type(activation).__name__ == "SiLUActivation"


def use_fused_norm_mlp(model: nn.Module) -> None:
    """Route the RMSNorm and SiLU-gated MLP modules of ``model`` (the Llama family, also inside peft) to
    :func:`rms_norm` and :func:`swiglu` for float32 CPU tensors (each module's own forward otherwise), by
    giving each module a subclass of its class (see :func:`_routed`): kept by ``copy.deepcopy`` (the
    reference model, the critic's trunk) and pickling; nothing changes in what ``save_pretrained`` writes."""
    for module in model.modules():
        name = type(module).__name__
        if name not in FAMILIES or type(module) is not _routed(name).__mro__[1]:  # another class, or routed already
            continue
        norm = name.endswith("RMSNorm")
        if hasattr(module, "variance_epsilon") if norm else _is_silu(getattr(module, "act_fn", None)):
            module.__class__ = _routed(name)
