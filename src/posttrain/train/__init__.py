"""The training loops, the run context they share, and their checkpoints."""

from posttrain.train.context import RunContext, TrainResult
from posttrain.train.trainer import Trainer

__all__ = ["RunContext", "TrainResult", "Trainer"]
