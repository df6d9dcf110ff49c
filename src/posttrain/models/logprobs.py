"""Per-token log-probabilities and entropy without materialising the full logits tensor.

With a 49k vocabulary, ``[batch, seq, vocab]`` fp32 logits for 16 x 128 tokens are 400 MB, and
autograd would keep them (and their softmax) alive until backward. Instead we run the trunk
once, select only the positions the caller needs (the completion tokens), and push them through
the LM head ``chunk_size`` rows at a time. Each chunk runs under activation checkpointing, so
in backward its logits are recomputed one chunk at a time rather than stored.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _chunk_logprobs(
    hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = F.linear(hidden, weight, bias).float()
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    with torch.no_grad():  # entropy is a diagnostic; no gradient flows through it
        log_probs = logits.detach() - lse.detach().unsqueeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor | None = None,
    chunk_size: int = 512,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log p(input_ids[:, t] | input_ids[:, :t]) and the policy entropy at each position t.

    Args:
        model: a causal LM with ``get_decoder()`` and ``get_output_embeddings()`` (every HF
            decoder-only model, also when wrapped by peft).
        input_ids, attention_mask: ``[B, T]``, right-padded.
        positions: optional ``[B, T]`` 0/1 mask of the positions whose values are needed
            (t >= 1); others are returned as 0 and cost nothing in the LM head.
        chunk_size: rows of ``[chunk, vocab]`` logits alive at a time.

    Returns:
        ``(logprobs, entropy)``, both ``[B, T]`` float32; position 0 is always 0.
    """
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    head = model.get_output_embeddings()
    want = torch.zeros_like(input_ids, dtype=torch.bool)
    want[:, 1:] = attention_mask[:, 1:].bool()
    if positions is not None:
        want &= positions.bool()
    # The hidden state at t-1 predicts the token at t.
    rows = hidden[:, :-1][want[:, 1:]]
    targets = input_ids[want]
    pieces_lp, pieces_ent = [], []
    for start in range(0, rows.shape[0], chunk_size):
        h, y = rows[start : start + chunk_size], targets[start : start + chunk_size]
        if torch.is_grad_enabled() and h.requires_grad:
            lp, ent = checkpoint(_chunk_logprobs, h, y, head.weight, head.bias, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(h, y, head.weight, head.bias)
        pieces_lp.append(lp)
        pieces_ent.append(ent)
    logprobs = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    entropy = torch.zeros_like(logprobs)
    if pieces_lp:
        logprobs = logprobs.masked_scatter(want, torch.cat(pieces_lp))
        entropy = entropy.masked_scatter(want, torch.cat(pieces_ent))
    return logprobs, entropy
