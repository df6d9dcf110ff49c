"""Evaluation: held-out success rates and pass@k (and, later, the HTML run report)."""

from posttrain.eval.evaluate import EvalResult, evaluate
from posttrain.eval.pass_at_k import mean_pass_at_k, pass_at_k

__all__ = ["EvalResult", "evaluate", "mean_pass_at_k", "pass_at_k"]
