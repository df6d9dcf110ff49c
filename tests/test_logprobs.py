import pytest
import torch

from posttrain.models import token_logprobs


def reference_logprobs(model, ids, mask):
    logits = model(input_ids=ids, attention_mask=mask).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1)
    out = torch.zeros(ids.shape)
    out[:, 1:] = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = torch.zeros(ids.shape)
    ent[:, 1:] = -(logp.exp() * logp).sum(-1)
    return out * mask, ent * mask


def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 49152, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 5:] = 0
    return ids, mask


def test_chunked_logprobs_match_full_logits(tiny_model):
    ids, mask = batch()
    ref_lp, ref_ent = reference_logprobs(tiny_model, ids, mask)
    for chunk in (1, 7, 512):
        lp, ent = token_logprobs(tiny_model, ids, mask, chunk_size=chunk)
        assert torch.allclose(lp, ref_lp, atol=1e-5)
        assert torch.allclose(ent, ref_ent, atol=1e-4)
        assert lp[:, 0].abs().max() == 0


def test_positions_select_only_requested_tokens(tiny_model):
    ids, mask = batch()
    positions = torch.zeros_like(ids)
    positions[:, 3:] = 1
    lp, _ = token_logprobs(tiny_model, ids, mask, positions=positions, chunk_size=4)
    ref_lp, _ = reference_logprobs(tiny_model, ids, mask)
    assert torch.allclose(lp, ref_lp * positions, atol=1e-5)


@pytest.mark.parametrize("keep_probs_bytes", [0, 2**40], ids=["recompute-logits", "keep-probs"])
def test_chunked_gradient_matches_full(tiny_model, monkeypatch, keep_probs_bytes):
    import posttrain.models.logprobs as logprobs

    monkeypatch.setattr(logprobs, "KEEP_PROBS_BYTES", keep_probs_bytes)
    ids, mask = batch()
    params = [p for p in tiny_model.parameters()]
    tiny_model.zero_grad()
    reference_logprobs(tiny_model, ids, mask)[0].sum().backward()
    ref_grads = [p.grad.clone() for p in params]
    tiny_model.zero_grad()
    token_logprobs(tiny_model, ids, mask, chunk_size=5)[0].sum().backward()
    for p, g in zip(params, ref_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=5e-5)  # fp32 sums in another order
    tiny_model.zero_grad()


def grouped_batch(shared_start: int = 0):
    """Two prompts of different lengths, three right-padded completions each; the prompts begin with the
    same ``shared_start`` tokens (a chat template's system turn)."""
    g = torch.Generator().manual_seed(1)
    start = torch.randint(0, 49152, (shared_start,), generator=g)
    prompts = [torch.cat([start, torch.randint(0, 49152, (n,), generator=g)]) for n in (5, 8)]
    rows, plens = [], []
    for p in prompts:
        for n in (4, 1, 6):
            rows.append(torch.cat([p, torch.randint(0, 49152, (n,), generator=g)]))
            plens.append(len(p))
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    completion = torch.zeros_like(ids)
    for i, (r, p) in enumerate(zip(rows, plens)):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
        completion[i, p : len(r)] = 1
    return ids, mask, completion, torch.tensor(plens)


def test_entropy_gradient_matches_full_logits(tiny_model):
    """An entropy bonus trains through the chunked head: its gradient equals autograd's on full logits."""
    from posttrain.models.logprobs import policy_forward

    ids, mask = batch()
    weights = torch.linspace(-1, 1, ids.numel()).reshape(ids.shape)  # any mix of both terms
    tiny_model.zero_grad()
    lp, ent = reference_logprobs(tiny_model, ids, mask)
    ((lp + ent) * weights).sum().backward()
    ref_grads = [p.grad.clone() for p in tiny_model.parameters()]
    tiny_model.zero_grad()
    out = policy_forward(tiny_model, ids, mask, chunk_size=5, entropy_grad=True)
    ((out.logprobs + out.entropy) * weights).sum().backward()
    for p, g in zip(tiny_model.parameters(), ref_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=5e-5)
    tiny_model.zero_grad()
    # As a diagnostic the entropy carries no gradient.
    assert not policy_forward(tiny_model, ids, mask).entropy.requires_grad


