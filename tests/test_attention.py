"""On the CPU the policy's attention runs in float32 (bf16 attention's backward is 3-4x slower there):
float32 passes are unchanged, bf16 inputs are attended to in float32, and padding stays masked; a
packed training pass's attention on our own kernels computes what SDPA computes."""

import json

import pytest
import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from posttrain.config import ModelSection
from posttrain.models import attention as attention_module
from posttrain.models import load_model, load_tokenizer, token_logprobs, train_attention
from posttrain.models.attention import NAME, posttrain_sdpa, use_posttrain_attention
from posttrain.models.logprobs import policy_forward
from posttrain.models.policy import Policy


def padded_batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 49152, (3, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    return ids, mask


def test_policy_on_cpu_gives_the_same_logprobs_as_plain_sdpa(tmp_path):
    torch.manual_seed(0)
    plain = load_model("tiny-random").eval()
    ids, mask = padded_batch()
    expected, _ = token_logprobs(plain, ids, mask)
    left = mask.flip(-1)  # left padding, as generation's prefill has it: only a mask keeps it out
    expected_logits = plain(input_ids=ids, attention_mask=left).logits
    policy = Policy(plain, load_tokenizer("tiny-random"), ModelSection(name="tiny-random", device="cpu"))
    assert policy.model.config._attn_implementation == NAME
    got, _ = policy.logprobs(ids, mask)
    # our attention, RMSNorm and SwiGLU kernels (where they pay) sum in another order: equal up to rounding
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)
    logits = policy.model(input_ids=ids, attention_mask=left).logits
    assert torch.allclose(logits[left.bool()], expected_logits[left.bool()], atol=1e-5, rtol=0)
    # A saved checkpoint does not name our attention: any transformers loads it with its default.
    policy.save(tmp_path / "model")
    assert NAME not in json.dumps(json.loads((tmp_path / "model" / "config.json").read_text()))
    assert load_model(str(tmp_path / "model")).config._attn_implementation == "sdpa"


def test_bf16_inputs_are_attended_to_in_float32(tiny_model):
    attention = tiny_model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(2)
    heads, kv_heads, dim = (tiny_model.config.num_attention_heads, tiny_model.config.num_key_value_heads,
                            tiny_model.config.hidden_size // tiny_model.config.num_attention_heads)
    q = torch.randn(2, heads, 6, dim, generator=g).bfloat16().requires_grad_()
    k = torch.randn(2, kv_heads, 6, dim, generator=g).bfloat16().requires_grad_()
    v = torch.randn(2, kv_heads, 6, dim, generator=g).bfloat16().requires_grad_()
    out, _ = posttrain_sdpa(attention, q, k, v, None, scaling=dim**-0.5)
    wide, _ = sdpa_attention_forward(attention, q.float(), k.float(), v.float(), None, scaling=dim**-0.5)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, wide.bfloat16())
    out.float().sum().backward()  # gradients reach the bf16 inputs, in their dtype
    assert q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad.float()).all()


def test_masked_grouped_query_attention_matches_transformers_sdpa(tiny_model):
    """With a padding mask, key/value heads are read in place (no repeat_kv copy): same output, and
    gradients equal up to the order in which each key/value head sums its query heads."""
    attention = tiny_model.model.layers[0].self_attn
    assert attention.num_key_value_groups > 1  # tiny-random has grouped-query attention, as SmolLM2
    g = torch.Generator().manual_seed(3)
    heads, kv_heads = tiny_model.config.num_attention_heads, tiny_model.config.num_key_value_heads
    dim = tiny_model.config.hidden_size // heads
    inputs = [torch.randn(3, n, length, dim, generator=g) for n, length in ((heads, 5), (kv_heads, 9), (kv_heads, 9))]
    mask = torch.ones(3, 1, 5, 9, dtype=torch.bool).tril(4)
    mask[1, ..., :3] = False  # left padding
    outs, grads = [], []
    for fn in (posttrain_sdpa, sdpa_attention_forward):
        q, k, v = (x.clone().requires_grad_() for x in inputs)
        out, _ = fn(attention, q, k, v, mask, scaling=dim**-0.5, dropout=0.0)
        out.pow(2).sum().backward()
        outs.append(out)
        grads.append((q.grad, k.grad, v.grad))
    assert torch.equal(outs[0], outs[1])
    for ours, theirs in zip(*grads):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


needs_kernels = pytest.mark.skipif(train_attention.unavailable_reason() is not None,
                                   reason=f"no training attention kernels: {train_attention.unavailable_reason()}")


