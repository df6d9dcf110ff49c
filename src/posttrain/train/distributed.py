"""Data-parallel training through torch.distributed: ``torchrun --nproc_per_node N -m posttrain.cli train``.

Each rank samples its own share of the training tasks (a disjoint slice) and its share of every
step's batch; the loss of every micro-batch is divided by the minibatch's *global* token and
sequence counts (summed over ranks), so that summing the ranks' gradients gives exactly the
gradient of one process on the global batch. Gradients are summed with one all-reduce per optimiser
step (a flat buffer), or, with ``train.fsdp``, reduce-scattered by FSDP2 (``fully_shard``, Zhao et
al. 2023) and scaled from its mean back to the same sum. Rank 0 alone writes metrics,
checkpoints and the trajectory store; evaluation is split across ranks and gathered.

Backends: gloo on CPU, NCCL on GPUs. Outside torchrun (no ``WORLD_SIZE``) everything here is a
single process and every collective returns its input.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
import torch.distributed as dist

from posttrain.config import ConfigError, RunConfig


class Distributed:
    """The run's process group; world 1 when not launched by torchrun."""

    def __init__(self, cfg: RunConfig):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.fsdp = cfg.train.fsdp
        self._started = False
        if self.world == 1:
            if cfg.train.fsdp:
                raise ConfigError("train.fsdp shards the model across processes: launch with torchrun "
                                  "--nproc_per_node N (N >= 2)")
            return
        _check_divisible(cfg, self.world)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
            self._started = True

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: list) -> list:
        """This rank's disjoint share: items rank, rank + world, ..."""
        return items[self.rank :: self.world]

    # ------------------------------------------------------------------ collectives (identity at world 1)

    def sum(self, value: float) -> float:
        if not self.enabled:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t)

    def max(self, value: int) -> int:
        if not self.enabled:
            return value
        t = torch.tensor([int(value)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t)

    def gather(self, obj) -> list:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum the gradients of ``params`` over ranks in one flat all-reduce (a missing grad counts as 0).
        Sharded parameters (FSDP2 DTensors) were reduce-scattered by FSDP during backward as a mean over
        ranks; they are scaled back to the sum here (gloo has no pre-multiplied sum for FSDP's divide factor)."""
        if not self.enabled:
            return
        for p in params:
            if _is_dtensor(p) and p.grad is not None:
                p.grad.mul_(self.world)
        params = [p for p in params if not _is_dtensor(p)]
        if not params:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def clip_grad_norm(self, params: list[torch.nn.Parameter], limit: float) -> float:
        """``torch.nn.utils.clip_grad_norm_`` over the global gradient: with FSDP the squared norms of the
        local shards are summed over ranks and the replicated gradients counted once."""
        params = [p for p in params if p.grad is not None]
        if not self.fsdp:
            return float(torch.nn.utils.clip_grad_norm_(params, limit))
        sharded = sum(float(p.grad.to_local().float().pow(2).sum()) for p in params if _is_dtensor(p))
        replicated = sum(float(p.grad.float().pow(2).sum()) for p in params if not _is_dtensor(p))
        total = (self.sum(sharded) + replicated) ** 0.5
        scale = limit / (total + 1e-6)
        if scale < 1.0:
            for p in params:
                p.grad.mul_(scale)
        return total

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        """Start every rank from rank 0's weights (random initialisations, LoRA adapters); before sharding."""
        if self.enabled:
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, 0)

    # ------------------------------------------------------------------ FSDP2

    def shard_model(self, model: torch.nn.Module) -> None:
        """With train.fsdp: one FSDP2 unit per decoder layer (where the weights are), gradients summed.

        The embeddings, final norm and LM head stay replicated (all-reduced like plain data parallel):
        the trainer reads the head's weight directly for its chunked log-probabilities, outside any
        module forward that FSDP could hook."""
        if not self.fsdp:
            return
        from torch.distributed.fsdp import fully_shard

        for layer in _decoder_layers(model):
            fully_shard(layer)

    @contextmanager
    def full_weights(self, model: torch.nn.Module):
        """Generation, no-gradient passes and saving run on the gathered weights, with no collective
        inside (ranks generate different lengths); the update itself stays sharded. This holds the
        whole model on each rank for that time, as DeepSpeed ZeRO-3 generation does in TRL."""
        if not self.fsdp:
            yield
            return
        modules = _fsdp_modules(model)
        for m in modules:
            m.set_reshard_after_forward(False, recurse=False)
            m.unshard()
        try:
            yield
        finally:
            for m in modules:
                m.reshard()
                m.set_reshard_after_forward(True, recurse=False)

    def full_state_dict(self, model: torch.nn.Module) -> dict | None:
        """With FSDP, the whole model's weights gathered to CPU (every rank takes part); else None
        (the model's own state dict is whole)."""
        if not self.fsdp:
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def close(self) -> None:
        if self._started:
            dist.destroy_process_group()
            self._started = False


def _check_divisible(cfg: RunConfig, world: int) -> None:
    t = cfg.train
    if t.tasks_per_step % world:
        raise ConfigError(f"train.tasks_per_step ({t.tasks_per_step}) must be a multiple of the {world} "
                          "data-parallel processes (each samples its share)")
    if t.minibatch_size % world:
        raise ConfigError(f"train.minibatch_size ({t.minibatch_size}) must be a multiple of the {world} "
                          "data-parallel processes")
    if cfg.algorithm.dynamic_sampling:
        raise ConfigError("algorithm.dynamic_sampling is not supported with data-parallel processes yet (a rank "
                          "could drop every group it sampled): set algorithm.dynamic_sampling=false")
    if cfg.model.lora.enabled and t.fsdp:
        raise ConfigError("train.fsdp shards full weights; with LoRA the base is frozen and small adapters train: "
                          "use plain data parallel (train.fsdp=false)")
    if t.async_steps:
        raise ConfigError("train.async_steps is not supported with data-parallel processes yet: set "
                          "train.async_steps=0 under torchrun")
    if cfg.eval.num_tasks < world:
        raise ConfigError(f"eval.num_tasks ({cfg.eval.num_tasks}) must be at least the {world} processes")


def _is_dtensor(p: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(p, DTensor)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    base = getattr(model, "get_base_model", lambda: model)()
    return list(base.get_decoder().layers)


def _fsdp_modules(model: torch.nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]
