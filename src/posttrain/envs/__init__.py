"""Gymnasium text environments and their registry."""

from posttrain.envs.base import TextEnv
from posttrain.envs.contract import EnvError
from posttrain.envs.registry import env_is_multi_agent, is_multi_agent, make_env, register, registered

__all__ = ["EnvError", "TextEnv", "env_is_multi_agent", "is_multi_agent", "make_env", "register", "registered"]
