"""Past versions of the policy as opponents, and one LoRA adapter per role.

A pool snapshot is a copy of the trainable weights (the LoRA adapters, or the whole model without
LoRA). A pool player generates after :meth:`PolicyPool.activate` has copied its snapshot into the
model, and the policy's own players call :meth:`PolicyPool.activate_live` first, which puts the
current weights back: one model in memory, whichever version is playing.
"""

from __future__ import annotations

from collections import deque

import torch

from posttrain.rollout.multi_agent import LLMPlayer


class PolicyPool:
    def __init__(self, model: torch.nn.Module, params: list[torch.nn.Parameter], size: int):
        self.model, self.params = model, params
        self.snapshots: deque[list[torch.Tensor]] = deque(maxlen=size)
        self._live: list[torch.Tensor] | None = None  # the current weights while a snapshot is loaded
        self._loaded: int | None = None
        self.added = 0

    def __len__(self) -> int:
        return len(self.snapshots)

    @torch.no_grad()
    def add(self) -> None:
        """Keep a copy of the current weights (the oldest copy goes when the pool is full)."""
        self.activate_live()
        self.snapshots.append([p.detach().clone() for p in self.params])
        self.added += 1

    @torch.no_grad()
    def activate(self, k: int) -> None:
        if self._loaded == k:
            return
        if self._live is None:
            self._live = [p.detach().clone() for p in self.params]
        for p, saved in zip(self.params, self.snapshots[k]):
            p.copy_(saved)
        self._loaded = k

    @torch.no_grad()
    def activate_live(self) -> None:
        if self._live is not None:
            for p, saved in zip(self.params, self._live):
                p.copy_(saved)
        self._live, self._loaded = None, None

    def player(self, k: int, role: str, backend, per_role: bool) -> LLMPlayer:
        """Snapshot ``k`` playing ``role`` (with that role's adapter when every role has its own)."""
        def prepare() -> None:
            self.activate(k)
            if per_role:
                self.model.set_adapter(adapter_name(role))

        return LLMPlayer(f"pool-{k}:{role}" if per_role else f"pool-{k}", backend, prepare)


def adapter_name(role: str) -> str:
    """The LoRA adapter of ``role`` (peft warns about names inside its "lora_" prefix, such as "o")."""
    return f"role_{role}"


def add_role_adapters(model, roles: list[str]) -> None:
    """Give a peft model one LoRA adapter per role (configured like its ``default`` adapter), in
    place of ``default``; the first role's adapter is active."""
    config = model.peft_config["default"]
    for role in roles:
        model.add_adapter(adapter_name(role), config)
    model.set_adapter(adapter_name(roles[0]))
    model.delete_adapter("default")
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.requires_grad_(True)
