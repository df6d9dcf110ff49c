"""Rollout workers: generation backends in Ray actors, each with its own copy of the policy.

``rollout.workers: N`` starts N actors that load ``model.name`` and wrap it in an
:class:`~posttrain.rollout.HFBackend`. :class:`RolloutWorkers` is itself a generation backend: it
splits each call's prompts into N contiguous shares, generates them at once and concatenates the
results in order. Weights move through Ray's object store: the whole state dict once at start (so a
worker matches the trainer exactly, whatever its own initialisation), then after every update only
the trainable tensors (all weights in full fine-tuning, the adapters with LoRA), one ``ray.put``
read by every worker. That copy is the cost of this design: for SmolLM2-135M in float32 it moves
about 0.5 GB per update; a GPU engine with in-place weight updates (vLLM) avoids it.
"""

from __future__ import annotations

import torch

from posttrain.config import RunConfig
from posttrain.rollout.backend import Generation, SamplingParams


class GenerationHost:
    """The actor: a policy copy and an HF backend over it."""

    def __init__(self, cfg: RunConfig, batch_size: int, seed: int, sys_path: list[str]):
        import sys

        for p in reversed(sys_path):
            if p not in sys.path:
                sys.path.insert(0, p)
        from posttrain.models import Policy
        from posttrain.rollout.hf_backend import HFBackend

        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.policy = Policy.load(cfg.model)
        self.policy.model.eval().requires_grad_(False)
        self.backend = HFBackend(self.policy.model, self.policy.tokenizer, batch_size, seed, cfg.model.pack_weights,
                                 decode_dtype=cfg.rollout.decode_dtype)

    def load_weights(self, state: dict[str, torch.Tensor]) -> int:
        """Copy ``state`` (a full or partial state dict) into the model; returns the tensors copied."""
        missing = set(state) - set(self.policy.model.state_dict())
        if missing:
            raise KeyError(f"rollout worker: unknown weights {sorted(missing)[:3]}")
        self.policy.model.load_state_dict(state, strict=False)
        return len(state)

    def generate(self, prompts: list[list[int]], params: SamplingParams, num_samples: int) -> list[Generation]:
        return self.backend.generate(prompts, params, num_samples)


class RolloutWorkers:
    """A :class:`~posttrain.rollout.GenerationBackend` over ``cfg.rollout.workers`` Ray actors."""

    same_logprobs_as_trainer = True  # the same HF model and kernels, on the weights of the last update

    def __init__(self, cfg: RunConfig, policy, batch_size: int):
        from posttrain.rollout.ray_runtime import RayRuntime, import_ray

        self.ray = import_ray()
        self.policy = policy
        host = self.ray.remote(GenerationHost).options(num_cpus=0, scheduling_strategy="SPREAD")
        self.workers = [host.remote(cfg, batch_size, cfg.seed + 1 + i, RayRuntime.worker_sys_path())
                        for i in range(cfg.rollout.workers)]
        self.version = 0
        self._send({k: v.detach() for k, v in policy.model.state_dict().items()})

    def _send(self, state: dict[str, torch.Tensor]) -> None:
        ref = self.ray.put({k: v.cpu() for k, v in state.items()})
        self.ray.get([w.load_weights.remote(ref) for w in self.workers])

    def sync_weights(self) -> None:
        """Send the trainable weights after an update; the workers generate with them from the next call on."""
        self._send({n: p.detach() for n, p in self.policy.model.named_parameters() if p.requires_grad})
        self.version += 1

    def generate(self, prompts: list[list[int]], params: SamplingParams, num_samples: int = 1) -> list[Generation]:
        n = len(self.workers)
        share = -(-len(prompts) // n)
        parts = [prompts[i : i + share] for i in range(0, len(prompts), share)]
        futures = [w.generate.remote(part, params, num_samples) for w, part in zip(self.workers, parts)]
        return [g for out in self.ray.get(futures) for g in out]

    def close(self) -> None:
        for w in self.workers:
            self.ray.kill(w, no_restart=True)
        self.workers = []
