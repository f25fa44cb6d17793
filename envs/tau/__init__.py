"""τ-bench environments: τ²/τ³ (``tau2``) and the original τ-bench (``tau_bench``).

``draco_gym/TauBench-v0`` (``TauBenchEnv``) is the single-agent Gymnasium form whose step is
one agent message; ``draco_gym.envs.tau.aec.TauBenchAEC`` the two-agent PettingZoo form
(assistant and user); ``evaluate`` runs a policy over tasks and reports SR and pass^k. The
benchmark packages (and PettingZoo) are imported only when an environment is built.
"""

from draco_gym.envs.tau.actions import ToolCall, ToolCallError, parse_tool_call
from draco_gym.envs.tau.backends import Backend, BackendError, Tau2Backend, TauV1Backend, make_backend
from draco_gym.envs.tau.env import TauBenchEnv
from draco_gym.envs.tau.evaluation import evaluate, pass_hat_k, run_trials, success_rate, trial_summary
from draco_gym.envs.tau.users import LLMUser, ScriptedUser, User, UserContext

__all__ = [
    "Backend",
    "BackendError",
    "LLMUser",
    "ScriptedUser",
    "Tau2Backend",
    "TauBenchEnv",
    "TauV1Backend",
    "ToolCall",
    "ToolCallError",
    "User",
    "UserContext",
    "evaluate",
    "make_backend",
    "parse_tool_call",
    "pass_hat_k",
    "run_trials",
    "success_rate",
    "trial_summary",
]
