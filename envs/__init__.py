"""Environments: text tool-use benchmarks as Gymnasium envs whose step is one code block."""

from draco_gym.envs.base import CodeStepEnv, Execution, Outcome, WorldLost, play_messages, text_space, truncate_middle

__all__ = ["CodeStepEnv", "Execution", "Outcome", "WorldLost", "play_messages", "text_space", "truncate_middle"]
