"""Env and rollout workers as Ray actors (a local Ray with 2 CPUs), on the tiny random model."""

import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from posttrain.config import load_config  # noqa: E402
from posttrain.models.loading import ModelLoadError  # noqa: E402
from posttrain.rollout import HFBackend, SamplingParams  # noqa: E402
from posttrain.rollout.env_workers import RayEnvPool  # noqa: E402
from posttrain.rollout.ray_runtime import LOCAL_SYSTEM_CONFIG  # noqa: E402
from posttrain.train import Trainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def config(tmp_path, *overrides):
    return load_config(ROOT / "examples" / "tiny_smoke.yaml", [
        f"output_dir={tmp_path}", "env.id=user_envs:Capitals", "env.kwargs={}", "algorithm.beta=0",
        "rollout.max_new_tokens=6", "train.tasks_per_step=2", "algorithm.group_size=2", "eval.num_tasks=1",
        "eval.before_training=false", *overrides])


def test_a_run_whose_setup_fails_stops_the_ray_it_started(tmp_path):
    assert not ray.is_initialized()
    with pytest.raises(ModelLoadError):
        Trainer(config(tmp_path, "env.workers=1", "model.name=/no/such/model"))
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config=LOCAL_SYSTEM_CONFIG)
    yield
    ray.shutdown()


def test_a_training_step_with_env_workers_as_actors(tmp_path, local_ray):
    trainer = Trainer(config(tmp_path, "env.workers=2"))
    pool = trainer.ctx.envs
    assert isinstance(pool, RayEnvPool)
    pids = set(ray.get([w.pid.remote() for w in pool.workers]))
    assert len(pids) == 2 and os.getpid() not in pids  # the envs live in two other processes
    metrics = trainer.train_step()
    assert metrics["samples"] == 4 and metrics["errors"] == 0
    assert metrics["optimizer_steps"] == 1
    trainer.ctx.close()
    assert ray.is_initialized()  # a Ray the run did not start is left running


def test_a_killed_env_worker_is_replaced_and_training_completes(tmp_path, local_ray):
    trainer = Trainer(config(tmp_path, "env.workers=2", "train.steps=1"))
    pool = trainer.ctx.envs
    trainer.sample()  # every slot has been used once
    ray.kill(pool.workers[0], no_restart=True)  # the worker process dies, as a crashing browser would
    trajectories, _, metrics = trainer.sample()
    lost = [t for t in trajectories if t.error_kind == "worker_lost"]
    assert len(lost) == 2 and metrics["env_workers_lost"] == 2  # slots 0 and 2 ran on worker 0
    assert pool.replaced == 1
    result = trainer.train()
    assert result.steps == 1 and result.after is not None and result.after.errors == 0


def test_a_hung_env_worker_times_out_and_is_replaced(tmp_path, local_ray):
    # user_envs.Hanging sleeps 600 s on every third step of its process.
    trainer = Trainer(config(tmp_path, "env.workers=1", "env.id=user_envs:Hanging", "env.step_timeout=3"))
    _, _, metrics = trainer.sample()
    assert metrics["env_timeouts"] >= 1
    assert trainer.ctx.envs.replaced == 1
    trainer.ctx.close()


def test_rollout_workers_generate_with_the_weights_of_the_latest_update(tmp_path, local_ray):
    trainer = Trainer(config(tmp_path, "rollout.workers=1", "train.learning_rate=1e-2", "model.pack_weights=false"))
    trainer.train_step()
    trainer.train_step()
    assert trainer.ctx.backend.version == 2
    policy = trainer.policy
    prompts = [policy.tokenizer.encode("Capital of France?"), policy.tokenizer.encode("2 + 2 =")]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    local = HFBackend(policy.model, policy.tokenizer, pack_weights=False).generate(prompts, greedy)
    remote = trainer.ctx.backend.generate(prompts, greedy)
    assert [g.token_ids for g in remote] == [g.token_ids for g in local]
    # The workers keep their own sampling state: a checkpoint saves without it (it failed to, before).
    assert (trainer.save() / "trainer_state.pt").is_file()
    trainer.ctx.close()


def test_env_worker_random_state_is_saved_and_restored(tmp_path, local_ray):
    """A resumed run's env workers draw what the uninterrupted run's would have drawn next."""
    def draws(pool):  # NoisyCapitals' reward carries a draw from the env's np_random
        rewards = []
        for env in pool.take(3):
            env.reset()
            rewards.append(env.step("Paris")[1])
        return rewards

    a = RayEnvPool("user_envs:NoisyCapitals", {}, workers=2, timeout=60, seed=7)
    b = RayEnvPool("user_envs:NoisyCapitals", {}, workers=2, timeout=60, seed=7)
    try:
        assert draws(a) == draws(b)  # seeded by slot: the same stream on both pools
        state = a.rng_states()
        after_save = draws(a)
        b.load_rng_states(state)
        assert draws(b) == after_save and after_save != draws(a)
    finally:
        a.close()
        b.close()
