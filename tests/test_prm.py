"""Process reward model: step boundaries in the token sequence, Monte Carlo labels, training, scoring, resume."""

import json
import os
import signal
from dataclasses import asdict

import pytest
import torch
from user_rewards import KeywordEnv

from posttrain.config import ConfigError, RewardSection, load_config
from posttrain.models import Policy
from posttrain.rewards import prm_train
from posttrain.rewards.composition import RewardComposer
from posttrain.rewards.prm import load_prm, step_ends
from posttrain.rewards.prm_train import (
    LabelledSolution,
    _logits,
    monte_carlo_shares,
    prm_loss,
    roc_auc,
    step_auc,
    train_prm,
)
from posttrain.rollout import HFBackend, SamplingParams
from posttrain.train.optimizer import adamw
from posttrain.train.stopping import TrainingStopped
from posttrain.types import Step, Task, Trajectory


def _solution(tokenizer, text, task=Task("t", "q"), prompt=(1, 5, 9)):
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    marks = KeywordEnv().score(task, text)[1]
    return Trajectory(task, list(prompt), ids, [1] * len(ids), [0.0] * len(ids),
                      [Step(text, "", 0.0, True, False, marks)])


def test_step_ends_follow_the_delimiter(tokenizer):
    text = "12 + 7 = 19\n19 - 5 = 14\n\nAnswer: 14"
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    ends = step_ends(tokenizer, ids, [1] * len(ids))
    assert [tokenizer.decode(ids[: e + 1], skip_special_tokens=True) for e in ends] == [
        "12 + 7 = 19\n", "12 + 7 = 19\n19 - 5 = 14\n", text]
    # Environment tokens (mask 0) are never steps; each turn's last sampled token ends its step.
    assert step_ends(tokenizer, ids + [30, 31] + ids, [1] * len(ids) + [0, 0] + [1] * len(ids)) == \
        ends + [len(ids) + 2 + e for e in ends]


def test_roc_auc():
    assert roc_auc([0.9, 0.8, 0.1], [True, True, False]) == 1.0
    assert roc_auc([0.1, 0.9], [True, False]) == 0.0
    assert roc_auc([0.5, 0.5], [True, False]) == 0.5


def test_monte_carlo_shares_score_continuations_with_the_env(tiny_model, tokenizer):
    """A prefix that already holds the 'good' line succeeds in every continuation; one that does not, in none
    (a random model never writes it); the last step's value is the solution's own outcome."""
    env = KeywordEnv()
    backend = HFBackend(tiny_model, tokenizer, 16, seed=0)
    solutions = [_solution(tokenizer, "good\nmore\nend"), _solution(tokenizer, "hmm\nmore\nend")]
    ends = [step_ends(tokenizer, s.completion_ids, s.loss_mask) for s in solutions]
    shares = monte_carlo_shares(env, backend, tokenizer, solutions, ends, 3, SamplingParams(max_new_tokens=6))
    assert shares == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


def test_prm_learns_to_rank_held_out_steps(tokenizer):
    """Soft labels from the marks; the PRM ranks held-out right steps above wrong ones."""
    torch.manual_seed(0)
    words = ["sun", "tree", "rock", "cat", "blue", "milk"]
    rng = torch.Generator().manual_seed(0)

    def solutions(n):
        out = []
        for _ in range(n):
            lines = [words[int(torch.randint(6, (1,), generator=rng))] for _ in range(3)]
            lines[int(torch.randint(3, (1,), generator=rng))] = "bad"
            s = _solution(tokenizer, "\n".join(lines))
            ends = step_ends(tokenizer, s.completion_ids, s.loss_mask)
            truth = s.steps[0].info["step_correct"]
            out.append(LabelledSolution(s, ends, [0.9 if t else 0.1 for t in truth], [], truth))
        return out

    train, held = solutions(48), solutions(16)
    model, tok = load_prm("tiny-random")
    optimizer = adamw(list(model.parameters()), 3e-3, 0.0)
    for _ in range(4):
        for i in range(0, len(train), 8):
            model.train()
            optimizer.zero_grad()
            batch = train[i : i + 8]
            prm_loss(_logits(model, tok.pad_token_id, batch), [x.labels for x in batch]).backward()
            optimizer.step()
    auc, steps = step_auc(model, tok.pad_token_id, held)
    assert steps == 48 and auc > 0.95


