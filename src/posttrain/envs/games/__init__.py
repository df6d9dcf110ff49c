"""Multi-agent text environments (PettingZoo): games for self-play and a cooperative coding team.

Turn-taking games are AEC envs (``TextGame``); agents that act at once use a ParallelEnv
(``Negotiation``). Every env here passes PettingZoo's ``parallel_api_test`` (AEC ones converted
with ``aec_to_parallel``, or ``turn_based_aec_to_parallel`` for TextArena's retrying games).
"""

from posttrain.envs.games.base import PRINTABLE, TextGame, seed_tasks, text_space

__all__ = ["PRINTABLE", "TextGame", "seed_tasks", "text_space"]
