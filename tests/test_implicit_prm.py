"""PRIME's implicit process reward: its math, its online learning from outcomes, and a GRPO run that
trains on it and resumes with its learned state."""

import json

import pytest
import torch
import torch.nn.functional as F

from posttrain.config import load_config
from posttrain.rewards.implicit_prm import ImplicitPRMScorer, implicit_token_rewards, outcome_loss, step_sums
from posttrain.train import Trainer
from posttrain.types import Step, Task, Trajectory


def test_token_rewards_are_the_scaled_log_ratio_and_steps_sum_them():
    lp, ref = torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-1.5, -1.0, -0.5])
    assert implicit_token_rewards(lp, ref, 0.1).tolist() == pytest.approx([0.05, -0.1, 0.0])
    assert step_sums([1.0, 2.0, 3.0, 4.0, 5.0], [1, 4]) == [3.0, 12.0]


def test_outcome_loss_is_cross_entropy_of_the_summed_reward():
    rewards = torch.tensor([[0.2, 0.3, 9.0], [-0.4, 0.1, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # the masked 9s are not the response's
    labels = torch.tensor([1.0, 0.0])
    expected = -(F.logsigmoid(torch.tensor(0.5)) + F.logsigmoid(torch.tensor(0.3))) / 2
    assert float(outcome_loss(rewards, mask, labels)) == pytest.approx(float(expected), abs=1e-6)


def _trajectory(tokenizer, text: str, correct: bool) -> Trajectory:
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    prompt = tokenizer.encode("What is 3 + 4?", add_special_tokens=False)
    return Trajectory(Task("t", "What is 3 + 4?"), prompt, ids, [1] * len(ids), [0.0] * len(ids),
                      [Step(text, "", float(correct), True, False, {"correct": correct})], reward=float(correct))


def test_online_updates_separate_solved_from_failed_outcomes(tokenizer):
    torch.manual_seed(0)
    scorer = ImplicitPRMScorer("tiny-random", beta=0.5, learning_rate=1e-3)
    batch = [_trajectory(tokenizer, "3 + 4 = 7\nAnswer: 7", True),
             _trajectory(tokenizer, "3 + 4 = 8\nAnswer: 8", False)] * 2
    before = scorer._score(batch)
    assert all(r == pytest.approx(0.0, abs=1e-5) for steps in before for _, r in steps)  # pi_phi = pi_ref at start
    gaps = []
    for _ in range(5):
        steps = scorer.dense(batch)
        gaps.append(scorer.last_metrics["outcome_gap"])
    assert [len(s) for s in steps] == [2, 2, 2, 2]  # one reward per line
    assert gaps[-1] > gaps[0] and gaps[-1] > 0.1  # solved responses earn more summed reward than failed ones
    # The wrong step ('= 8') is where the failed response's reward goes down, not the shared prefix.
    assert steps[1][0][1] < steps[0][0][1]


TINY = ["model.name=tiny-random", "env.id=user_envs:Capitals", "algorithm.group_size=4", "train.tasks_per_step=1",
        "rollout.max_new_tokens=8", "eval.num_tasks=1", "eval.max_new_tokens=8", "eval.before_training=false",
        "algorithm.credit=step", "algorithm.beta=0",
        "reward.components=[{name: correctness}, {name: implicit_prm, kwargs: {learning_rate: 1.0e-3}}]"]


def test_grpo_trains_on_implicit_process_rewards_and_resumes_them(tmp_path):
    cfg = load_config(None, [*TINY, "train.steps=2", "train.checkpoint_every=1", f"output_dir={tmp_path / 'run'}"])
    assert cfg.reward.components[1].kwargs["model"] == "tiny-random"  # defaults to the policy's model
    trainer = Trainer(cfg)
    trainer.train()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert len(train) == 2 and all(r["reward/implicit_prm_errors"] == 0 for r in train)
    assert all(trainer.scored.dense) and train[-1]["optimizer_steps"] == 1
    learned = {k: v.clone() for k, v in trainer.reward.components[1].model.model.state_dict().items()}

    cfg = load_config(None, [*TINY, "train.steps=2", "train.checkpoint_every=1", f"output_dir={tmp_path / 'run'}"])
    resumed = Trainer(cfg, resume=tmp_path / "run")  # its latest checkpoint: step 2
    restored = resumed.reward.components[1].model.model.state_dict()
    assert all(torch.equal(restored[k], v) for k, v in learned.items())
    assert resumed.reward.components[1].model.optimizer.state_dict()["state"]  # Adam moments came back too
