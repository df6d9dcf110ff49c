"""Gymnasium text environments and their registry."""

from posttrain.envs.base import TextEnv
from posttrain.envs.contract import EnvError
from posttrain.envs.registry import make_env, register, registered

__all__ = ["EnvError", "TextEnv", "make_env", "register", "registered"]
