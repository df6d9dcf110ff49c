"""Multi-turn rollouts: token in/token out on real chat templates, loss mask only on sampled tokens."""

import copy

import pytest
import torch
from user_envs import GuessNumber

from posttrain.rollout import EnvPool, HFBackend, SamplingParams, encode_prompt, observation_delta, run_episodes

LLAMA3_STYLE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
QWEN_STYLE = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\n"
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(params=["chatml-smollm2", "llama3-style", "qwen-style"])
def model_and_tokenizer(request, tiny_model, tokenizer):
    tok, model = copy.deepcopy(tokenizer), tiny_model
    if request.param == "llama3-style":
        tok.add_special_tokens({"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
        tok.eos_token = "<|eot_id|>"
        tok.chat_template = LLAMA3_STYLE
        model = copy.deepcopy(tiny_model)
        model.resize_token_embeddings(len(tok))
    elif request.param == "qwen-style":
        tok.chat_template = QWEN_STYLE
    return model, tok


def test_delta_continues_the_template_exactly(model_and_tokenizer):
    """prompt + sampled answer + EOS + delta == the template's own rendering of the longer chat."""
    _, tok = model_and_tokenizer
    chat = [{"role": "user", "content": "Guess a digit."}]
    answer = tok.encode("5", add_special_tokens=False) + [tok.eos_token_id]
    for sampled_eos in (True, False):
        ids = encode_prompt(tok, chat) + (answer if sampled_eos else answer[:-1])
        ids += observation_delta(tok, "Higher.", sampled_eos)
        expected = tok.apply_chat_template(
            chat + [{"role": "assistant", "content": "5"}, {"role": "user", "content": "Higher."}],
            add_generation_prompt=True, tokenize=False,
        )
        # Text equality, not token equality: encoding the whole chat at once may merge tokens
        # across turn boundaries (e.g. "\n\n" + "5"), which is exactly why turns are never re-encoded.
        assert tok.decode(ids) == expected


def test_multi_turn_trajectory_is_sampled_ids_plus_template_deltas(model_and_tokenizer):
    model, tok = model_and_tokenizer
    backend = HFBackend(model, tok, seed=0)
    tasks = GuessNumber().tasks("train")[:2]
    trajectories = run_episodes(EnvPool(GuessNumber), backend, tok, tasks, SamplingParams(max_new_tokens=6),
                                num_samples=2, max_turns=3)
    assert len(trajectories) == 4
    for traj in trajectories:
        assert traj.error is None and 1 <= len(traj.steps) <= 3
        mask = torch.tensor(traj.loss_mask)
        ids = torch.tensor(traj.completion_ids)
        # Runs of mask 1 are the sampled turns; each run of mask 0 is exactly the delta for that step's observation.
        sampled_runs, env_runs, start = [], [], 0
        for k in range(1, len(mask) + 1):
            if k == len(mask) or mask[k] != mask[start]:
                (sampled_runs if mask[start] else env_runs).append(ids[start:k].tolist())
                start = k
        assert len(sampled_runs) == len(traj.steps)
        for run, step, delta in zip(sampled_runs, traj.steps, env_runs):
            assert step.action == tok.decode(run, skip_special_tokens=True)
            assert delta == observation_delta(tok, step.observation, run[-1] == tok.eos_token_id)
        assert len(env_runs) == len(traj.steps) - 1  # no observation after the last turn
        # Environment tokens carry no behaviour log-probability; sampled ones do.
        lp = torch.tensor(traj.behaviour_logprobs)
        assert (lp[~mask.bool()] == 0).all() and (lp[mask.bool()] < 0).all()
        finished = traj.steps[-1].terminated or traj.steps[-1].truncated
        assert finished or traj.finish_reason == "max_turns"


def test_context_limit_truncates(tiny_model, tokenizer):
    backend = HFBackend(tiny_model, tokenizer, seed=0)
    task = GuessNumber().tasks("train")[1]
    prompt_len = len(encode_prompt(tokenizer, task.prompt))
    [traj] = run_episodes(EnvPool(GuessNumber), backend, tokenizer, [task], SamplingParams(max_new_tokens=6),
                          max_turns=5, max_context=prompt_len + 10)
    assert traj.finish_reason == "max_context" and traj.steps[-1].truncated
    assert len(traj.prompt_ids) + len(traj.completion_ids) <= prompt_len + 10
