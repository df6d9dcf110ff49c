"""Choosing the next token from logits: pure functions over tensors."""

from __future__ import annotations

import torch

from posttrain.models import sample_tokens
from posttrain.models.cpu_probe import sampler_pays


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the smallest set whose probability reaches ``top_p``
    (nucleus sampling, Holtzman et al. 2020, arXiv:1904.09751)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    # Keep a token when the mass before it is below top_p (so the top token is always kept).
    drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


CDF_BLOCK = 512  # vocabulary entries per block of the two-level inverse-CDF search in sample_next


def sample_next(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return ``(tokens [B], logprobs [B])``.

    Sampling inverts each row's cumulative distribution at one uniform draw, in float64, so rounding
    cannot move mass between tokens; a token with probability 0 is never chosen. That takes one
    random number per row, where torch.multinomial or the Gumbel-max trick need work per vocabulary
    entry: 4 ms instead of 18 ms for 16 rows of a 49k vocabulary on CPU. The log-probability is under
    the temperature-scaled distribution (before top-p truncation), which is what the trainer recomputes.
    Without top-p, float32 logits on the CPU are drawn from on our kernel (:mod:`posttrain.models.sample_tokens`)
    where it measured faster; the same draw picks the same token there (but where rounding differs at the
    edge of two entries).
    """
    logits = logits.float()
    if temperature == 0:
        tokens = logits.argmax(-1)
        return tokens, torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    if top_p >= 1.0 and sample_tokens.supports(logits) and sampler_pays():
        uniform = torch.rand(logits.shape[0], generator=generator, dtype=torch.float64)  # sample_with_torch's draws
        return sample_tokens.draw(logits, temperature, uniform)
    return sample_with_torch(logits, temperature, top_p, generator)


def sample_with_torch(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_next` on PyTorch's operations, for float ``logits`` and ``temperature`` > 0, on any device.
    The distribution is cumulated in two levels: over blocks of :data:`CDF_BLOCK` entries, then within the
    block the draw falls in, instead of over the whole vocabulary, which took a float64 copy of it and a
    sequential cumulative sum (32 rows of a 49k vocabulary on a Zen 4 EPYC: 2.8 ms a draw, 4.5 before)."""
    logp = torch.log_softmax(logits if temperature == 1 else logits / temperature, dim=-1)
    rows, vocab = logp.shape
    blocks = -(-vocab // CDF_BLOCK)
    probs = top_p_filter(logp, top_p).exp()
    if vocab % CDF_BLOCK:  # the last block padded with probability 0
        probs = torch.cat([probs, probs.new_zeros(rows, blocks * CDF_BLOCK - vocab)], dim=-1)
    probs = probs.view(rows, blocks, CDF_BLOCK)
    block_cdf = probs.sum(-1, dtype=torch.float64).cumsum(-1)
    total = block_cdf[:, -1:]
    u = torch.rand((rows, 1), generator=generator, dtype=torch.float64, device=logits.device) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # below the total, rounding or not
    block = torch.searchsorted(block_cdf, u, right=True).clamp(max=blocks - 1)  # clamped for NaN logits
    before = torch.cat([torch.zeros_like(total), block_cdf], dim=-1).gather(-1, block)  # mass of the blocks before
    within = probs[torch.arange(rows, device=logits.device), block.squeeze(-1)].cumsum(-1, dtype=torch.float64)
    # the draw's place in its block, kept below the block's own sum (which rounds apart from block_cdf's
    # difference), so that it falls on an entry of positive probability
    rest = torch.minimum(u - before, torch.nextafter(within[:, -1:], torch.zeros_like(total)))
    tokens = (block * CDF_BLOCK + torch.searchsorted(within, rest, right=True)).squeeze(-1).clamp(max=vocab - 1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
