"""The training loop and its checkpoints."""

from posttrain.train.trainer import Trainer, TrainResult

__all__ = ["TrainResult", "Trainer"]
