"""Trajectory sampling: generation backends and the episode loop."""

from posttrain.rollout.backend import Generation, GenerationBackend, SamplingParams
from posttrain.rollout.episodes import EnvPool, encode_prompt, observation_delta, run_episodes
from posttrain.rollout.hf_backend import HFBackend

__all__ = [
    "EnvPool",
    "Generation",
    "GenerationBackend",
    "HFBackend",
    "SamplingParams",
    "encode_prompt",
    "observation_delta",
    "run_episodes",
]
