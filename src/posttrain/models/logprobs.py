"""Per-token log-probabilities and entropy without materialising the full logits tensor.

With a 49k vocabulary, ``[batch, seq, vocab]`` fp32 logits for 16 x 128 tokens are 400 MB, and
autograd would keep them (and their softmax) alive until backward. Instead we run the trunk
once, select only the positions the caller needs (the completion tokens), and push them through
the LM head ``chunk_size`` rows at a time. Autograd never holds the logits: a chunk keeps its
probabilities for backward while they fit in ``KEEP_PROBS_BYTES``, and beyond that only its input
rows, from which backward recomputes its logits (see :class:`_HeadLogprobs`).

The trunk runs the whole batch as one call on one packed sequence (:mod:`posttrain.models.packing`):
no padding between sequences of different lengths, and when the caller passes ``prompt_lengths``,
rows that share a prompt (the G samples of one GRPO group) run that prompt once, the completions
attending to its one copy. The result is the same as a separate forward of every row.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from posttrain.models import cpu_probe, train_elementwise
from posttrain.models.attention import NAME as ATTENTION_NAME
from posttrain.models.onednn_linear import active as onednn_active
from posttrain.models.onednn_linear import matmul_nt
from posttrain.models.packing import pack


class _HeadLogprobs(torch.autograd.Function):
    """log p(target) and the entropy of softmax(hidden @ weight.T + bias), for one chunk of rows.

    Backward applies the softmax gradients directly: d log p_t / dz = onehot(t) - p and
    dH / dz = -p * (log p + H). With ``keep_probs`` the chunk's probabilities are kept for it
    (and backward turns them into the gradient in place, so autograd refuses a second backward
    through them); otherwise only ``hidden`` and the per-row log-normaliser are, and backward
    recomputes the logits with one matmul. (Activation checkpointing would keep as little, but
    would also re-run the forward's logsumexp and entropy before differentiating them.)

    Each ``[rows, vocab]`` tensor is a fresh block of 25-100 MB, which the C allocator maps from
    the kernel page by page on first touch (one fault per 4 KB page): filling one costs more than
    the arithmetic on it. So forward turns the logits into probabilities in place
    (:func:`_softmax_statistics`: on the CPU one kernel, a row at a time through the cache), and
    backward turns those into the gradient in place.

    Under autocast the logits stay float32 (see :func:`_head_logits`), but backward's two matmuls (the
    gradients of the hidden rows and of the weight) run in the autocast dtype, as autocast runs every
    other layer's: the gradients tolerate bf16's rounding, which the log-probabilities do not.
    """

    @staticmethod
    def forward(ctx, hidden, targets, weight, bias, entropy_grad, keep_probs):
        # Inside onednn_training the head's three matmuls run on oneDNN too (decided here, as
        # backward runs after the block has been left).
        ctx.onednn = onednn_active() and weight.dtype == torch.float32 and weight.device.type == "cpu"
        device = weight.device.type
        ctx.grad_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
        probs, logp, entropy, lse = _softmax_statistics(_head_logits(hidden, weight, bias, ctx.onednn), targets)
        ctx.keep_probs = keep_probs and not entropy_grad
        ctx.save_for_backward(hidden, targets, weight, bias, lse, entropy, probs if ctx.keep_probs else None)
        ctx.entropy_grad = entropy_grad
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, targets, weight, bias, lse, entropy, probs = ctx.saved_tensors
        if not ctx.keep_probs:
            log_probs = _head_logits(hidden, weight, bias, ctx.onednn).sub_(lse.unsqueeze(-1))
            probs = log_probs.exp()
        if ctx.entropy_grad and grad_entropy is not None:  # then probs were recomputed, log_probs too
            entropy_term = log_probs.add_(entropy.unsqueeze(-1)).mul_(probs).mul_(grad_entropy.unsqueeze(-1))
            grad = probs.mul_(-grad_logp.unsqueeze(-1)).sub_(entropy_term)
        else:
            grad = probs.mul_(-grad_logp.unsqueeze(-1))
        grad.scatter_add_(-1, targets.unsqueeze(-1), grad_logp.unsqueeze(-1))
        needs = ctx.needs_input_grad
        grad_bias = grad.sum(0) if bias is not None and needs[3] else None
        with torch.autocast(hidden.device.type, enabled=False):
            low = ctx.grad_dtype
            grad, rows, w = grad.to(low), hidden.to(low), weight.to(low)
            if ctx.onednn and low == torch.float32:
                grad_hidden = matmul_nt(grad, w.t()) if needs[0] else None
            else:
                grad_hidden = grad @ w if needs[0] else None
            # The weight gradient on MKL, which reads grad.T in place: on oneDNN it needs grad transposed, a
            # second [rows, vocab] block (100 MB for 512 rows of a 49k vocabulary) for 7% on a Zen 4 EPYC.
            grad_weight = grad.T @ rows if needs[2] else None
        grad_hidden = grad_hidden.to(hidden.dtype) if grad_hidden is not None else None
        grad_weight = grad_weight.to(weight.dtype) if grad_weight is not None else None
        return grad_hidden, None, grad_weight, grad_bias, None, None


def _softmax_statistics(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """softmax(logits) (in place of ``logits``, float32 ``[rows, vocab]``) and each row's log-probability of its
    target, entropy and log-normaliser: in one kernel where it runs (float32 on the CPU, and measured faster
    here: :func:`posttrain.models.train_elementwise.softmax_statistics`), else with PyTorch's operations."""
    if train_elementwise.supports(logits) and cpu_probe.train_elementwise_pays():
        return logits, *train_elementwise.softmax_statistics(logits, targets)
    return torch_softmax_statistics(logits, targets)


