"""Trajectory sampling: generation backends and the episode loop."""

from posttrain.rollout.backend import Generation, GenerationBackend, SamplingParams
from posttrain.rollout.episodes import encode_prompt, run_episodes
from posttrain.rollout.hf_backend import HFBackend

__all__ = ["Generation", "GenerationBackend", "HFBackend", "SamplingParams", "encode_prompt", "run_episodes"]
