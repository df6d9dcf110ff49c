"""The env contract: any gymnasium text env unchanged, gymnasium ids, reasoning-gym, clear errors."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import pytest
import yaml

from posttrain.data.store import TrajectoryStore
from posttrain.envs import EnvError, make_env
from posttrain.envs.contract import as_messages, env_tasks, is_seed_task
from posttrain.envs.reasoning_gym_env import extract_answer
from posttrain.rewards import isolated

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=env)


def write_config(tmp_path, env, **sections):
    cfg = yaml.safe_load((ROOT / "examples" / "tiny_smoke.yaml").read_text())
    cfg["env"] = env
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    cfg["output_dir"] = str(tmp_path / "run")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_a_gymnasium_env_without_tasks_trains_through_the_cli(tmp_path):
    config = write_config(tmp_path, {"id": "user_envs:SeededSum", "kwargs": {}, "train_seeds": 50,
                                     "eval_seed_start": 500}, algorithm={"beta": 0.0}, eval={"num_tasks": 3},
                          store={"write": True})
    proc = run_cli("train", config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    train = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]
    assert len(train) == 2 and all(r["errors"] == 0 and r["optimizer_steps"] >= 1 for r in train)
    # The G samples of a group reset with one seed (so they saw one prompt); seeds are training seeds.
    stored = TrajectoryStore(run / "trajectories").trajectories()
    groups = {}
    for t in stored:
        groups.setdefault(t.task.id, set()).add(tuple(t.prompt_ids))
    assert len(stored) == 2 * 2 * 4 and all(len(prompts) == 1 for prompts in groups.values())
    assert all(0 <= int(task_id.removeprefix("seed-")) < 50 for task_id in groups)
    evaluated = [json.loads(line) for line in (run / "eval_samples" / "step-000002.jsonl").open()]
    assert [s["task_id"] for s in evaluated] == ["seed-500", "seed-501", "seed-502"]


def test_seed_tasks_are_disjoint_and_reset_by_seed():
    env = make_env("user_envs:SeededSum")
    train, held_out = env_tasks(env, "train", 10, 100, 5), env_tasks(env, "eval", 10, 100, 5)
    assert all(map(is_seed_task, train + held_out))
    assert not {t.id for t in train} & {t.id for t in held_out}
    from posttrain.envs.contract import reset_episode

    first, info = reset_episode(env, train[3])
    again, _ = reset_episode(env, train[3])
    assert first == again and info["seed"] == 3


def test_any_id_in_gymnasiums_registry_is_built_with_its_kwargs():
    gym.register("posttrain-tests/Capitals-v0", entry_point="user_envs:Capitals")
    env = make_env("posttrain-tests/Capitals-v0", {"bonus_for_length": False})
    assert env.unwrapped.bonus_for_length is False
    assert env_tasks(env, "eval", 1, 1, 1)[0].answer == "Rome"  # tasks() found through gymnasium's wrappers


@pytest.mark.parametrize("env_id, message", [
    ("user_envs:NumericObservations", "observation_space is Box"),
    ("user_envs:OldStyleReset", "reset() takes no seed or options keyword"),
])
def test_an_env_that_is_not_a_text_env_is_refused_with_one_line(tmp_path, env_id, message):
    with pytest.raises(EnvError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_env(env_id)
    proc = run_cli("train", write_config(tmp_path, {"id": env_id, "kwargs": {}}))
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_observations_that_are_neither_text_nor_messages_are_rejected():
    assert as_messages("hi") == [{"role": "user", "content": "hi"}]
    assert as_messages({"role": "tool", "content": "4"}) == [{"role": "tool", "content": "4"}]
    for bad in ({"foo": 1}, [1, 2, 3], 7, None):
        with pytest.raises(EnvError, match="neither text nor chat messages"):
            as_messages(bad)


def test_reasoning_gym_dataset_splits_are_disjoint_and_scored_by_its_verifier():
    env = make_env("reasoning_gym", {"dataset": "basic_arithmetic", "size": 200, "eval_size": 100})
    train, held_out = env.tasks("train"), env.tasks("eval")
    assert len(train) == 200 and 0 < len(held_out) <= 100
    assert not {t.prompt for t in train} & {t.prompt for t in held_out}
    task = held_out[0]
    env.reset(options={"task": task})
    _, reward, done, _, info = env.step(f"Let me compute.\nAnswer: {task.answer}")
    assert (reward, done, info["correct"]) == (1.0, True, True)
    env.reset(options={"task": task})
    assert env.step("Answer: not a number")[1] == 0.0
    env.reset(options={"task": task})
    assert env.step(f"The final answer to the problem is {task.answer}.")[1] == 1.0


def test_reasoning_gym_verifiers_that_eval_the_answer_run_it_sandboxed(tmp_path):
    """countdown's verifier reads the answer with SymPy's parse_expr, which evaluates Python."""
    env = make_env("reasoning_gym", {"dataset": "countdown", "size": 20, "eval_size": 5})
    task = env.tasks("train")[0]
    written = tmp_path / "written-by-the-answer"
    env.reset(options={"task": task})
    _, reward, _, _, info = env.step(f"Answer: __import__('pathlib').Path({str(written)!r}).write_text('x')")
    assert not written.exists() and reward < 1.0 and not info["correct"]
    env.reset(options={"task": task})
    assert env.step(f"Answer: {task.answer}")[1] == 1.0


def test_reasoning_gym_answers_scored_from_short_lived_threads_keep_their_sandbox():
    """The rollout steps envs in threads that end with the step; bwrap's --die-with-parent follows the thread
    that started it, which killed the sandboxed verifier after each step (the next answers then scored 0)."""
    env = make_env("reasoning_gym", {"dataset": "countdown", "size": 20, "eval_size": 5})
    tasks = env.tasks("train")[:4]
    scores = []
    for task in tasks:  # one after another, each from a thread of its own that ends
        worker = threading.Thread(target=lambda t=task: scores.append(env.score(t, f"Answer: {t.answer}")[0]))
        worker.start()
        worker.join()
        time.sleep(0.2)  # time for a death signal to arrive
    assert scores == [1.0] * len(tasks)


def test_reasoning_gym_without_a_working_sandbox_says_how_to_run_without_it(monkeypatch):
    monkeypatch.setattr(isolated, "_pools", {})  # children started from here on see the broken bwrap
    monkeypatch.setenv("POSTTRAIN_BWRAP", "/bin/false")  # a bubblewrap that cannot run (no user namespaces, say)
    env = make_env("reasoning_gym", {"dataset": "countdown", "size": 20, "eval_size": 5})
    task = env.tasks("train")[0]
    env.reset(options={"task": task})
    with pytest.raises(RuntimeError, match="exit status 1.*backend: rlimit in the env's kwargs runs it without"):
        env.step(f"Answer: {task.answer}")
    env = make_env("reasoning_gym", {"dataset": "countdown", "size": 20, "eval_size": 5, "backend": "rlimit"})
    env.reset(options={"task": task})
    assert env.step(f"Answer: {task.answer}")[1] == 1.0
    with pytest.raises(EnvError, match="backend must be 'bwrap' or 'rlimit', got 'docker'"):
        make_env("reasoning_gym", {"dataset": "countdown", "backend": "docker"})


def test_reasoning_gym_unknown_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(EnvError, match="no dataset 'basic_arithmetc'.*did you mean 'basic_arithmetic'"):
        make_env("reasoning_gym", {"dataset": "basic_arithmetc"})
    proc = run_cli("train", write_config(tmp_path, {"id": "reasoning_gym", "kwargs": {"dataset": "nope_nope"}}))
    assert proc.returncode == 2 and "no dataset 'nope_nope'" in proc.stderr and "Traceback" not in proc.stderr


def test_answer_extraction():
    assert extract_answer("work\nAnswer: 42.") == "42"
    assert extract_answer("<answer> 7 </answer> and more") == "7"
    assert extract_answer("so\n\n  -3  \n") == "-3"
    assert extract_answer("") == ""