def test_packing_shares_each_prompt_once_and_keeps_every_token_where_its_row_says():
    from posttrain.models.packing import pack

    p, q = [7, 8, 9], [5, 6]
    rows = [p + [1, 2], p + [3], q + [4, 4, 4], p + [], q + [2], []]
    packed = pack(rows, [3, 3, 2, 3, 2, 0])
    flat = packed.ids[0].tolist()
    assert len(flat) == 3 + 2 + 1 + 2 + 3 + 1 and flat.count(7) == 1 and flat.count(5) == 1  # no padding
    for i, row in enumerate(rows):
        assert [flat[j] for j in packed.source[i, : len(row)]] == row
        assert (packed.source[i, len(row) :] == -1).all()
        # Positions continue from the prompt into the completion, as in the row's own forward.
        assert packed.positions[0, packed.source[i, : len(row)]].tolist() == list(range(len(row)))
    # A completion sees its prompt (not another prompt's padding) and its own earlier tokens only.
    first_q = packed.owner.tolist().index(1)  # the first completion of q, which is shorter than p
    assert packed.completion_mask[first_q, 0, 0].tolist() == [True, True, False, True, False, False]
    assert packed.start.shape == (1, 0) and packed.prompt_mask is None  # under 8 tokens in common: none shared
    with pytest.raises(ValueError, match="prompt length"):
        pack([[1, 2]], [3])


def test_packing_shares_the_start_every_prompt_has_in_common_once():
    """Prompts that begin alike (a system turn) share one copy of that start; each row still reads its own
    tokens, at its own positions, and each token sees exactly what it would in its row's own forward."""
    from posttrain.models.packing import SHARED_START_MIN_TOKENS, pack

    system = list(range(100, 100 + SHARED_START_MIN_TOKENS + 2))
    p, q = system + [7, 8], system + [5]
    rows = [p + [1, 2], p + [3], q + [4, 4, 4], q + [2]]
    packed = pack(rows, [len(p), len(p), len(q), len(q)])
    flat = packed.ids[0].tolist()
    assert len(flat) == len(system) + 2 + 2 + 1 + 1 + 3 + 1 and flat.count(100) == 1
    assert packed.start.tolist() == [list(range(len(system)))]
    for i, row in enumerate(rows):
        assert [flat[j] for j in packed.source[i, : len(row)]] == row
        assert packed.positions[0, packed.source[i, : len(row)]].tolist() == list(range(len(row)))
    # Every token's keys, as packed indices: the tokens before it in its row, and itself.
    def seen(keys, mask):
        return sorted(k for k, visible in zip(keys.tolist(), mask.tolist()) if visible)

    for u, prompt in enumerate(packed.prompts.tolist()):
        for j, at in enumerate(prompt[: (len(p), len(q))[u] - len(system)]):
            row = packed.source[(0, 2)[u]].tolist()
            assert seen(packed.prompt_keys[u], packed.prompt_mask[u, 0, j]) == row[: row.index(at) + 1]
    for m, completion in enumerate(packed.completions.tolist()):
        row = packed.source[m].tolist()
        for j, at in enumerate(completion[: len(rows[m]) - (len(p), len(p), len(q), len(q))[m]]):
            assert seen(packed.completion_keys[m], packed.completion_mask[m, 0, j]) == row[: row.index(at) + 1]
    # Too short a common start, or a single prompt, shares nothing beyond the prompt itself.
    assert pack([system[:7] + [1, 2], system[:7] + [3, 4]], [9, 9]).start.shape == (1, 0)
    assert pack([p + [1], p + [2]], [len(p), len(p)]).start.shape == (1, 0)


