"""Evaluation: held-out success rates (and, later, pass@k and the HTML run report)."""

from posttrain.eval.evaluate import EvalResult, evaluate

__all__ = ["EvalResult", "evaluate"]
