"""Gymnasium text environments and their registry."""

from posttrain.envs.base import TextEnv
from posttrain.envs.registry import EnvError, make_env, register, registered

__all__ = ["EnvError", "TextEnv", "make_env", "register", "registered"]