def torch_softmax_statistics(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """:func:`_softmax_statistics` in PyTorch's operations, which work on any device and dtype: the logits
    become ``z - max z`` in place, their softmax a new tensor."""
    peak = logits.amax(-1, keepdim=True)
    shifted = logits.sub_(peak)  # z - max z: exp cannot overflow
    probs = shifted.exp()  # unnormalised
    total = probs.sum(-1)
    log_total = total.log()
    # H = -sum p log p = log total - sum p (z - max z), with p = exp(z - max z) / total; the sum as a
    # batched matmul (in float32 even under autocast): no [rows, vocab] product tensor
    with torch.autocast(logits.device.type, enabled=False):
        weighted = torch.bmm(probs.unsqueeze(1), shifted.unsqueeze(2)).view(-1)
    entropy = log_total - weighted / total
    logp = shifted.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_total
    return probs.div_(total.unsqueeze(-1)), logp, entropy, peak.squeeze(-1) + log_total


def _head_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 onednn: bool = False) -> torch.Tensor:
    """Logits as float32, the matmul in the head's own dtype even under autocast: log-probabilities
    over a large vocabulary lose too much when the head runs in bfloat16."""
    with torch.autocast(hidden.device.type, enabled=False):
        if onednn:
            return matmul_nt(hidden.to(weight.dtype), weight, bias)
        return F.linear(hidden.to(weight.dtype), weight, bias).float()


# Up to this many bytes of probabilities ([rows, vocab] float32) are kept for the LM head's
# backward instead of recomputing its logits (one matmul of the head's size per chunk): 512 MB is
# about 2700 tokens of a 49k vocabulary, a typical CPU batch; longer batches recompute.
KEEP_PROBS_BYTES = 512 * 2**20

class TokenOutputs(NamedTuple):
    """Per-token outputs of one forward pass, each ``[B, T]`` float32 and 0 where not requested."""

    logprobs: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor | None


