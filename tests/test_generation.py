import pytest
import torch

from posttrain.models import token_logprobs
from posttrain.models.decode_kernels import FP32_KERNELS
from posttrain.rollout import HFBackend, SamplingParams, encode_prompt

PROMPTS = ["What is 2 + 3?", "Hello there, who are you?", "List three colours"]


def prompt_ids(tokenizer):
    return [encode_prompt(tokenizer, p) for p in PROMPTS]


def test_greedy_matches_hf_generate(tiny_model, tokenizer):
    backend = HFBackend(tiny_model, tokenizer)
    params = SamplingParams(temperature=0, max_new_tokens=12)
    ours = backend.generate(prompt_ids(tokenizer), params)
    for ids, gen in zip(prompt_ids(tokenizer), ours):
        ref = tiny_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                  max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        assert gen.token_ids == ref[0, len(ids):].tolist()
        assert gen.finish_reason == ("length" if len(gen.token_ids) == 12 else "stop")


def test_samples_are_grouped_and_logprobs_match_training_forward(tiny_model, tokenizer):
    backend = HFBackend(tiny_model, tokenizer, seed=3)
    prompts = prompt_ids(tokenizer)
    gens = backend.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=10), num_samples=4)
    assert len(gens) == 12
    for k, gen in enumerate(gens):
        prompt = prompts[k // 4]
        ids = torch.tensor([prompt + gen.token_ids])
        lp, _ = token_logprobs(tiny_model, ids, torch.ones_like(ids))
        # The sampler's log-probabilities equal what the trainer recomputes for the same tokens.
        assert torch.allclose(lp[0, len(prompt):], torch.tensor(gen.logprobs), atol=1e-4)
    assert len({tuple(g.token_ids) for g in gens[:4]}) > 1, "samples of one prompt should differ"


def test_sampling_is_seeded(tiny_model, tokenizer):
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    a = HFBackend(tiny_model, tokenizer, seed=7).generate(prompt_ids(tokenizer), params)
    b = HFBackend(tiny_model, tokenizer, seed=7).generate(prompt_ids(tokenizer), params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


def test_stop_strings_end_generation(tiny_model, tokenizer):
    backend = HFBackend(tiny_model, tokenizer)
    free = backend.generate(prompt_ids(tokenizer)[:1], SamplingParams(temperature=0, max_new_tokens=12))[0]
    text = tokenizer.decode(free.token_ids[:6])
    stop = text[-3:]
    gen = backend.generate(prompt_ids(tokenizer)[:1], SamplingParams(temperature=0, max_new_tokens=12, stop=(stop,)))[0]
    assert gen.finish_reason == "stop"
    assert stop in tokenizer.decode(gen.token_ids) and len(gen.token_ids) <= 6


def test_top_p_keeps_the_nucleus():
    from posttrain.rollout.sampling import top_p_filter

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_filter(logits, 0.7))
    assert kept.tolist() == [[True, True, False, False]]


def test_many_samples_need_temperature(tiny_model, tokenizer):
    with pytest.raises(ValueError, match="temperature"):
        HFBackend(tiny_model, tokenizer).generate(prompt_ids(tokenizer), SamplingParams(temperature=0), num_samples=2)


@pytest.fixture(params=["our kernel", "PyTorch's operations"])
def sample_next(request, monkeypatch):
    """sampling.sample_next, drawing on our kernel or on PyTorch's operations (as where the probe finds the
    kernel slower, or it cannot be built)."""
    from posttrain.models import sample_tokens
    from posttrain.rollout import sampling

    ours = request.param == "our kernel"
    if ours and sample_tokens.unavailable_reason() is not None:
        pytest.skip(f"the sampling kernel cannot run here: {sample_tokens.unavailable_reason()}")
    monkeypatch.setattr(sampling, "sampler_pays", lambda: ours)
    return sampling.sample_next


def test_sampler_draws_tokens_in_proportion_to_their_probability(sample_next):
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    logits = torch.log(probs).repeat(40_000, 1)
    tokens, logps = sample_next(logits, 1.0, 1.0, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=5).float() / len(tokens)
    assert torch.allclose(freq, probs, atol=0.01)
    assert freq[4] == 0, "a token of probability 0 was sampled"
    assert torch.allclose(logps, torch.log(probs)[tokens])
    # Top-p removes the tail from the draw, but the log-probability stays the untruncated one.
    tokens, logps = sample_next(logits, 1.0, 0.7, torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {0, 1}
    assert torch.allclose(logps, torch.log(probs)[tokens])


def test_sampler_finds_tokens_across_blocks_of_its_cumulative_distribution(sample_next):
    from posttrain.rollout.sampling import CDF_BLOCK

    vocab = 2 * CDF_BLOCK + 276  # a last block that is only partly the vocabulary
    probs = torch.zeros(vocab)
    # mass at the edges of the blocks, none in the middle block, the last entry included
    probs[[0, CDF_BLOCK - 1, 2 * CDF_BLOCK, vocab - 1]] = torch.tensor([0.1, 0.4, 0.2, 0.3])
    logits = torch.log(probs).repeat(40_000, 1)
    tokens, logps = sample_next(logits, 1.0, 1.0, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=vocab).float() / len(tokens)
    assert torch.allclose(freq, probs, atol=0.01)
    assert freq[probs == 0].sum() == 0, "a token of probability 0 was sampled"
    assert torch.allclose(logps, torch.log(probs)[tokens])
    # a temperature flattens the draw and scales the log-probabilities
    tokens, logps = sample_next(logits[:20_000], 2.0, 1.0, torch.Generator().manual_seed(1))
    flat = probs.sqrt() / probs.sqrt().sum()
    assert torch.allclose(torch.bincount(tokens, minlength=vocab).float() / 20_000, flat, atol=0.015)
    assert torch.allclose(logps, torch.log(flat)[tokens], atol=1e-6)


def test_sampling_kernel_draws_what_pytorchs_operations_draw():
    # The same uniform draws pick the same tokens (a model's logits: a 49k vocabulary, a few temperatures),
    # with log-probabilities within float32 rounding of the exact ones (log_softmax in float64). The
    # exact ones, not PyTorch's: its float32 log_softmax sums 49k terms in float32, and on an AVX2-only
    # CPU (Zen 3 EPYC) it missed the float64 value by up to 1.7e-5 where the kernel missed it by 9e-7.
    from posttrain.models import sample_tokens
    from posttrain.rollout.sampling import sample_with_torch

    if sample_tokens.unavailable_reason() is not None:
        pytest.skip(f"the sampling kernel cannot run here: {sample_tokens.unavailable_reason()}")
    logits = 4 * torch.randn(256, 49152, generator=torch.Generator().manual_seed(0))
    for temperature in (1.0, 0.6, 1.7):
        torch_tokens, torch_logps = sample_with_torch(logits, temperature, 1.0, torch.Generator().manual_seed(3))
        uniform = torch.rand((256, 1), generator=torch.Generator().manual_seed(3), dtype=torch.float64).squeeze(1)
        tokens, logps = sample_tokens.draw(logits, temperature, uniform)
        assert torch.equal(tokens, torch_tokens)
        exact = torch.log_softmax(logits.double() / temperature, dim=-1).gather(1, tokens[:, None]).squeeze(1)
        assert torch.allclose(logps.double(), exact, atol=2e-6, rtol=0)
        assert torch.allclose(logps, torch_logps, atol=5e-5, rtol=0)


def test_sampler_survives_logits_that_are_not_numbers(sample_next):
    # A diverged model's NaN or infinite logits: every row still gets a token of the vocabulary, and the
    # log-probability says the row is broken; the other rows draw as before.
    logits = torch.full((5, 1000), float("-inf"))
    logits[:, :2] = torch.tensor(0.5).log()
    logits[1, 500], logits[2, 997], logits[3] = float("nan"), float("inf"), float("-inf")
    tokens, logps = sample_next(logits, 1.0, 1.0, torch.Generator().manual_seed(0))
    assert ((0 <= tokens) & (tokens < 1000)).all()
    assert logps[1:4].isnan().all()
    assert set(tokens[[0, 4]].tolist()) <= {0, 1} and torch.allclose(logps[[0, 4]], torch.tensor(0.5).log())


def test_packed_linears_compute_the_same_logits_and_restore_the_model(tiny_model, tokenizer):
    from posttrain.models.packed_linear import packed_linears, packing_available

    ids = torch.tensor(prompt_ids(tokenizer)[:1])
    with torch.no_grad():
        plain = tiny_model(input_ids=ids).logits
        with packed_linears(tiny_model, batch_hint=1):
            packed = tiny_model(input_ids=ids).logits
    assert torch.allclose(plain, packed, atol=1e-4)
    linears = [m for m in tiny_model.modules() if type(m) is torch.nn.Linear]
    assert linears and all("forward" not in vars(m) for m in linears), "a patched forward was left behind"
    if not packing_available():
        pytest.skip("this torch build has no oneDNN packed linear")
    with packed_linears(tiny_model):
        assert all("forward" in vars(m) for m in linears)
        # With gradients enabled a packed layer uses its live weight, so training through it works.
        tiny_model(input_ids=ids).logits.sum().backward()
    assert all(m.weight.grad is not None for m in linears if m.weight.requires_grad)
    tiny_model.zero_grad(set_to_none=True)


def test_packed_lora_layers_use_the_merged_weight():
    from posttrain.config import LoraConfig
    from posttrain.models import load_model
    from posttrain.models.lora import apply_lora
    from posttrain.models.packed_linear import packed_linears, packing_available

    if not packing_available():
        pytest.skip("this torch build has no oneDNN packed linear")
    torch.manual_seed(0)
    model = apply_lora(load_model("tiny-random"), LoraConfig(r=4)).eval()
    for name, p in model.named_parameters():
        if "lora_B" in name:  # B starts at 0; give the adapters an effect to fold in
            torch.nn.init.normal_(p, std=0.5)
    ids = torch.randint(0, 49152, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            base = model(input_ids=ids).logits
        with packed_linears(model, batch_hint=2):
            packed_adapted = model(input_ids=ids).logits
            with model.disable_adapter():
                packed_base = model(input_ids=ids).logits
        assert not torch.allclose(adapted, base, atol=1e-2)
        assert torch.allclose(packed_adapted, adapted, atol=1e-4)
        assert torch.allclose(packed_base, base, atol=1e-4)
        assert torch.equal(model(input_ids=ids).logits, adapted), "packing changed the model"


def _fast_and_generic(model, tokenizer, prompts, params, num_samples=1):
    fast = HFBackend(model, tokenizer, seed=5)
    generic = HFBackend(model, tokenizer, seed=5, fast_decode=False)
    assert fast.fast_decode and not generic.fast_decode
    return fast.generate(prompts, params, num_samples), generic.generate(prompts, params, num_samples)


@pytest.mark.parametrize("prefill", ["ours", "ours a few columns at a time", "the model's"])
def test_fast_decode_samples_what_the_generic_loop_samples(tiny_model, tokenizer, monkeypatch, prefill):
    # Prompts of different lengths (left padding), several samples each, rows stopping at different steps,
    # prefilled on the decode kernels or, where the probe finds them slower at that width, by the model.
    import posttrain.rollout.fast_decode as fast_decode

    monkeypatch.setattr(fast_decode, "prefill_pays", lambda kernel, bf16: prefill != "the model's")
    if prefill == "ours a few columns at a time":
        monkeypatch.setattr(fast_decode, "PREFILL_PASS_ROWS", 8)  # 3 prompts: 2 columns a pass
    params = SamplingParams(temperature=1.0, max_new_tokens=16, stop=("a",))
    fast, generic = _fast_and_generic(tiny_model, tokenizer, prompt_ids(tokenizer), params, num_samples=3)
    assert [g.token_ids for g in fast] == [g.token_ids for g in generic]
    assert [g.finish_reason for g in fast] == [g.finish_reason for g in generic]
    assert len({len(g.token_ids) for g in fast}) > 1, "rows should leave the batch at different steps"
    for f, g in zip(fast, generic):
        assert f.logprobs == pytest.approx(g.logprobs, abs=1e-5)


@pytest.mark.parametrize("done", [[0, 0, 0, 0, 0, 1], [1, 0, 0, 0, 0, 0], [1, 0, 1, 0, 0, 1], [0, 1, 1, 1, 0, 0]])
def test_finished_rows_leave_the_cache_moving_only_the_rows_they_make_room_for(done):
    from posttrain.rollout.fast_decode import StaticCache
    from posttrain.rollout.hf_backend import surviving_rows

    done = torch.tensor(done, dtype=torch.bool)
    order = surviving_rows(done)
    assert sorted(order.tolist()) == (~done).nonzero().squeeze(-1).tolist()
    moved = order != torch.arange(len(order))
    assert int(moved.sum()) == int(done[: len(order)].sum()), "a row moves only into a finished row's place"
    keys = [torch.randn(6, 2, 5, 4) for _ in range(2)]
    for index in (order, order.flip(0)):  # the order surviving_rows gives, and any other
        cache = StaticCache(layers=2, rows=6, kv_heads=2, head_dim=4, capacity=9)
        for layer, k in enumerate(keys):
            cache.keys[layer][:, :, :5], cache.values[layer][:, :, :5] = k, 2 * k
        cache.length = 5
        cache.bias[2, ..., :2] = float("-inf")  # a left-padded row keeps its padding wherever it goes
        bias = cache.bias.clone()
        cache.select(index)
        assert all(torch.equal(k[:, :, :5], e[index]) for k, e in zip(cache.keys, keys))
        assert all(torch.equal(v[:, :, :5], 2 * e[index]) for v, e in zip(cache.values, keys))
        assert torch.equal(cache.bias, bias[index]) and all(k.is_contiguous() for k in cache.keys)


def test_fast_decode_folds_lora_adapters_in():
    from posttrain.config import LoraConfig
    from posttrain.models import load_model, load_tokenizer
    from posttrain.models.lora import apply_lora

    torch.manual_seed(0)
    model = apply_lora(load_model("tiny-random"), LoraConfig(r=4)).eval()
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    tokenizer = load_tokenizer("tiny-random")
    prompts = prompt_ids(tokenizer)
    gens = HFBackend(model, tokenizer, seed=1).generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=10))
    for prompt, gen in zip(prompts, gens):
        ids = torch.tensor([prompt + gen.token_ids])
        lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
        assert torch.allclose(lp[0, len(prompt):], torch.tensor(gen.logprobs), atol=1e-4)


def test_fast_decode_handles_attention_biases_and_leaves_other_architectures_alone(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    from posttrain.rollout.fast_decode import supports

    torch.manual_seed(0)
    qwen = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        tie_word_embeddings=True)).eval()
    assert qwen.model.layers[0].self_attn.q_proj.bias is not None
    fast, generic = _fast_and_generic(qwen, tokenizer, prompt_ids(tokenizer), SamplingParams(temperature=1.0,
                                                                                            max_new_tokens=12))
    assert [g.token_ids for g in fast] == [g.token_ids for g in generic]
    from transformers import LlamaConfig, LlamaForCausalLM

    biased = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=1, num_attention_heads=4, attention_bias=True)).eval()
    backend = HFBackend(biased, tokenizer)  # an output-projection bias: the fused step steps aside
    gens = backend.generate(prompt_ids(tokenizer), SamplingParams(temperature=0, max_new_tokens=4))
    assert not backend.fast_decode and all(len(g.token_ids) == 4 for g in gens)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2)).eval()
    assert not supports(gpt2)
    gens = HFBackend(gpt2, tokenizer).generate(prompt_ids(tokenizer), SamplingParams(temperature=0, max_new_tokens=4))
    assert all(len(g.token_ids) == 4 for g in gens)


