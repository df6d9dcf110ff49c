"""Running statistics of a training step, merged over micro-batches and minibatches."""

from __future__ import annotations


class RunningStats:
    """Weighted means over micro-batches; keys ending in _min/_max keep the extreme instead."""

    def __init__(self) -> None:
        self._sum: dict[str, float] = {}
        self._weight: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def add(self, key: str, value: float, weight: float = 1.0) -> None:
        self._count[key] = self._count.get(key, 0) + 1
        if key.endswith("_min") or key.endswith("_max"):
            pick = min if key.endswith("_min") else max
            self._sum[key] = pick(self._sum.get(key, value), value)
            self._weight[key] = 1.0
            return
        self._sum[key] = self._sum.get(key, 0.0) + value * weight
        self._weight[key] = self._weight.get(key, 0.0) + weight

    def count(self, key: str) -> int:
        return self._count.get(key, 0)

    def result(self) -> dict[str, float]:
        return {k: self._sum[k] / self._weight[k] if self._weight[k] else 0.0 for k in self._sum}