def predictor_states(
    decoder: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor | None = None,
    prompt_lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The trunk's hidden states that predict the requested tokens: ``(rows [N, H], want [B, T])``.

    Row k is the state at position t - 1 for the k-th True entry (row-major) of ``want``, the
    requested positions t. It summarises the prefix before token t, so it feeds both the LM head
    (log p of token t) and a value head (V of the state in which token t was chosen). On the
    policy's attention (:func:`posttrain.models.attention.posttrain_sdpa`) the batch runs as one
    packed sequence, rows with equal prompts sharing one copy of it (:mod:`posttrain.models.packing`).
    """
    want = torch.zeros_like(input_ids, dtype=torch.bool)
    want[:, 1:] = attention_mask[:, 1:].bool()
    if positions is not None:
        want &= positions.bool()
    counts = attention_mask.sum(-1)
    lengths = counts.tolist()
    if getattr(decoder.config, "_attn_implementation", None) != ATTENTION_NAME or not max(lengths, default=0):
        # Another attention implementation cannot attend per segment: one padded call, nothing shared.
        width = max(max(lengths, default=0), 1)
        hidden = decoder(input_ids=input_ids[:, :width], attention_mask=attention_mask[:, :width]).last_hidden_state
        return hidden[:, : width - 1][want[:, 1:width]], want
    if not torch.equal(attention_mask.bool(), torch.arange(attention_mask.shape[1], device=attention_mask.device)
                       < counts.unsqueeze(-1)):
        raise ValueError("attention_mask must be right-padded: each row's tokens first, then only padding")
    rows = [row[:n] for row, n in zip(input_ids.tolist(), lengths)]  # one transfer from a GPU
    packed = pack(rows, prompt_lengths.tolist() if prompt_lengths is not None else None).to(input_ids.device)
    hidden = decoder(input_ids=packed.ids, attention_mask=torch.ones_like(packed.ids), position_ids=packed.positions,
                     packed=packed, use_cache=False).last_hidden_state[0]
    # The state at t - 1 predicts the token at t.
    return hidden.index_select(0, packed.source[:, : want.shape[1] - 1][want[:, 1 : packed.source.shape[1] + 1]]), want


def _scatter(want: torch.Tensor, pieces: list[torch.Tensor]) -> torch.Tensor:
    out = torch.zeros(want.shape, dtype=torch.float32, device=want.device)
    return out.masked_scatter(want, torch.cat(pieces).float()) if pieces else out


def policy_forward(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor | None = None,
    chunk_size: int = 512,
    prompt_lengths: torch.Tensor | None = None,
    value_head: torch.nn.Module | None = None,
    entropy_grad: bool = False,
) -> TokenOutputs:
    """Log-probabilities, entropy and (with ``value_head`` on the same trunk) values per token.

    See :func:`token_logprobs` for the arguments; ``entropy_grad`` keeps the entropy in the graph
    (for an entropy bonus), otherwise it is a detached diagnostic.
    """
    rows, want = predictor_states(model.get_decoder(), input_ids, attention_mask, positions, prompt_lengths)
    head = model.get_output_embeddings()
    targets = input_ids[want]
    keep_probs = rows.shape[0] * head.weight.shape[0] * 4 <= KEEP_PROBS_BYTES
    pieces_lp, pieces_ent = [], []
    for start in range(0, rows.shape[0], chunk_size):
        h, y = rows[start : start + chunk_size], targets[start : start + chunk_size]
        lp, ent = _HeadLogprobs.apply(h, y, head.weight, head.bias, entropy_grad, keep_probs)
        pieces_lp.append(lp)
        pieces_ent.append(ent)
    values = _scatter(want, [value_head(rows).squeeze(-1)]) if value_head is not None else None
    return TokenOutputs(_scatter(want, pieces_lp), _scatter(want, pieces_ent), values)


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor | None = None,
    chunk_size: int = 512,
    prompt_lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log p(input_ids[:, t] | input_ids[:, :t]) and the policy entropy at each position t.

    Args:
        model: a causal LM with ``get_decoder()`` and ``get_output_embeddings()`` (every HF
            decoder-only model, also when wrapped by peft).
        input_ids, attention_mask: ``[B, T]``, right-padded.
        positions: optional ``[B, T]`` 0/1 mask of the positions whose values are needed
            (t >= 1); others are returned as 0 and cost nothing in the LM head.
        chunk_size: rows of ``[chunk, vocab]`` logits alive at a time.
        prompt_lengths: optional ``[B]``; row i's first ``prompt_lengths[i]`` tokens are its
            prompt, and rows with equal prompts share one prompt forward.

    Returns:
        ``(logprobs, entropy)``, both ``[B, T]`` float32; position 0 is always 0.
    """
    out = policy_forward(model, input_ids, attention_mask, positions, chunk_size, prompt_lengths)
    return out.logprobs, out.entropy