def _logprob_gaps(model, prompts, gens) -> list[float]:
    """Per generation, the largest gap between the sampler's log-probabilities and the trainer's."""
    gaps = []
    for prompt, gen in zip(prompts, gens):
        ids = torch.tensor([prompt + gen.token_ids])
        lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
        gaps.append((lp[0, len(prompt):] - torch.tensor(gen.logprobs)).abs().max().item())
    return gaps


def test_bf16_decoding_is_close_to_the_trainer_and_says_it_is_not_its_own(tiny_model, tokenizer):
    from posttrain.models.cpu_probe import has_bf16_units, narrow_decode_kernel

    # Rows that decode on a bf16 kernel: any 3 or more with bf16 units; without them (where packing
    # bf16 weights used to fail) only narrow steps, when a bf16 kernel measured fastest for them.
    rows = 3 if has_bf16_units() else 1
    if rows == 1 and narrow_decode_kernel(True) in FP32_KERNELS:
        pytest.skip("no bf16 kernel is the fastest for any step on this CPU")
    backend = HFBackend(tiny_model, tokenizer, seed=2, decode_dtype="bfloat16")
    assert not backend.same_logprobs_as_trainer  # the trainer must not reuse these as its own
    prompts = prompt_ids(tokenizer)[:rows]
    gens = backend.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=10))
    assert all(len(g.token_ids) == 10 or g.finish_reason == "stop" for g in gens)
    assert 0 < max(_logprob_gaps(tiny_model, prompts, gens)) < 0.1  # bf16 rounding, not a different model


