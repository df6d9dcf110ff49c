"""Data that outlives a run: the trajectory store, preference pairs, demonstrations."""

from posttrain.data.store import TrajectoryStore

__all__ = ["TrajectoryStore"]
