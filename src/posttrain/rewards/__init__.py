"""Rewards: verifiable checks of answers, process and learned reward models, judges, and their composition."""

from posttrain.rewards.verifiable import exact_match_reward, extract_final_number, parse_number

__all__ = ["exact_match_reward", "extract_final_number", "parse_number"]
