"""The training pass's matmuls on oneDNN instead of MKL, on CPUs where that is faster.

A training pass is mostly matmuls: ``x W^T`` in forward, ``dY W`` and ``dY^T x`` in backward, for
every linear layer and the LM head. PyTorch runs float32 matmuls on the CPU through MKL's sgemm,
which on AMD CPUs takes a generic code path: on an AMD EPYC (Zen 5, 2 cores) it reached 180-190
GFLOP/s at the shapes of a GRPO batch of SmolLM2-135M, where oneDNN's linear op (the one packed
decoding uses, here on the plain weights) reached 380-440 GFLOP/s for the forward and the input
gradient and 270-330 for the weight gradient. On Intel CPUs MKL is fast, so the path is chosen by
a measurement (:func:`posttrain.models.cpu_probe.onednn_training_speedup`) and used only where it wins.

The weight gradient ``dY^T x`` contracts over the rows, the leading dimension of both operands.
oneDNN's linear op reads its second operand in any layout (it reorders it, as it does a weight), so
``x`` is passed as the view ``x^T``, but its first operand must be contiguous: ``dY^T`` is copied, on
our transpose kernel (:mod:`posttrain.models.transpose`, into a buffer reused from layer to layer; PyTorch's
strided copy ran at 2.5-4 GB/s on a Zen 4 EPYC), while MKL's sgemm reads it in place. So a layer's weight
gradient takes whichever of the two measured faster at a pass's shapes
(:func:`posttrain.models.cpu_probe.onednn_weight_grad_speedup`). On that EPYC, in the pass of
``benchmarks/mfu.py``'s GRPO shape (the two in turns in one process), the layers' weight gradients took
1.345 s a step on either in a quiet hour and 1.71 against 1.83-2.13 (with the LM head's) in busy ones, where
MKL's products slowed most. Thin products (a LoRA adapter's ``B``, whose ``x`` is ``r`` wide) stay on MKL:
the copy would cost more than the product. The LM head's weight gradient stays on MKL everywhere
(:mod:`posttrain.models.logprobs`): its transposed gradient would be a second ``[rows, vocab]`` block.

The arithmetic is float32 in both libraries (oneDNN's default math mode); only the order of the
sums differs, as between any two matmul kernels. Under autocast, and for other dtypes or
devices, layers keep PyTorch's own path (bf16 matmuls already run on oneDNN there). Generation does not
come here: it packs its weights (:mod:`posttrain.models.packed_linear`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

from posttrain.models.transpose import transposed

_active: ContextVar[bool] = ContextVar("posttrain_onednn_training", default=False)


def matmul_nt(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b.T (+ bias)`` for 2-D float32 CPU tensors, on oneDNN (either operand may be a strided view)."""
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


# A weight gradient goes to oneDNN only where ``rows`` is at least this wide: its product costs ``width`` times
# the copy of ``grad`` (a LoRA adapter's B, 16 wide, stays on MKL).
MIN_ONEDNN_WIDTH = 128


def weight_grad(grad: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``grad.T @ rows`` (a linear layer's weight gradient) for 2-D float32 CPU tensors, on oneDNN or
    MKL, whichever measured faster at such products on this CPU (see the module docstring)."""
    from posttrain.models import cpu_probe

    if rows.shape[1] >= MIN_ONEDNN_WIDTH and cpu_probe.onednn_weight_grad_pays():
        return onednn_weight_grad(grad, rows)
    return torch.mm(grad.t(), rows)


def onednn_weight_grad(grad: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``grad.T @ rows`` on oneDNN: ``grad`` transposed by our kernel into its reused buffer, ``rows`` read as the
    view ``rows.T``."""
    return matmul_nt(transposed(grad, scratch=True), rows.t())


class OneDNNLinear(torch.autograd.Function):
    """``F.linear`` whose forward and backward matmuls run on oneDNN (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        rows = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(rows, weight)
        ctx.in_shape, ctx.has_bias = x.shape, bias is not None
        return matmul_nt(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out):
        rows, weight = ctx.saved_tensors
        grad = grad_out.reshape(-1, weight.shape[0])
        needs = ctx.needs_input_grad
        grad_x = matmul_nt(grad, weight.t()).view(ctx.in_shape) if needs[0] else None
        grad_weight = weight_grad(grad, rows) if needs[1] else None
        grad_bias = grad.sum(0) if ctx.has_bias and needs[2] else None
        return grad_x, grad_weight, grad_bias


def active() -> bool:
    """Whether the current pass routes float32 matmuls to oneDNN (inside :func:`onednn_training`)."""
    return _active.get()


def _eligible(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.dtype == weight.dtype == torch.float32 and x.device.type == "cpu" and x.numel() > 0
            and not torch.is_autocast_enabled("cpu"))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, on oneDNN when the pass is in :func:`onednn_training`."""
    if active() and _eligible(x, weight):
        return OneDNNLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


def _forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, module.weight, module.bias)


@contextmanager
def onednn_training(model: nn.Module, enabled: bool | None = None) -> Iterator[None]:
    """Within the block, the ``nn.Linear`` layers of ``model`` (peft's LoRA layers are made of them)
    compute with :class:`OneDNNLinear`, and :func:`active` is true, so the LM head's hand-written
    pass uses :func:`matmul_nt` too. ``enabled``: None where oneDNN measured faster, by a margin, on
    this CPU (:func:`~posttrain.models.cpu_probe.onednn_training_pays`), True wherever this torch has
    the op, False never. Layers already given a forward of their own (packed frozen layers) keep
    it; it calls :func:`linear` itself."""
    from posttrain.models import cpu_probe
    from posttrain.models.packed_linear import packing_available

    if enabled is None:
        enabled = cpu_probe.onednn_training_pays()
    if not enabled or active() or not packing_available():
        yield
        return
    patched = []
    for module in model.modules():
        if type(module) is nn.Linear and "forward" not in vars(module):
            module.forward = functools.partial(_forward, module)
            patched.append(module)
    token = _active.set(True)
    try:
        yield
    finally:
        _active.reset(token)
        for module in patched:
            del module.forward
