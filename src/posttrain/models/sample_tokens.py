"""Drawing each row's next token on our kernel (``sample_tokens.c``): softmax, inverse-CDF draw and
log-probability in two passes over the logits.

:func:`posttrain.rollout.sampling.sample_next` does the same with PyTorch's operations, each a pass over
the ``[rows, vocab]`` logits (log-softmax's three, the exponential, the block sums, the search's
copies): 2.8 ms for 32 rows of the default model's 49k vocabulary on a Zen 4 EPYC (2 threads), several
percent of a decode step. The kernel reads a row twice (its maximum, then its weights, summed block by
block) and recomputes one block's weights to find the token. The same uniform draw gives the same
token as the PyTorch path but where rounding differs at the very edge of two entries; the log-probability
agrees to float32 rounding. Used where :func:`posttrain.models.cpu_probe.sampler_pays` measured it faster.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from posttrain.models import native

SOURCE = Path(__file__).with_name("sample_tokens.c")
BLOCK = 512  # the kernel's block of vocabulary entries (its BLOCK)

_P, _SIZE = ctypes.c_void_p, ctypes.c_int64
_KERNELS = native.Kernels(SOURCE, "token sampling kernel", {
    "sample_tokens": [_P, _SIZE, _SIZE, ctypes.c_float, _P, _P, _P, _P, ctypes.c_int]})
unavailable_reason = _KERNELS.unavailable_reason


def supports(logits: torch.Tensor) -> bool:
    """True when the kernel is built here and ``logits`` are 2-D float32 on the CPU."""
    return (logits.dim() == 2 and logits.dtype == torch.float32 and logits.device.type == "cpu"
            and unavailable_reason() is None)


def draw(logits: torch.Tensor, temperature: float, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``[rows]`` drawn from softmax(``logits`` / ``temperature``) by inverting each row's CDF at
    ``uniform`` ``[rows]`` (float64 in [0, 1)), and their log-probabilities ``[rows]``. ``temperature`` > 0;
    rows whose logits hold NaN or +inf (or only -inf) get the last token and a NaN log-probability."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 to sample, got {temperature}")
    logits = logits.contiguous()
    rows, vocab = logits.shape
    uniform = uniform.to(torch.float64).contiguous()
    if uniform.shape != (rows,):
        raise ValueError(f"expected one uniform draw per row ({rows}), got {list(uniform.shape)}")
    cdf = torch.empty(rows, -(-vocab // BLOCK), dtype=torch.float64)
    tokens, logp = torch.empty(rows, dtype=torch.int64), torch.empty(rows)
    _KERNELS.loaded().sample_tokens(logits.data_ptr(), rows, vocab, temperature, uniform.data_ptr(), cdf.data_ptr(),
                                    tokens.data_ptr(), logp.data_ptr(), torch.get_num_threads())
    return tokens, logp
