"""Choosing the next token from logits: pure functions over tensors."""

from __future__ import annotations

import torch


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


def sample_next(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return ``(tokens [B], logprobs [B])``.

    Sampling uses the exponential-race form of the Gumbel-max trick: argmax(p / E) with
    E ~ Exp(1) selects index i with probability p_i, and avoids torch.multinomial, which is
    several times slower over a 49k vocabulary on CPU. The log-probability is under the
    temperature-scaled distribution (before top-p truncation), which is what the trainer
    recomputes.
    """
    logits = logits.float()
    if temperature == 0:
        tokens = logits.argmax(-1)
        return tokens, torch.zeros(tokens.shape, dtype=torch.float32)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    filtered = top_p_filter(logp, top_p)
    noise = torch.empty_like(filtered).exponential_(generator=generator)
    tokens = (filtered.exp() / noise).argmax(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
