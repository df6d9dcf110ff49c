"""MiniWoB++ in real Chromium: experts solve, random play rarely does, errors are observations,
and no browser process outlives the env (close, failed episodes, killed workers, recycling)."""

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
from gymnasium.utils.env_checker import check_env

from posttrain.envs import EnvError, make_env
from posttrain.envs.web import TIERS, MiniWoBEnv
from posttrain.envs.web.browser import BrowserHost, browser_processes
from posttrain.envs.web.experts import MINIWOB_PLANS, MiniWoBExpert, RandomPolicy

EXPERT_TASKS = sorted(MINIWOB_PLANS)


@pytest.fixture(scope="module")
def env():
    env = MiniWoBEnv(tasks=EXPERT_TASKS)
    yield env
    env.close()


def play(env, task, policy, max_steps=10):
    obs, _ = env.reset(options={"task": task})
    total, info = 0.0, {}
    for _ in range(max_steps):
        obs, reward, terminated, truncated, info = env.step(policy.act(obs))
        total += reward
        if terminated or truncated:
            break
    return total, info


def _gone(procs, within=5.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.1)
    return False


def test_splits_are_disjoint_seeded_pairs(env):
    train, held_out = env.tasks("train"), env.tasks("eval")
    assert {t.metadata["task"] for t in held_out} == set(EXPERT_TASKS)
    assert not {t.id for t in train} & {t.id for t in held_out}
    assert not {t.metadata["seed"] for t in train} & {t.metadata["seed"] for t in held_out}
    assert make_env("miniwob").task_names[:3] == ["click-test", "click-test-2", "click-button"]  # easy tier default


@pytest.mark.parametrize("name", EXPERT_TASKS)
def test_expert_solves_task(env, name):
    task = next(t for t in env.tasks("eval") if t.metadata["task"] == name)
    reward, info = play(env, task, MiniWoBExpert(name))
    assert reward == 1.0 and info["correct"], info


def test_same_seed_same_problem(env):
    task = next(t for t in env.tasks("train") if t.metadata["task"] == "login-user")
    first, _ = env.reset(options={"task": task})
    again, _ = env.reset(options={"task": task})
    other, _ = env.reset(options={"task": env.tasks("train")[len(EXPERT_TASKS) * 3 + EXPERT_TASKS.index("login-user")]})
    assert first == again and first != other


def test_random_policy_rarely_succeeds(env):
    """Five random clicks, fills and keys on the easy tier's elements: a minority of episodes, where
    the expert solves all."""
    policy = RandomPolicy(seed=0)
    easy = [t for t in env.tasks("eval") if t.metadata["task"] in TIERS["easy"]][: 2 * len(TIERS["easy"])]
    outcomes = [play(env, task, policy, max_steps=5)[1].get("correct", False) for task in easy]
    assert len(outcomes) == 26
    assert sum(outcomes) / len(outcomes) < 0.5


def test_invalid_actions_become_observations(env):
    task = next(t for t in env.tasks("eval") if t.metadata["task"] == "enter-text")
    obs, _ = env.reset(options={"task": task})
    button = next(line.split("]")[0][1:] for line in obs.splitlines() if "button 'Submit'" in line)
    for action, says in [("I am not sure what to do", "no action found"),
                         ("click('99999')", "no element with bid '99999'"),
                         (f"fill('{button}', 'x')", "failed"),
                         ("goto('http://example.com/')", "outside the site"),
                         ("select_option('3', 'x', 'y')", "takes 2 argument")]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert says in info["last_action_error"] and "last_action_error: " in obs and says in obs
        assert reward == 0.0 and not terminated
    obs, *_ = env.step("scroll(0, 100)")
    assert "last_action_error" not in obs


def test_max_steps_truncates(env):
    short = MiniWoBEnv(tasks=["click-test"], max_steps=2)
    try:
        short.reset(options={"task": short.tasks("eval")[0]})
        assert short.step("noop()")[3] is False
        assert short.step("noop()")[3] is True
        with pytest.raises(RuntimeError):
            short.step("noop()")
    finally:
        short.close()


def test_check_env():
    env = MiniWoBEnv(tasks=["click-test"])
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


def test_screenshots_are_kept(tmp_path):
    env = MiniWoBEnv(tasks=["click-test"], screenshot_dir=str(tmp_path))
    try:
        _, info = env.reset(options={"task": env.tasks("eval")[0]})
        *_, step_info = env.step("noop()")
        assert os.path.getsize(info["screenshot"]) > 1000 and os.path.getsize(step_info["screenshot"]) > 1000
        assert info["screenshot"] != step_info["screenshot"]
    finally:
        env.close()


