import pytest
import torch

from posttrain.models import token_logprobs
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
