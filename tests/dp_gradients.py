"""Run by tests/test_distributed.py: the gradients of one update on a fixed global batch, written to OUT.

Under torchrun each rank takes its share of the batch's groups (as its sampler would give it) and rank
0 writes the summed gradients; run as a plain script it is one process on the whole batch.
Usage: python dp_gradients.py OUT [key=value overrides...]
"""

import sys
from pathlib import Path

import torch

from posttrain.config import load_config
from posttrain.train import Trainer
from posttrain.types import Step, Task, Trajectory

ROOT = Path(__file__).resolve().parents[1]


def global_batch(group_size: int, groups: int, vocab: int) -> list[Trajectory]:
    """Fixed trajectories of random tokens with varied lengths and 0/1 rewards (seeded, the same everywhere)."""
    gen = torch.Generator().manual_seed(1234)
    out = []
    for k in range(groups):
        prompt = torch.randint(3, vocab, (5 + k,), generator=gen).tolist()
        for i in range(group_size):
            n = 3 + (i * 5 + k) % 7
            completion = torch.randint(3, vocab, (n,), generator=gen).tolist()
            reward = float((i + k) % 3 == 0)
            out.append(Trajectory(Task(f"t{k}", "p"), prompt, completion, [1] * n, [0.0] * n,
                                  steps=[Step("a", "", reward, True, False, {})], reward=reward))
    return out


def main() -> None:
    out_path, overrides = sys.argv[1], sys.argv[2:]
    cfg = load_config(ROOT / "examples" / "tiny_smoke.yaml", [
        "algorithm.beta=0", "algorithm.group_size=4", "train.tasks_per_step=4", "train.microbatch_size=3",
        "train.max_grad_norm=1e9", f"output_dir={Path(out_path).parent / 'run'}", *overrides])
    trainer = Trainer(cfg)
    dist = trainer.dist
    g = cfg.algorithm.group_size
    trajectories = global_batch(g, cfg.train.tasks_per_step, trainer.policy.model.config.vocab_size)
    groups = [trajectories[i : i + g] for i in range(0, len(trajectories), g)]
    mine = [t for group in dist.shard(groups) for t in group]
    batch = trainer.batch(mine)
    rewards = torch.tensor([t.reward for t in mine])
    trainer.algorithm.prepare(batch, rewards, [t.step_rewards for t in mine], trainer)
    grads = []
    params = trainer.optimizer.param_groups[0]["params"]

    def capture(*_):
        full = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in params]
        grads.append(torch.cat([x.reshape(-1) for x in full]).clone())

    trainer.optimizer.register_step_pre_hook(capture)
    metrics = trainer.update(batch)
    if dist.is_main:
        torch.save({"grads": grads, "loss": metrics["loss"]}, out_path)
    trainer.ctx.close()


if __name__ == "__main__":
    main()