def test_bad_kwargs_name_the_field():
    with pytest.raises(EnvError, match="unknown MiniWoB task"):
        make_env("miniwob", {"tasks": ["click-tset"]})
    with pytest.raises(EnvError, match="tier must be one of"):
        make_env("miniwob", {"tier": "trivial"})


def test_close_leaves_no_chromium():
    before = set(p.pid for p in browser_processes())
    env = MiniWoBEnv(tasks=["click-test"], recycle_every=7)  # its own host: other settings than the fixture's
    env.reset(options={"task": env.tasks("eval")[0]})
    ours = [p for p in browser_processes() if p.pid not in before]
    assert ours
    env.close()
    assert _gone(ours)


def test_failed_episodes_close_and_the_browser_comes_back():
    before = set(p.pid for p in browser_processes())
    env = MiniWoBEnv(tasks=["click-test"], recycle_every=8)
    task = env.tasks("eval")[0]
    env.reset(options={"task": task})
    ours = [p for p in browser_processes() if p.pid not in before]
    main = min(ours, key=lambda p: p.create_time())  # the browser process; the rest are its children
    main.send_signal(signal.SIGKILL)
    with pytest.raises(Exception):
        env.step("click('1')")  # the rollout records this as a failed trajectory
    obs, _ = env.reset(options={"task": task})  # a new browser
    assert "Click Me!" in obs and env._host.launches == 2
    env.call_timeout = 0.001
    with pytest.raises(TimeoutError):
        env.reset(options={"task": task})
    env.call_timeout = 30.0
    assert env._context is None
    env.close()
    assert _gone(ours + [p for p in browser_processes() if p.pid not in before])


def test_killed_worker_leaves_no_chromium():
    code = ("from posttrain.envs.web import MiniWoBEnv\n"
            "env = MiniWoBEnv(tasks=['click-test'])\n"
            "env.reset(options={'task': env.tasks('eval')[0]})\n"
            "print('ready', flush=True)\n"
            "import time; time.sleep(60)\n")
    worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert worker.stdout.readline().strip() == "ready"
        ours = browser_processes(worker.pid)
        assert ours
        worker.kill()
        worker.wait(10)
        assert _gone(ours)
    finally:
        worker.kill()


def test_recycling_bounds_the_browsers():
    host = BrowserHost(recycle_every=2)
    env = MiniWoBEnv(tasks=["click-test"])
    env._host = host  # drive the env through this host (the shared one is not touched)
    def browsers() -> int:
        return len([p for p in browser_processes() if p.parent() and "chrom" not in p.parent().name()])

    others = browsers()  # the other hosts of this process (the fixture's, ...)
    try:
        for task in env.tasks("train")[:5]:
            env.reset(options={"task": task})
            assert browsers() <= others + 2  # this host's one, or two while the retired one closes
        assert host.launches == 3
    finally:
        env._end_episode()
        env._host = None
        env.close()
        host.close()


def test_rollout_from_worker_threads(tiny_model, tokenizer, env):
    """posttrain's agent loop resets and steps each env from its own short-lived thread."""
    from posttrain.rollout import EnvPool, HFBackend, SamplingParams, run_episodes

    pool = EnvPool(lambda: MiniWoBEnv(tasks=["click-test", "enter-text"], max_steps=2))
    tasks = pool.tasks("eval")[:2]
    trajectories = run_episodes(pool, HFBackend(tiny_model, tokenizer, seed=0), tokenizer, tasks,
                                SamplingParams(max_new_tokens=8), num_samples=2, max_turns=2, step_timeout=30)
    try:
        assert len(trajectories) == 4 and all(t.error is None for t in trajectories)
        # a random model's text is rarely an action: each turn is answered with the page and what was wrong
        assert all(len(t.steps) == 2 and "Accessibility tree:" in t.steps[0].observation for t in trajectories)
        assert all("last_action_error" in s.info for t in trajectories for s in t.steps)
        assert all(t.steps[-1].truncated for t in trajectories)  # max_steps=2: the episode ends truncated
    finally:
        for e in pool.take(4):
            e.close()


