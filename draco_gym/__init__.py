"""draco-gym: Gymnasium environments, dynamic-rubric rewards and step credit for RL on
long-horizon tool-using LLM agents.

``import draco_gym`` registers the environment ids (``draco_gym/PythonTools-v0``, ...) with
Gymnasium and exposes the data model; the three layers are imported on demand:
``draco_gym.envs``, ``draco_gym.reward``, ``draco_gym.algos``.
"""

from draco_gym.registration import register_all as _register_all
from draco_gym.types import (
    GAP,
    Criterion,
    GroupScore,
    StageUsage,
    Step,
    Task,
    Termination,
    Trajectory,
    TrajectoryScore,
    Verdict,
    rubric_reward,
)

__version__ = "0.1.0"

__all__ = [
    "GAP",
    "Criterion",
    "GroupScore",
    "StageUsage",
    "Step",
    "Task",
    "Termination",
    "Trajectory",
    "TrajectoryScore",
    "Verdict",
    "rubric_reward",
]

_register_all()