@pytest.mark.parametrize("shared_start", [0, 9])
def test_packed_forward_equals_separate_forwards(tiny_model, shared_start):
    """On the policy's attention a batch runs as one packed sequence, each prompt once (and the start the
    prompts share once); values and gradients equal those of a plain padded forward of every row."""
    import copy

    from posttrain.models.attention import use_posttrain_attention

    ids, mask, completion, plens = grouped_batch(shared_start)
    packed_model = copy.deepcopy(tiny_model)
    use_posttrain_attention(packed_model)
    results = []
    for model, prompt_lengths in ((tiny_model, None), (packed_model, None), (packed_model, plens)):
        model.zero_grad()
        lp, ent = token_logprobs(model, ids, mask, positions=completion, prompt_lengths=prompt_lengths)
        lp.sum().backward()
        results.append((lp, ent, [p.grad.clone() for p in model.parameters()]))
    tiny_model.zero_grad()
    plain = results[0]
    for lp, ent, grads in results[1:]:
        assert torch.allclose(lp, plain[0], atol=1e-5) and torch.allclose(ent, plain[1], atol=1e-4)
        for g, g_ref in zip(grads, plain[2]):
            torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=5e-5)


@pytest.mark.parametrize("shared_start", [0, 9])
def test_packed_pass_scores_prompt_tokens_too_and_rejects_left_padding(tiny_model, shared_start):
    """Rows sharing a prompt give every position, prompt tokens included, the log-probability of a
    plain forward; a left-padded batch is refused with a message rather than read wrongly."""
    import copy

    from posttrain.models.attention import use_posttrain_attention

    ids, mask, _, plens = grouped_batch(shared_start)
    packed_model = copy.deepcopy(tiny_model)
    use_posttrain_attention(packed_model)
    with torch.no_grad():
        plain, _ = token_logprobs(tiny_model, ids, mask)
        shared, _ = token_logprobs(packed_model, ids, mask, prompt_lengths=plens)
    assert torch.allclose(shared, plain, atol=1e-5) and (shared[:, 1:4] != 0).all()
    left = torch.zeros_like(mask)
    left[:, 1:] = mask[:, :-1]
    with pytest.raises(ValueError, match="right-padded"):
        token_logprobs(packed_model, ids, left)


def test_bf16_autocast_trains_with_float32_head_and_gradients(tiny_model):
    from posttrain.config import ModelSection
    from posttrain.models import Policy, load_tokenizer

    ids, mask = batch()
    policy = Policy(tiny_model, load_tokenizer("tiny-random"), ModelSection(name="tiny-random", autocast="bfloat16"))
    ref_lp, _ = reference_logprobs(tiny_model, ids, mask)
    tiny_model.zero_grad()
    out = policy.forward(ids, mask)
    assert out.logprobs.dtype == torch.float32
    assert torch.allclose(out.logprobs, ref_lp, atol=0.1)  # bf16 trunk, fp32 head
    out.logprobs.sum().backward()
    grads = [p.grad for p in tiny_model.parameters()]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
    tiny_model.zero_grad()


def test_lm_head_backward_under_autocast_stays_close_to_float32():
    """Under bf16 autocast the head's logits stay float32 (exact log-probs) and only its backward matmuls
    round to bf16: the gradients stay within bf16's rounding of the float32 ones."""
    from posttrain.models.logprobs import _HeadLogprobs

    g = torch.Generator().manual_seed(4)
    hidden0, weight0 = torch.randn(40, 64, generator=g), torch.randn(500, 64, generator=g) * 0.2
    targets = torch.randint(0, 500, (40,), generator=g)
    runs = []
    for autocast in (False, True):
        hidden, weight = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logp, _ = _HeadLogprobs.apply(hidden, targets, weight, None, False, True)
        logp.sum().backward()
        runs.append((logp, hidden.grad, weight.grad))
    (lp32, gh32, gw32), (lp16, gh16, gw16) = runs
    assert torch.equal(lp16, lp32)  # the forward does not autocast
    assert gh16.dtype == gw16.dtype == torch.float32
    for low, exact in ((gh16, gh32), (gw16, gw32)):
        assert (low - exact).norm() / exact.norm() < 1e-2
