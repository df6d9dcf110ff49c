"""Trajectory sampling: generation backends and the episode loop."""

from posttrain.rollout.backend import Generation, GenerationBackend, SamplingParams
from posttrain.rollout.episodes import EnvPool, encode_prompt, observation_delta, run_episodes
from posttrain.rollout.factory import BackendUnavailable, check_backend, make_backend, sampler_dtype
from posttrain.rollout.hf_backend import HFBackend

__all__ = [
    "BackendUnavailable",
    "EnvPool",
    "Generation",
    "GenerationBackend",
    "HFBackend",
    "SamplingParams",
    "check_backend",
    "encode_prompt",
    "make_backend",
    "observation_delta",
    "run_episodes",
    "sampler_dtype",
]
