"""Web environment throughput and browser memory, beside MiniWoB++'s own Selenium environment.

Throughput: scripted experts play whole episodes (resets included) with 1 and 2 workers; a
worker is a thread with its own env instance, as posttrain's rollout runs them (the workers of a
process share one Chromium; MiniWoB episodes reuse their worker's tab, shop episodes get a fresh
browser context each). Three envs:

- ``miniwob``: posttrain's MiniWoB++ env on the expert-solvable easy tasks (Playwright, accessibility tree;
  a tab kept per task, each loaded before the clock starts, as the reference's pages are);
- ``web_shop``: the shop, about nine page loads per episode;
- ``miniwob-selenium``: the ``miniwob`` package's gymnasium env (Selenium + chromedriver, one browser
  per env, the page reused across episodes) on the same tasks, clicking/typing by element ref.

Memory: ``--memory-episodes`` MiniWoB episodes in one env, recycling the browser every
``--recycle`` episodes and never; memory of all Chromium processes after each episode, as summed
RSS (pages shared between processes counted in each) and summed PSS (shared pages split).

    python benchmarks/web.py [--episodes 40] [--repeats 3] [--memory-episodes 200] [--recycle 50]
        [--out benchmarks/results/web.json]

Wall times depend on what else runs on the machine: the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import threading
import time
from pathlib import Path

from machine import console, write_json  # benchmarks/machine.py: tables unwrapped in a log
from rich.table import Table

from posttrain.envs.web import MiniWoBEnv, WebShopEnv
from posttrain.envs.web.browser import browser_memory_mb
from posttrain.envs.web.experts import MiniWoBExpert, ShopExpert

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("click-test", "click-test-2", "click-button", "click-link", "enter-text", "focus-text", "login-user")


def posttrain_worker(kind: str, episodes: int, offset: int, stats: dict, ready: threading.Barrier) -> None:
    env = MiniWoBEnv(tasks=list(TASKS), eval_seeds=200) if kind == "miniwob" else WebShopEnv(num_eval=200)
    tasks = env.tasks("eval")[offset: offset + episodes]
    try:
        # The browser starts before the clock does and, for MiniWoB, each task's tab is loaded, as the
        # Selenium reference below starts one env (and browser) per task with its page loaded.
        warm_up = env.tasks("train")[:len(TASKS) if kind == "miniwob" else 1]  # train tasks go through TASKS in turn
        for task in warm_up:
            env.reset(options={"task": task})
        ready.wait()
        stats["start"] = time.perf_counter()
        for task in tasks:
            start = time.perf_counter()
            obs, _ = env.reset(options={"task": task})
            stats["reset"].append(time.perf_counter() - start)
            policy = MiniWoBExpert(task.metadata["task"]) if kind == "miniwob" else ShopExpert()
            for _ in range(20):
                start = time.perf_counter()
                obs, reward, terminated, truncated, info = env.step(policy.act(obs))
                stats["step"].append(time.perf_counter() - start)
                if terminated or truncated:
                    break
            stats["solved"] += bool(info.get("correct"))
            stats["episodes"] += 1
        stats["end"] = time.perf_counter()
    finally:
        env.close()


def _selenium_actions(env, name: str, obs: dict) -> list:
    """The expert's plan for MiniWoB's own env: element refs from its DOM listing."""
    import re

    from miniwob.action import ActionTypes

    goal, elements = obs["utterance"], obs["dom_elements"]
    quoted = re.findall(r'"([^"]*)"', goal)

    def ref(tag: str, text: str | None = None, nth: int = 0) -> int:
        return [e["ref"] for e in elements if e["tag"] == tag and (text is None or e["text"] == text)][nth]

    click = lambda r: env.unwrapped.create_action(ActionTypes.CLICK_ELEMENT, ref=r)  # noqa: E731
    fill = lambda r, text: env.unwrapped.create_action(ActionTypes.FOCUS_ELEMENT_AND_TYPE_TEXT, ref=r, text=text)  # noqa: E731
    if name == "click-test":
        return [click(ref("button"))]
    if name == "click-test-2":
        return [click(ref("button", re.search(r"button (\S+?)\.", goal).group(1)))]
    if name == "click-button":
        return [click(ref("button", quoted[0]))]
    if name == "click-link":
        return [click(ref("span", quoted[0]))]
    if name == "focus-text":
        return [click(ref("input_text"))]
    if name == "enter-text":
        return [fill(ref("input_text"), quoted[0]), click(ref("button", "Submit"))]
    return [fill(ref("input_text", nth=0), quoted[0]), fill(ref("input_password"), quoted[1]),
            click(ref("button", "Login"))]


def selenium_worker(episodes: int, offset: int, stats: dict, ready: threading.Barrier) -> None:
    import gymnasium
    import miniwob

    os.environ.setdefault("MINIWOB_CHROME_BINARY", "/usr/lib/chromium/chromium")
    os.environ.setdefault("MINIWOB_CHROMEDRIVER", "/usr/bin/chromedriver")
    gymnasium.register_envs(miniwob)
    envs = {name: gymnasium.make(f"miniwob/{name}-v1") for name in TASKS}
    try:
        for env in envs.values():
            env.reset(seed=0)  # each env starts its browser before the clock does
        ready.wait()
        stats["start"] = time.perf_counter()
        for i in range(offset, offset + episodes):
            name = TASKS[i % len(TASKS)]
            env = envs[name]
            start = time.perf_counter()
            obs, _ = env.reset(seed=1_000_000 + i // len(TASKS))
            stats["reset"].append(time.perf_counter() - start)
            reward, terminated = 0.0, False
            for action in _selenium_actions(env, name, obs):
                start = time.perf_counter()
                obs, reward, terminated, truncated, _ = env.step(action)
                stats["step"].append(time.perf_counter() - start)
                if terminated:
                    break
            stats["solved"] += reward > 0
            stats["episodes"] += 1
        stats["end"] = time.perf_counter()
    finally:
        for env in envs.values():
            env.close()


def throughput(kind: str, workers: int, episodes: int) -> dict:
    stats = [{"reset": [], "step": [], "solved": 0, "episodes": 0} for _ in range(workers)]
    per = episodes // workers
    ready = threading.Barrier(workers)

    def work(i: int) -> None:
        if kind == "miniwob-selenium":
            selenium_worker(per, i * per, stats[i], ready)
        else:
            posttrain_worker(kind, per, i * per, stats[i], ready)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = max(s["end"] for s in stats) - min(s["start"] for s in stats)  # browser start-up excluded
    steps = sum(len(s["step"]) for s in stats)
    done = sum(s["episodes"] for s in stats)
    return {"env": kind, "workers": workers, "episodes": done, "solved": sum(s["solved"] for s in stats),
            "steps": steps, "wall_s": wall, "steps_per_s": steps / wall, "episodes_per_s": done / wall,
            "reset_median_s": statistics.median(x for s in stats for x in s["reset"]),
            "step_median_s": statistics.median(x for s in stats for x in s["step"])}


def memory(episodes: int, recycle: int) -> dict:
    env = MiniWoBEnv(tasks=list(TASKS), eval_seeds=episodes, recycle_every=recycle)
    samples = []
    try:
        for task in env.tasks("eval")[:episodes]:
            obs, _ = env.reset(options={"task": task})
            policy = MiniWoBExpert(task.metadata["task"])
            for _ in range(5):
                obs, _, terminated, truncated, _ = env.step(policy.act(obs))
                if terminated or truncated:
                    break
            samples.append(browser_memory_mb())
        launches = env._host.launches
    finally:
        env.close()
    rss, pss = [s[0] for s in samples], [s[1] for s in samples]
    return {"recycle_every": recycle, "episodes": len(samples), "launches": launches, "peak_rss_mb": max(rss),
            "peak_pss_mb": max(pss), "first_10_rss_mb": statistics.mean(rss[:10]),
            "last_10_rss_mb": statistics.mean(rss[-10:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=40, help="episodes per configuration and repeat")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration; the median is reported")
    parser.add_argument("--memory-episodes", type=int, default=200)
    parser.add_argument("--recycle", type=int, default=50, help="browser recycled every N episodes")
    parser.add_argument("--envs", default="miniwob,web_shop,miniwob-selenium")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/web.json"))
    args = parser.parse_args()
    screen = console()
    if "miniwob-selenium" in args.envs.split(",") and not shutil.which("chromedriver"):
        parser.error("the miniwob-selenium row needs chromedriver (apt-get install chromium-driver); "
                     "or leave it out: --envs miniwob,web_shop")
    load_before = os.getloadavg()[0]
    rows = []
    for kind in args.envs.split(","):
        for workers in (1, 2):
            runs = [throughput(kind, workers, args.episodes) for _ in range(args.repeats)]
            best = sorted(runs, key=lambda r: r["steps_per_s"])[len(runs) // 2]  # the median run
            rows.append({**best, "steps_per_s_runs": [r["steps_per_s"] for r in runs]})
            screen.print(f"{kind} x{workers}: {best['steps_per_s']:.1f} steps/s")
    mem = [memory(args.memory_episodes, args.recycle), memory(args.memory_episodes, 10**9)]
    load_after = os.getloadavg()[0]

    table = Table(title=f"web env throughput (median of {args.repeats}; load average {load_before:.1f} before, "
                        f"{load_after:.1f} after)")
    for col in ("env", "workers", "solved", "steps/s", "episodes/s", "reset median", "step median"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["env"], str(r["workers"]), f"{r['solved']}/{r['episodes']}", f"{r['steps_per_s']:.1f}",
                      f"{r['episodes_per_s']:.2f}", f"{r['reset_median_s'] * 1000:.0f} ms",
                      f"{r['step_median_s'] * 1000:.0f} ms")
    screen.print(table)
    mtable = Table(title=f"Chromium resident memory over {args.memory_episodes} MiniWoB episodes")
    for col in ("recycle every", "launches", "peak RSS", "peak PSS", "RSS, first 10 episodes", "RSS, last 10"):
        mtable.add_column(col)
    for m in mem:
        mtable.add_row("never" if m["recycle_every"] >= 10**9 else str(m["recycle_every"]), str(m["launches"]),
                       f"{m['peak_rss_mb']:.0f} MB", f"{m['peak_pss_mb']:.0f} MB", f"{m['first_10_rss_mb']:.0f} MB",
                       f"{m['last_10_rss_mb']:.0f} MB")
    screen.print(mtable)
    write_json(args.out, {"throughput": rows, "memory": mem, "load_before": load_before, "load_after": load_after})


if __name__ == "__main__":
    main()