def test_concurrent_resets_share_one_browser():
    """Envs reset together (as the rollout does) open their episodes in one browser, not one each."""
    import threading

    host = BrowserHost(recycle_every=100)
    envs = [MiniWoBEnv(tasks=["click-test"]) for _ in range(6)]
    for e in envs:
        e._host = host
    observations = [None] * len(envs)

    def reset(i: int) -> None:
        observations[i], _ = envs[i].reset(options={"task": envs[i].tasks("eval")[i]})

    threads = [threading.Thread(target=reset, args=(i,)) for i in range(len(envs))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert all(o and "Click Me!" in o for o in observations)
        assert host.launches == 1
    finally:
        for e in envs:
            e._end_episode()
            e._host = None
            e.close()
        host.close()


def _first_observation(task):
    name = task.metadata["task"]
    env = MiniWoBEnv(tasks=[name])
    try:
        play(env, env.tasks("eval")[0], MiniWoBExpert(name))
        return env.reset(options={"task": task})[0]  # in the page the first episode used
    finally:
        env.close()


def test_episodes_of_one_task_reuse_the_page_and_start_afresh():
    env = MiniWoBEnv(tasks=["click-button", "enter-text"], recycle_every=3, pages_kept=1)
    try:
        buttons = [t for t in env.tasks("eval") if t.metadata["task"] == "click-button"]
        pages, goals = [], []
        for task in buttons[:3]:
            total, _ = play(env, task, MiniWoBExpert("click-button"))
            assert total == 1.0  # solved in the reused page as in a fresh one
            pages.append(env._page)
            goals.append(env.goal)
        assert pages[0] is pages[1] is pages[2] and len(set(goals)) > 1  # same page, new seeded problems
        obs, _ = env.reset(options={"task": buttons[3]})  # a fourth episode: the page served its three
        assert env._page is not pages[0]
        other = next(t for t in env.tasks("eval") if t.metadata["task"] == "enter-text")
        fresh = MiniWoBEnv(tasks=["click-button", "enter-text"], reuse_page=False)
        try:  # what a reused page shows (bids included) is what a freshly loaded one shows; enter-text
            # restarts with the Submit button the last episode clicked, which must not keep the focus
            site = re.compile(r"127\.0\.0\.1:\d+")  # each env serves the pages on a port of its own
            for task in (buttons[2], other):
                reused = _first_observation(task)
                assert site.sub("", fresh.reset(options={"task": task})[0]) == site.sub("", reused)
        finally:
            fresh.close()
        env.step("click('9999')")  # an episode left running is not reused: its page closes with it
        total, _ = play(env, other, MiniWoBExpert("enter-text"))
        assert total == 1.0
        page = env._page
        total, _ = play(env, buttons[4], MiniWoBExpert("click-button"))  # another task's page, same tab
        assert total == 1.0 and env._page is page and page.url.endswith("/click-button.html")
    finally:
        env.close()


def test_alternating_tasks_restart_in_their_own_kept_pages():
    """Tasks of a run alternate episode by episode; each task keeps its page, so a task seen before
    restarts without a page load. Beyond ``pages_kept`` tasks, the page parked longest loads the new one."""
    env = MiniWoBEnv(tasks=["click-button", "click-link", "enter-text"], pages_kept=2)
    try:
        by_name = {n: [t for t in env.tasks("eval") if t.metadata["task"] == n] for n in env.task_names}
        pages: dict[str, list] = {}
        for i in range(2):
            for name in ("click-button", "click-link"):
                total, _ = play(env, by_name[name][i], MiniWoBExpert(name))
                assert total == 1.0
                pages.setdefault(name, []).append(env._page)
        assert pages["click-button"][0] is pages["click-button"][1] is not pages["click-link"][0]
        assert pages["click-link"][0] is pages["click-link"][1]
        total, _ = play(env, by_name["enter-text"][0], MiniWoBExpert("enter-text"))
        assert total == 1.0 and env._page is pages["click-button"][0] and env._page.url.endswith("/enter-text.html")
        assert len(env._context.pages) == 2
        total, _ = play(env, by_name["click-link"][2], MiniWoBExpert("click-link"))
        assert total == 1.0 and env._page is pages["click-link"][0]
    finally:
        env.close()


def test_envs_spread_over_the_process_browsers():
    """Env workers of one process queue on their browser's thread: up to ``browsers`` Chromiums run,
    the envs spread over them, and each closes with its last env."""
    envs = [MiniWoBEnv(tasks=["click-test"], browsers=2, recycle_every=77) for _ in range(3)]
    try:
        for e in envs:
            total, _ = play(e, e.tasks("eval")[0], MiniWoBExpert("click-test"))
            assert total == 1.0
        hosts = [e._host for e in envs]
        assert hosts[0] is not hosts[1] and hosts[2] in hosts[:2]
        assert all(h.launches == 1 for h in hosts)
    finally:
        for e in envs:
            e.close()
    assert all(h._closed for h in hosts)
