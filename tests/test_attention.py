"""On the CPU the policy's attention runs in float32 (bf16 attention's backward is 3-4x slower there):
float32 passes are unchanged, bf16 inputs are attended to in float32, and padding stays masked."""

import json

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from posttrain.config import ModelSection
from posttrain.models import load_model, load_tokenizer, token_logprobs
from posttrain.models.attention import NAME, posttrain_sdpa
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
    assert torch.equal(got, expected)
    logits = policy.model(input_ids=ids, attention_mask=left).logits
    assert torch.equal(logits[left.bool()], expected_logits[left.bool()])
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
