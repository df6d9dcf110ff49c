"""Batched generation with a Hugging Face model, token ids in and out, on the model's device.

Our own decode loop over the model's KV cache rather than ``model.generate``, for three reasons
that matter for RL on a CPU:
- it returns the sampled tokens' log-probabilities without keeping every step's logits;
- each prompt is prefilled once and its cache copied for its ``num_samples`` samples, and the
  start that a call's prompts share (a chat template's system turn) once for all of them;
- rows that finished (EOS or a stop string) leave the batch, so late decode steps only pay for
  the sequences still running;
- on CPU, the linear layers run on weights packed once per call for oneDNN (see
  :mod:`posttrain.models.packed_linear`), 2-3x faster than the plain weights at decode shapes;
- on CPU, Llama-family models prefill and decode with :mod:`posttrain.rollout.fast_decode` (fused
  projections, a static KV cache, little Python per token, our own matmul kernels where faster).
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext

import torch
from transformers import DynamicCache

from posttrain.models.cpu_probe import decode_dtype as resolve_decode_dtype
from posttrain.models.cpu_probe import has_bf16_units
from posttrain.models.onednn_linear import onednn_training
from posttrain.models.packed_linear import packed_linears
from posttrain.models.packing import common_start
from posttrain.rollout.backend import Generation, SamplingParams
from posttrain.rollout.fast_decode import DecodeWeights, StaticCache, decode_step, prefill, supports
from posttrain.rollout.sampling import sample_next


def cache_kwarg(model: torch.nn.Module) -> str:
    """The name this transformers version gives forward's KV-cache argument (5.x: ``cache``)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class HFBackend:
    """Generate with ``model`` (shared with the trainer, so it always has the latest weights)."""

    same_logprobs_as_trainer = True

    def __init__(self, model, tokenizer, batch_size: int = 64, seed: int = 0, pack_weights: bool = True,
                 fast_decode: bool = True, decode_dtype: str = "float32"):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.device = next(model.parameters()).device
        self.pack_weights = pack_weights and self.device.type == "cpu"  # oneDNN packing is a CPU path
        self.fast_decode = fast_decode and self.pack_weights and supports(model)
        # ``rollout.decode_dtype`` (float32, bfloat16, auto: by the CPU probe). bf16 decoding needs the
        # fast path; its log-probs are then not the trainer's (float32) own.
        self.decode_dtype = resolve_decode_dtype(decode_dtype) if self.fast_decode else torch.float32
        self.same_logprobs_as_trainer = self.decode_dtype == torch.float32
        self._weights: DecodeWeights | None = None  # of the current generate() call
        self.eos_ids = eos_token_ids(model, tokenizer)
        # Longest sequence the model has positions for (None: unbounded); the episode loop keeps within it.
        self.max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0])
        self.generator = torch.Generator(self.device).manual_seed(seed)
        self._cache_kwarg = cache_kwarg(getattr(model, "get_base_model", lambda: model)())

    def sync_weights(self) -> None:
        """Nothing to do: generation runs on the policy's own model, so it always has the latest weights."""

    def generate(self, prompts: list[list[int]], params: SamplingParams, num_samples: int = 1) -> list[Generation]:
        if num_samples > 1 and params.temperature == 0:
            raise ValueError("several samples of one prompt need temperature > 0")
        per_call = max(1, self.batch_size // num_samples)
        out: list[Generation] = []
        was_training = self.model.training
        self.model.eval()
        rows = min(len(prompts), per_call) * num_samples
        try:
            if self.fast_decode:  # the prefill is compute-bound: plain weights serve it as well as packed ones
                try:
                    self._weights = DecodeWeights(self.model, rows, self.decode_dtype)
                except ValueError:  # a layer the fused step does not know (e.g. an output bias): the generic loop
                    self.fast_decode, self.decode_dtype, self.same_logprobs_as_trainer = False, torch.float32, True
            with packed_linears(self.model, rows) if self.pack_weights and not self.fast_decode else nullcontext():
                for start in range(0, len(prompts), per_call):
                    out.extend(self._generate_chunk(prompts[start : start + per_call], params, num_samples))
        finally:
            self._weights = None  # packed copies of the weights are only valid for this call
            self.model.train(was_training)
        return out

    @torch.no_grad()
    def _generate_chunk(self, prompts: list[list[int]], params: SamplingParams, n: int) -> list[Generation]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("cannot generate from an empty prompt")
        shared = shared_prefix_length(prompts)
        ids, mask = left_padded([p[shared:] for p in prompts], self.pad_id)
        mask = torch.cat([torch.ones(len(prompts), shared, dtype=torch.long), mask], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        fast = self._weights
        rows = len(prompts) * n
        if fast is None:
            ids, mask, positions = ids.to(self.device), mask.to(self.device), positions.to(self.device)
            logits, cache = self._model_prefill(prompts[0][:shared], ids, mask, positions, n)
        else:
            cos, signed_sin = fast.rotary_tables(int(positions.max()) + 1 + params.max_new_tokens)
            cache = StaticCache(fast.layers, rows, fast.kv_heads, fast.head_dim,
                                mask.shape[1] + params.max_new_tokens, fast.cache_dtype)
            matmuls = fast.prefill_matmuls(rows)
            if matmuls is None:  # the model's own forward, its keys and values then moved into the decode cache
                logits, model_cache = self._model_prefill(prompts[0][:shared], ids, mask, positions, n)
                cache.write([layer.keys for layer in model_cache.layers],
                            [layer.values for layer in model_cache.layers], mask.repeat_interleave(n, 0))
            else:  # our own, straight into the decode cache
                if shared:  # the prompts' common start, prefilled once for all of them
                    start = torch.arange(shared).unsqueeze(0)
                    prefill(fast, cache, torch.tensor([prompts[0][:shared]]), torch.ones_like(start), cos[start],
                            signed_sin[start], matmuls, copies=rows)
                logits = prefill(fast, cache, ids, mask[:, shared:], cos[positions], signed_sin[positions], matmuls,
                                 copies=n)
        if n > 1:
            logits = logits.repeat_interleave(n, 0)
            mask = mask.repeat_interleave(n, 0)
            positions = positions.repeat_interleave(n, 0)

        tokens: list[list[int]] = [[] for _ in range(rows)]
        logps: list[list[float]] = [[] for _ in range(rows)]
        finish = ["length"] * rows
        active = torch.arange(rows, device=self.device)  # original row index of each row still in the batch
        next_pos = positions[:, -1] + 1
        eos = torch.tensor(self.eos_ids, device=self.device)
        for step in range(params.max_new_tokens):
            tok, lp = sample_next(logits, params.temperature, params.top_p, self.generator)
            done = torch.isin(tok, eos).tolist()  # host copies: one transfer each per step on a GPU
            for j, (row, t, l) in enumerate(zip(active.tolist(), tok.tolist(), lp.tolist())):
                tokens[row].append(t)
                logps[row].append(l)
                if done[j] or (params.stop and self._hit_stop(tokens[row], params.stop)):
                    done[j] = True
                    finish[row] = "stop"
            done = torch.tensor(done, device=self.device)
            if step == params.max_new_tokens - 1:
                break
            keep = ~done
            if not keep.any():
                break
            if not keep.all():
                idx = surviving_rows(done)
                if fast is not None:
                    cache.select(idx)
                else:
                    cache.batch_select_indices(idx)
                active, tok, mask, next_pos = active[idx], tok[idx], mask[idx], next_pos[idx]
            if fast is not None:
                logits = decode_step(fast, cache, tok, cos[next_pos], signed_sin[next_pos])
            else:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                logits = self.model(
                    input_ids=tok.unsqueeze(-1), attention_mask=mask, position_ids=next_pos.unsqueeze(-1),
                    use_cache=True, **{self._cache_kwarg: cache},
                ).logits[:, -1]
            next_pos = next_pos + 1
        return [Generation(tokens[r], logps[r], finish[r]) for r in range(rows)]  # type: ignore[arg-type]

    def _model_prefill(self, shared: list[int], ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                       n: int) -> tuple[torch.Tensor, DynamicCache]:
        """The model's own forward over the prompts: their ``shared`` start once for all of them, then
        the rest ``ids`` (left-padded; ``mask`` covers the start too). Returns each prompt's last logits
        and the cache, its rows repeated for ``n`` samples each."""
        cache = DynamicCache()
        with self._prefill_precision():
            if shared:
                self.model(input_ids=torch.tensor([shared], device=self.device), use_cache=True, logits_to_keep=1,
                           **{self._cache_kwarg: cache})
                cache.batch_repeat_interleave(len(ids))
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                                logits_to_keep=1, **{self._cache_kwarg: cache}).logits[:, -1]
        if n > 1:
            cache.batch_repeat_interleave(n)
        return logits, cache

    def _prefill_precision(self):
        """The context of the model's own forward over the prompts, where it prefills. It is
        compute-bound (a batch of 32 arithmetic prompts is as many tokens as their completions), so
        on CPU it runs as the training pass does: under bf16 autocast when decoding in bf16 on a CPU
        with bf16 units (2x faster matmuls; the keys and values are widened to float32 as they enter
        the decode cache), else in float32 on the matmul kernels the training pass uses (oneDNN where
        it measured faster)."""
        if not self.pack_weights:
            return nullcontext()
        if self.decode_dtype == torch.bfloat16 and has_bf16_units():
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return onednn_training(self.model)

    def _hit_stop(self, tokens: list[int], stop: tuple[str, ...]) -> bool:
        # Only the last few tokens can complete a stop string that was not there a step ago.
        longest = max(len(s) for s in stop)
        tail = self.tokenizer.decode(tokens[-(longest + 2) :], skip_special_tokens=False)
        return any(s in tail for s in stop)


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``prompts`` as token ids ``[len(prompts), longest]`` padded on the left with ``pad_id``, so that
    every row's next token goes at the same column, and their mask (1 at the prompts' tokens)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def surviving_rows(done: torch.Tensor) -> torch.Tensor:
    """The order of the rows that go on when rows ``done`` (bool ``[rows]``) leave the batch: each
    stays in its place, except the ones beyond the new height, which fill the places the finished
    rows leave. Removing rows then moves one row per finished row at most (the caches' copies are a
    decode step's memory traffic: moving every row behind the first finished one, as keeping the
    order does, cost 3% of a batch-32 sampling call)."""
    keep = ~done
    n = int(keep.sum())
    order = torch.arange(n, device=done.device)
    holes = done[:n].nonzero().squeeze(-1)
    order[holes] = keep[n:].nonzero().squeeze(-1) + n
    return order


SHARED_PREFIX_MIN_PROMPTS, SHARED_PREFIX_MIN_TOKENS = 3, 8


def shared_prefix_length(prompts: list[list[int]]) -> int:
    """How many leading tokens every prompt shares and is prefilled once for (a chat template's
    system turn, an agent's instructions), keeping at least one token of each prompt for its own
    prefill; 0 (no shared prefill) for fewer than 3 prompts or under 8 shared tokens, below which
    the extra forward call would save little (a judgement, not measured). 32 arithmetic prompts
    share 27 of their 38-40 tokens: the prefill then runs on 443 tokens instead of 1280."""
    n = common_start(prompts) if len(prompts) >= SHARED_PREFIX_MIN_PROMPTS else 0
    return n if n >= SHARED_PREFIX_MIN_TOKENS else 0


def eos_token_ids(model, tokenizer) -> list[int]:
    ids: set[int] = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    if not ids:
        raise ValueError("the tokenizer and model define no EOS token; generation could never stop")
    return sorted(ids)