def test_bf16_decoding_without_bf16_units_keeps_wide_steps_in_float32(tiny_model, tokenizer):
    from posttrain.models.cpu_probe import has_bf16_units

    if has_bf16_units():
        pytest.skip("with bf16 units every step decodes in bf16")
    backend = HFBackend(tiny_model, tokenizer, seed=4, decode_dtype="bfloat16")
    prompts = prompt_ids(tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    wide = backend.generate(prompts, params, num_samples=2)  # 6 rows throughout: float32's own log-probs
    assert max(_logprob_gaps(tiny_model, [p for p in prompts for _ in range(2)], wide)) < 1e-4


def test_shared_prompt_start_is_prefilled_once_and_changes_nothing(tiny_model, tokenizer):
    """Prompts that share their chat template's system turn: each completion's log-probabilities
    are still the model's own for the whole sequence (positions and padding right), in both decode
    loops, with several samples a prompt; prompts that share too little are prefilled whole."""
    from posttrain.rollout.hf_backend import SHARED_PREFIX_MIN_TOKENS, shared_prefix_length

    prompts = [encode_prompt(tokenizer, p) for p in ["What is 2 + 3?", "Hi", "Name a prime number above 10",
                                                     "What is 12 * 12?"]]
    shared = shared_prefix_length(prompts)
    assert shared >= SHARED_PREFIX_MIN_TOKENS and all(p[:shared] == prompts[0][:shared] for p in prompts)
    assert shared_prefix_length(prompts[:2]) == 0 and shared_prefix_length([[1, 2], [1, 2], [1, 2]]) == 0
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    for fast_decode in (True, False):
        backend = HFBackend(tiny_model, tokenizer, seed=3, fast_decode=fast_decode)
        gens = backend.generate(prompts, params, num_samples=2)
        expanded = [p for p in prompts for _ in range(2)]
        assert max(_logprob_gaps(tiny_model, expanded, gens)) < 1e-4