def test_train_prm_end_to_end_and_dense_rewards(tmp_path):
    cfg = load_config(None, ["model.name=tiny-random", "env.id=user_rewards:KeywordEnv", "prm.tasks=4",
                             "prm.eval_tasks=2", "prm.solutions=2", "prm.rollouts=2", "prm.epochs=1",
                             "rollout.max_new_tokens=12", f"output_dir={tmp_path}"])
    result = train_prm(cfg)
    assert result.train_solutions == 8 and result.train_steps >= 8
    assert (tmp_path / "prm" / "training.json").is_file()
    policy = Policy.load(cfg.model)
    traj = _solution(policy.tokenizer, "one\ntwo\nthree")
    reward = RewardComposer(RewardSection.model_validate(
        {"components": [{"name": "correctness"}, {"name": "prm", "weight": 0.5, "kwargs": {"path": result.output}}]}))
    out = reward([traj])
    assert [i for i, _ in out.dense[0]] == step_ends(policy.tokenizer, traj.completion_ids, traj.loss_mask)
    assert all(0.0 <= r <= 0.5 for _, r in out.dense[0])
    assert out.total == [0.0]  # dense rewards stay out of the outcome
    assert out.metrics["reward/prm"] == pytest.approx(2 * sum(r for _, r in out.dense[0]) / 3)


def _stop_at(phase: str):
    """A progress hook that sends this process SIGTERM the first time ``phase`` reports: the run's own signal
    handler records it and the run stops at the next chunk or step boundary, as it would for `kill`."""
    sent = []

    def hook(seen: str, done: int, total: int, info: dict) -> None:
        if seen == phase and not sent:
            sent.append(done)
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


def test_a_prm_run_stopped_while_labelling_and_while_training_resumes_to_the_uninterrupted_result(tmp_path,
                                                                                                  monkeypatch):
    monkeypatch.setattr(prm_train, "LABEL_CHUNK", 4)  # two chunks of training tasks, one of held-out tasks
    sets = ["model.name=tiny-random", "env.id=user_rewards:KeywordEnv", "prm.tasks=8", "prm.eval_tasks=4",
            "prm.solutions=2", "prm.rollouts=2", "prm.epochs=2", "prm.batch_size=4", "rollout.max_new_tokens=12",
            "train.checkpoint_every=3"]
    whole = train_prm(load_config(None, [*sets, f"output_dir={tmp_path / 'a'}"]))
    cfg = load_config(None, [*sets, f"output_dir={tmp_path / 'b'}"])
    logs = tmp_path / "b" / "prm-logs"

    with pytest.raises(TrainingStopped) as stop:  # after the first chunk of tasks
        train_prm(cfg, progress=_stop_at("label"))
    assert stop.value.exit_code == 128 + signal.SIGTERM
    assert str(stop.value) == f"stopped by SIGTERM after labelling 4 of 12 tasks: labels saved to {logs / 'labels.pt'}"
    assert not (logs / "checkpoints").exists()
    saved = (logs / "labels.pt").read_bytes()
    (logs / "labels.pt").write_bytes(saved[: len(saved) // 2])  # a damaged file is named, not loaded
    with pytest.raises(ConfigError, match=f"--resume: {logs / 'labels.pt'} is not a labelling posttrain wrote"):
        train_prm(cfg, resume=tmp_path / "b")
    (logs / "labels.pt").write_bytes(saved)

    with pytest.raises(TrainingStopped) as stop:  # the other chunks labelled, then a training step
        train_prm(cfg, progress=_stop_at("train"), resume=tmp_path / "b")
    checkpoint = logs / "checkpoints" / "step-000001"
    assert str(stop.value) == f"stopped by SIGTERM after step 1: checkpoint saved to {checkpoint}"
    assert (checkpoint / "model" / "model.safetensors").is_file()

    resumed = train_prm(cfg, resume=tmp_path / "b")
    labels = [torch.load(tmp_path / run / "prm-logs" / "labels.pt", weights_only=True) for run in ("a", "b")]
    assert [(x["train"], x["held"]) for x in labels[1:]] == [(x["train"], x["held"]) for x in labels[:1]]
    same = {"output": "", "seconds": 0, "label_seconds": 0}  # AUCs are NaN (no wrong step): compared as JSON
    assert json.dumps({**asdict(resumed), **same}) == json.dumps({**asdict(whole), **same})
    assert (tmp_path / "b" / "prm" / "model.safetensors").read_bytes() == \
        (tmp_path / "a" / "prm" / "model.safetensors").read_bytes()
    a, b = ([{k: v for k, v in json.loads(line).items() if k != "time"}
             for line in (tmp_path / run / "prm-logs" / "metrics.jsonl").read_text().splitlines()] for run in "ab")
    assert json.dumps(b) == json.dumps(a)  # every step logged once, as in run a (NaN AUCs: compared as JSON)
