"""Per-role metrics of multi-agent games: win/draw/loss rates, payoff, invalid-move rate."""

from __future__ import annotations

from posttrain.types import AgentOutcome, GameResult


def _summary(outcomes: list[AgentOutcome]) -> dict[str, float]:
    n = max(len(outcomes), 1)
    turns = sum(o.turns for o in outcomes)
    out = {
        "games": float(len(outcomes)),
        "payoff": sum(o.payoff for o in outcomes) / n,
        "reward": sum(o.reward for o in outcomes) / n,
        "invalid_rate": sum(o.invalid_moves for o in outcomes) / max(turns, 1),
    }
    if any(o.outcome is not None for o in outcomes):  # games with a winner; cooperative ones have none
        for result in ("win", "draw", "loss"):
            out[result] = sum(o.outcome == result for o in outcomes) / n
    return out


def game_metrics(games: list[GameResult], players: set[str]) -> dict[str, float]:
    """Metrics of the seats played by ``players`` (the policy's names), overall and per role as
    ``ROLE/KEY``; ``errors`` counts games an env failure ended."""
    seats = [o for g in games if g.error is None for o in g.outcomes.values() if o.player in players]
    metrics = _summary(seats)
    for role in sorted({o.role for o in seats}):
        metrics.update({f"{role}/{k}": v for k, v in _summary([o for o in seats if o.role == role]).items()})
    trajectories = [t for g in games for t in g.trajectories.values() if t.metadata["player"] in players]
    metrics["errors"] = float(sum(g.error is not None for g in games))
    metrics["completion_tokens"] = float(sum(t.num_sampled_tokens for t in trajectories))
    metrics["truncated_fraction"] = sum(t.finish_reason == "max_context" for t in trajectories) / max(
        len(trajectories), 1)
    return metrics
