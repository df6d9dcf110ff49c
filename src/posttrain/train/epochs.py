"""Passes over a fixed set of examples, as the offline and reward-model trainers take them."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Any

from posttrain.types import Trajectory


def epoch_batches(n: int, batch_size: int, epochs: int, rng: random.Random) -> Iterator[tuple[int, list[int]]]:
    """``(epoch, example indices)`` for every batch of ``epochs`` passes over ``n`` examples, each pass in an
    order ``rng`` shuffles anew; the last batch of a pass may be smaller."""
    for epoch in range(epochs):
        order = list(range(n))
        rng.shuffle(order)
        for start in range(0, n, batch_size):
            yield epoch, order[start : start + batch_size]


def examples_digest(rows: list[Trajectory], labels: Any = None) -> str:
    """What a run trained on, in a few bytes: the token ids and loss masks of ``rows`` in order (and the labels
    trained towards, if any), so that a resumed run can tell whether its examples are still the same."""
    digest = hashlib.sha256()
    for t in rows:
        digest.update(repr((t.prompt_ids, t.completion_ids, t.loss_mask)).encode())
    if labels is not None:
        digest.update(repr(labels).encode())
    return digest.hexdigest()
