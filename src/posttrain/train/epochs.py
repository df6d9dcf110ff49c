"""Passes over a fixed set of examples, as the offline and reward-model trainers take them."""

from __future__ import annotations

import random
from collections.abc import Iterator


def epoch_batches(n: int, batch_size: int, epochs: int, rng: random.Random) -> Iterator[tuple[int, list[int]]]:
    """``(epoch, example indices)`` for every batch of ``epochs`` passes over ``n`` examples, each pass in an
    order ``rng`` shuffles anew; the last batch of a pass may be smaller."""
    for epoch in range(epochs):
        order = list(range(n))
        rng.shuffle(order)
        for start in range(0, n, batch_size):
            yield epoch, order[start : start + batch_size]
