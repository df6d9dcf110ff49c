"""Rewards: verifiable checks of answers (and, later, process and learned rewards)."""

from posttrain.rewards.verifiable import exact_match_reward, extract_final_number, parse_number

__all__ = ["exact_match_reward", "extract_final_number", "parse_number"]
