"""posttrain: reinforcement-learning post-training of LLM agents, from a laptop CPU up."""

__version__ = "0.1.0"