def _sdpa_and_ours(q, k, v, mask):
    """Outputs and input gradients of SDPA and of our kernels, for one upstream gradient."""
    results = []
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))
    for attend in (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                                          enable_gqa=True),
                   lambda: train_attention.attention(q, k, v, mask)):
        for t in (q, k, v):
            t.grad = None
        out = attend()
        out.backward(grad)
        results.append([out.detach(), q.grad, k.grad, v.grad])
    return results


@needs_kernels
@pytest.mark.parametrize("dim", [16, 40, 64])  # 40: a slice narrower than 32 floats
@pytest.mark.parametrize("length,keys,pattern", [(35, 35, "causal"), (70, 70, "causal"), (12, 30, "causal"),
                                                  (48, 83, "random"), (5, 7, "random"), (70, 105, "completion")])
def test_training_attention_kernels_match_sdpa_forward_and_backward(dim, length, keys, pattern):
    """Causal (also with more keys than queries, aligned at the first key as SDPA aligns them) and masked,
    with query heads in groups over shared key/value heads and more rows than one 64-row block. A
    completion's mask (a packed batch's: every prompt key, then its own tokens causally) puts rows that see
    few keys after rows that see many in one block, where a head's rows end and the next head's begin."""
    g = torch.Generator().manual_seed(length + dim)
    q = torch.randn(3, 6, length, dim, generator=g, requires_grad=True)
    k, v = (torch.randn(3, 2, keys, dim, generator=g, requires_grad=True) for _ in range(2))
    mask = None
    if pattern == "random":
        mask = torch.rand(3, 1, length, keys, generator=g) > 0.4
        mask[..., 0] = True  # every query sees a key (SDPA gives NaN where none is seen)
    elif pattern == "completion":
        query, key = torch.arange(length)[:, None], torch.arange(keys)[None, :]
        mask = ((key < keys - length) | (key - (keys - length) <= query)).expand(3, 1, length, keys)
    sdpa, ours = _sdpa_and_ours(q, k, v, mask)
    for a, b in zip(sdpa, ours):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


@needs_kernels
def test_a_query_that_sees_no_key_gets_zeros_and_passes_no_gradient():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 16, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 2, 9, 16, generator=g, requires_grad=True) for _ in range(2))
    mask = torch.ones(2, 1, 6, 9, dtype=torch.bool)
    mask[1, 0, 3] = False  # row 3 of the second sequence: padding, as a packed batch's
    out = train_attention.attention(q, k, v, mask)
    out.sum().backward()
    assert torch.equal(out[1, :, 3], torch.zeros(4, 16)) and torch.equal(q.grad[1, :, 3], torch.zeros(4, 16))
    assert all(torch.isfinite(t).all() for t in (out, q.grad, k.grad, v.grad))
    seen = train_attention.attention(q[:, :, :3], k, v, mask[:, :, :3])  # the other rows are unaffected
    assert torch.allclose(seen, out[:, :, :3])


def test_training_attention_says_what_is_wrong_with_a_mask():
    q, k = torch.randn(2, 4, 6, 16), torch.randn(2, 2, 9, 16)
    with pytest.raises(ValueError, match=r"bool mask of shape \[2, 1, 6, 9\]"):
        train_attention.attention(q, k, k, torch.ones(2, 6, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="do not fit"):
        train_attention.attention(q, k[:, :, :, :8], k)


def test_training_attention_kernels_build_wherever_they_can_run(buildable_kernels):
    """Not a silent fallback: on an x86-64 CPU with AVX2/FMA and a C compiler, a broken build fails here."""
    assert train_attention.unavailable_reason() is None


@needs_kernels
@pytest.mark.parametrize("shared_prompts", [True, False])
def test_packed_pass_on_our_kernels_equals_it_on_sdpa(tiny_model, monkeypatch, shared_prompts):
    """The training pass (log-probabilities and every weight's gradient) is the same on either attention."""
    ids = torch.randint(0, 49152, (4, 12), generator=torch.Generator().manual_seed(3))
    ids[1] = ids[0]
    ids[1, 8:] = 7  # rows 0 and 1 share their first 5 tokens
    mask = torch.ones_like(ids)
    mask[2, 9:] = 0
    prompts = torch.tensor([5, 5, 4, 6]) if shared_prompts else None
    model = load_model("tiny-random")
    use_posttrain_attention(model)
    runs = []
    for ours in (False, True):
        monkeypatch.setattr(attention_module, "train_attention_pays", lambda ours=ours: ours)
        model.zero_grad()
        out = policy_forward(model, ids, mask, prompt_lengths=prompts)
        out.logprobs.sum().backward()
        runs.append([out.logprobs.detach()] + [p.grad.clone() for p in model.parameters()])
    for a, b in zip(*runs):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
