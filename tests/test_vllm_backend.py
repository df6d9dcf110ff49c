"""rollout.backend: vllm. The engine tests run where vLLM is installed (`make test-vllm`); the
missing-extra error is checked where it is not.

vLLM's CPU attention supports head sizes from 32 up, so these tests use a small random Llama with
64-wide heads and SmolLM2's tokenizer instead of the tiny-random preset (16-wide heads).
"""

import importlib.util
import subprocess
import sys

import pytest
import torch
from user_envs import GuessNumber

from posttrain.algorithms import logprob_mismatch
from posttrain.config import load_config
from posttrain.models import Policy
from posttrain.rollout import (
    BackendUnavailable,
    EnvPool,
    HFBackend,
    SamplingParams,
    check_backend,
    make_backend,
    run_episodes,
)
from posttrain.types import Batch

HAS_VLLM = importlib.util.find_spec("vllm") is not None
SKIP_REASON = "vLLM is not installed (make test-vllm installs it and runs these)"
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason=SKIP_REASON)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_vllm_backend_without_vllm_names_the_extra():
    with pytest.raises(BackendUnavailable, match=r"rollout.backend=vllm needs vLLM, which is not installed: "
                                                 r"pip install 'posttrain\[vllm\]'"):
        check_backend(load_config(None, ["rollout.backend=vllm"]))


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_cli_exits_2_with_one_line(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model:\n  name: tiny-random\nrollout:\n  backend: vllm\n")
    proc = subprocess.run([sys.executable, "-m", "posttrain.cli", "train", str(cfg)], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "posttrain[vllm]" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from posttrain.models import load_tokenizer, resolve_model_path

    tok = load_tokenizer("tiny-random")
    config = LlamaConfig.from_pretrained(resolve_model_path("tiny-random"))
    config.update({"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64})
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
    out = tmp_path_factory.mktemp("llama-64")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def _setup(model_dir, *overrides):
    cfg = load_config(None, [f"model.name={model_dir}", "model.device=cpu", "rollout.backend=vllm",
                             "rollout.vllm.kv_cache_gb=0.25", "rollout.vllm.max_model_len=512", *overrides])
    policy = Policy.load(cfg.model)
    return cfg, policy, make_backend(cfg, policy), HFBackend(policy.model, policy.tokenizer, pack_weights=False)


@pytest.fixture(scope="module")
def engine(model_dir):
    if not HAS_VLLM:
        pytest.skip(SKIP_REASON)
    return _setup(model_dir)


def _prompts(tokenizer, n=4):
    return [tokenizer.encode(f"What is {i} + {2 * i + 1}?") for i in range(n)]


GREEDY = SamplingParams(temperature=0, max_new_tokens=12)


def _train_towards(policy, target: list[int], prompts: list[list[int]], steps: int = 5) -> None:
    """A few real optimiser steps that make ``target`` the likely continuation of every prompt."""
    opt = torch.optim.Adam(policy.trainable_parameters(), lr=3e-2)
    batch = Batch.from_trajectories([_as_trajectory(p, target) for p in prompts], policy.pad_id, policy.device)
    for _ in range(steps):
        opt.zero_grad()
        lp, _ = policy.logprobs(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_lengths)
        (-(lp * batch.loss_mask).sum() / batch.loss_mask.sum()).backward()
        opt.step()


def _as_trajectory(prompt, completion):
    from posttrain.types import Task, Trajectory

    return Trajectory(Task("t", ""), list(prompt), list(completion), [1] * len(completion), [0.0] * len(completion))


@needs_vllm
def test_samples_are_grouped_with_the_trainers_logprobs(engine):
    _, policy, vllm_backend, _ = engine
    prompts = _prompts(policy.tokenizer, 3)
    gens = vllm_backend.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=10), num_samples=4)
    assert len(gens) == 12 and all(len(g.token_ids) == len(g.logprobs) > 0 for g in gens)
    trajectories = [_as_trajectory(prompts[i // 4], g.token_ids) for i, g in enumerate(gens)]
    batch = Batch.from_trajectories(trajectories, policy.pad_id)
    sampler = torch.zeros_like(batch.loss_mask)
    for i, (t, g) in enumerate(zip(trajectories, gens)):
        sampler[i, len(t.prompt_ids) : len(t.prompt_ids) + len(g.logprobs)] = torch.tensor(g.logprobs)
    with torch.no_grad():
        trainer, _ = policy.logprobs(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_lengths)
    # Both in float32 on CPU: the engine's logprobs are the trainer's up to rounding.
    assert float(logprob_mismatch(sampler, trainer, batch.loss_mask)) < 1e-3
    assert len({tuple(g.token_ids) for g in gens[:4]}) > 1, "the 4 samples of one prompt should differ"


@needs_vllm
def test_stop_strings_end_a_generation_like_the_hf_backend(engine):
    _, policy, vllm_backend, hf_backend = engine
    prompts = _prompts(policy.tokenizer, 2)
    free = hf_backend.generate(prompts, GREEDY)[0]
    stop = policy.tokenizer.decode(free.token_ids[3:4])
    params = SamplingParams(temperature=0, max_new_tokens=12, stop=(stop,))
    ours, theirs = vllm_backend.generate(prompts, params), hf_backend.generate(prompts, params)
    assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
    assert stop in policy.tokenizer.decode(ours[0].token_ids) and ours[0].finish_reason == "stop"
    assert len(ours[0].token_ids) <= 4


@needs_vllm
def test_the_multi_turn_agent_loop_runs_on_vllm(engine):
    _, policy, vllm_backend, _ = engine
    tasks = GuessNumber().tasks("train")[:2]
    trajectories = run_episodes(EnvPool(GuessNumber), vllm_backend, policy.tokenizer, tasks,
                                SamplingParams(max_new_tokens=4), num_samples=2, max_turns=3)
    assert len(trajectories) == 4 and all(t.error is None for t in trajectories)
    multi = [t for t in trajectories if len(t.steps) > 1]
    assert multi, "a random policy should need more than one guess"
    for t in multi:  # environment tokens between the turns carry mask 0 and logprob 0
        assert 0 in t.loss_mask and all(lp == 0.0 for lp, m in zip(t.behaviour_logprobs, t.loss_mask) if not m)
        assert any(lp != 0.0 for lp, m in zip(t.behaviour_logprobs, t.loss_mask) if m)


@needs_vllm
def test_greedy_output_follows_each_update_and_equals_the_hf_backend(engine):
    _, policy, vllm_backend, hf_backend = engine
    prompts = _prompts(policy.tokenizer)
    before = [g.token_ids for g in vllm_backend.generate(prompts, GREEDY)]
    assert before == [g.token_ids for g in hf_backend.generate(prompts, GREEDY)]
    target = policy.tokenizer.encode(" The answer is 42.", add_special_tokens=False)
    _train_towards(policy, target, prompts)
    stale = [g.token_ids for g in vllm_backend.generate(prompts, GREEDY)]
    assert stale == before, "without a sync the engine still has the old weights"
    vllm_backend.sync_weights()
    after = [g.token_ids for g in vllm_backend.generate(prompts, GREEDY)]
    assert after != before
    assert after == [g.token_ids for g in hf_backend.generate(prompts, GREEDY)]


@needs_vllm
def test_lora_adapters_are_merged_into_the_engines_weights(model_dir):
    _, policy, vllm_backend, hf_backend = _setup(model_dir, "model.lora.enabled=true", "model.lora.r=8")
    prompts = _prompts(policy.tokenizer, 3)
    before = [g.token_ids for g in vllm_backend.generate(prompts, GREEDY)]
    _train_towards(policy, policy.tokenizer.encode(" Seven", add_special_tokens=False), prompts, steps=8)
    vllm_backend.sync_weights()
    after = [g.token_ids for g in vllm_backend.generate(prompts, GREEDY)]
    assert after != before and after == [g.token_ids for g in hf_backend.generate(prompts, GREEDY)]
    del vllm_backend


@needs_vllm
def test_grpo_trains_with_the_vllm_backend(model_dir, tmp_path):
    """The trainer on vLLM: every step that trains logs the sampler/trainer gap and its TIS weights
    (measured in the training pass), and the engine is given the new weights after each update (its
    greedy output is the HF backend's)."""
    from posttrain.train import Trainer

    cfg = load_config(None, [f"model.name={model_dir}", "model.device=cpu", "rollout.backend=vllm",
                             "rollout.vllm.kv_cache_gb=0.25", "rollout.vllm.max_model_len=512", "env.id=arithmetic",
                             "algorithm.group_size=4", "train.tasks_per_step=2", "rollout.max_new_tokens=8",
                             "train.learning_rate=1e-2", "eval.num_tasks=4", "eval.max_new_tokens=8",
                             # rewards that differ row by row, so that every step trains
                             "reward.components=[{name: 'user_rewards:answer_length_bonus'}]",
                             f"output_dir={tmp_path}"])
    trainer = Trainer(cfg)
    prompts = _prompts(trainer.policy.tokenizer, 3)
    before = [g.token_ids for g in trainer.ctx.backend.generate(prompts, GREEDY)]
    steps = [trainer.train_step() for _ in range(2)]
    assert all(m["optimizer_steps"] for m in steps)
    for m in steps:
        assert 0 <= m["logprob_mismatch"] < 1e-3  # float32 on both sides: rounding only
        assert 0 < m["tis_weight_mean"] <= cfg.algorithm.tis_cap
    after = [g.token_ids for g in trainer.ctx.backend.generate(prompts, GREEDY)]
    assert (trainer.save() / "trainer_state.pt").is_file()  # vLLM keeps its own sampling state
    hf = HFBackend(trainer.policy.model, trainer.policy.tokenizer, pack_weights=False)
    assert after == [g.token_ids for g in hf.generate(prompts, GREEDY)]
    assert after != before
