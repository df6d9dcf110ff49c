"""The evaluation harness: success, pass@k, reward, turns and tokens, per task and per difficulty."""

import json
import math

import pytest
from test_train_e2e import run_cli, tiny_config

from posttrain.config import EvalSection, RolloutSection
from posttrain.envs import make_env, registered
from posttrain.eval import evaluate
from posttrain.eval.evaluate import summarise
from posttrain.eval.pass_at_k import pass_at_k
from posttrain.rollout import EnvPool, HFBackend
from posttrain.types import Step, Task, Trajectory


def episode(task: Task, correct: bool, reward: float, turns: int = 1, tokens: int = 3) -> Trajectory:
    steps = [Step("a", "o", 0.0, False, False, {}) for _ in range(turns - 1)]
    steps.append(Step("a", "", reward, True, False, {"correct": correct}))
    return Trajectory(task=task, prompt_ids=[1], completion_ids=[2] * tokens, loss_mask=[1] * tokens,
                      behaviour_logprobs=[0.0] * tokens, steps=steps, reward=reward)


def test_summary_overall_per_task_and_per_difficulty():
    easy, hard, other = (Task("e", "?", 1, {"difficulty": 1}), Task("h", "?", 1, {"difficulty": 3}),
                         Task("h2", "?", 1, {"difficulty": 3}))
    trajectories = [episode(easy, True, 1.0), episode(easy, True, 1.0), episode(easy, False, 0.0, tokens=7),
                    episode(hard, False, 0.0, turns=3), episode(hard, True, 1.0), episode(hard, False, 0.5),
                    episode(other, False, 0.0), episode(other, False, 0.0), episode(other, False, 0.0)]
    result = summarise(trajectories, samples_per_task=3, pass_k=2)
    assert result.accuracy == pytest.approx(3 / 9) and result.num_tasks == 3
    assert result.reward_mean == pytest.approx(3.5 / 9)
    assert result.overall.turns_mean == pytest.approx(11 / 9) and result.overall.tokens_mean == pytest.approx(31 / 9)
    assert result.pass_at[2] == pytest.approx((pass_at_k(3, 2, 2) + pass_at_k(3, 1, 2) + 0.0) / 3)
    assert set(result.per_difficulty) == {"1", "3"}
    assert result.per_difficulty["1"].accuracy == pytest.approx(2 / 3)
    assert result.per_difficulty["3"].num_tasks == 2 and result.per_difficulty["3"].accuracy == pytest.approx(1 / 6)
    assert [(t.task_id, t.successes, t.samples) for t in result.per_task] == [("e", 2, 3), ("h", 1, 3), ("h2", 0, 3)]
    metrics = result.metrics()
    assert metrics["difficulty_1/accuracy"] == pytest.approx(2 / 3) and "difficulty_3/pass@2" in metrics
    out = result.to_json()
    assert out["num_tasks"] == 3 and out["per_difficulty"]["3"]["episodes"] == 6 and len(out["per_task"]) == 3


@pytest.mark.parametrize("spec", [s for s in registered() if not s.multi_agent], ids=lambda s: s.id)
def test_every_registered_env_evaluates(spec, tiny_model, tokenizer):
    envs = EnvPool(lambda: make_env(spec.id, spec.example_kwargs))
    tasks = envs.tasks("eval")[:2]
    cfg = EvalSection(num_tasks=2, temperature=1.0, samples_per_task=2, pass_k=2, max_new_tokens=8)
    backend = HFBackend(tiny_model, tokenizer, batch_size=8, seed=0)
    result = evaluate(envs, backend, tokenizer, tasks, cfg, RolloutSection(max_turns=2), step_timeout=60)
    assert result.num_tasks == 2 and result.overall.episodes == 4 and result.errors == 0
    for key in ("accuracy", "reward_mean", "pass@1", "pass@2", "turns_mean", "tokens_mean"):
        assert math.isfinite(result.metrics()[key]), key
    assert 1 <= result.overall.turns_mean <= 2 and 0 < result.overall.tokens_mean <= 16
    assert [t.task_id for t in result.per_task] == [t.id for t in tasks]
    row = result.samples[0]
    assert len(row["completion_ids"]) == len(row["loss_mask"]) and row["steps"]


@pytest.mark.slow
def test_cli_eval_json_breaks_down_by_difficulty(tmp_path):
    config = tiny_config(tmp_path, env={"kwargs": {"difficulty": [1, 4], "num_eval": 3}}, eval={"num_tasks": 6})
    proc = run_cli("eval", config, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["num_tasks"] == 6 and set(out["per_difficulty"]) == {"1", "4"}
    assert [t["difficulty"] for t in out["per_task"]] == ["1", "4"] * 3  # the eval split interleaves the levels
    assert sum(d["num_tasks"] for d in out["per_difficulty"].values()) == 6
    proc = run_cli("eval", config, "--set", "eval.num_tasks=2")
    assert proc.returncode == 0 and "level" in proc.stdout and "tokens" in proc.stdout
