"""Rubric rewards: trajectory rewards with step citations, usable from any RL loop.

    from draco_gym.reward import DynamicRubricReward, OpenAIJudge

    judge = OpenAIJudge("Qwen/Qwen3-32B", base_url="http://localhost:8000/v1")
    reward = DynamicRubricReward(judge, cache_dir=".judge_cache")
    group = reward.score_group(task, trajectories)      # or: await reward.ascore_group(...)
    group.rewards                                       # R_i per rollout
    group.scores[i].verdicts                            # verdicts citing 1-based steps

Rewards by name (``REWARDS``, ``build_reward``): "dynamic" (DRACO), "static", "rule"
(judge-free, the offline default), "outcome", "random" (the random-reward baseline), and "weighted" (a weighted sum of others, e.g.
rule + outcome). Judges by name (``JUDGES``, ``build_judge``): "openai", "transformers".

One judge call: a rubric (``dynamic.py``, ``static.py``) composes stages (``stages.py``:
propose, augment, merge, score, attribute, ...); a stage asks the judge client
(``judge_client.py``: limits, retries, repair, cache, cost), which calls the judge
(``judges.py`` names the built-in ones; each has its own module). Importing this package never imports torch, ray or transformers;
``TransformersJudge`` loads them when it is built.
"""

from draco_gym.reward.answers import InvalidAnswer
from draco_gym.reward.base import (
    REWARDS,
    FallbackKind,
    RubricReward,
    build_reward,
    count_fallbacks,
    discriminative_dropout,
    fallback_kind,
    finalize_group,
)
from draco_gym.reward.combined import WeightedReward
from draco_gym.reward.corridor import CorridorReward
from draco_gym.reward.dynamic import DynamicRubricReward
from draco_gym.reward.judge_client import DiskCache, JudgeClient, JudgeSettings, Price, StageFailed, UsageMeter
from draco_gym.reward.judge_health import dead_judge, probe_judge
from draco_gym.reward.judges import (
    JUDGES,
    FunctionJudge,
    Judge,
    JudgeReply,
    JudgeUnavailable,
    OpenAIJudge,
    TransformersJudge,
    build_judge,
)
from draco_gym.reward.stages import combine_samples
from draco_gym.reward.outcome import OutcomeReward
from draco_gym.reward.random_reward import RandomReward
from draco_gym.reward.rules import FAMILIES, RuleRubricReward, foundational_rewards, item_score, transition_items
from draco_gym.reward.static import STATIC_CRITERIA, StaticRubricReward
from draco_gym.reward.trl import TRLReward

__all__ = [
    "FAMILIES",
    "JUDGES",
    "REWARDS",
    "STATIC_CRITERIA",
    "CorridorReward",
    "DiskCache",
    "DynamicRubricReward",
    "FallbackKind",
    "FunctionJudge",
    "InvalidAnswer",
    "Judge",
    "JudgeClient",
    "JudgeReply",
    "JudgeSettings",
    "JudgeUnavailable",
    "OpenAIJudge",
    "OutcomeReward",
    "RandomReward",
    "Price",
    "RubricReward",
    "RuleRubricReward",
    "StageFailed",
    "StaticRubricReward",
    "TRLReward",
    "TransformersJudge",
    "UsageMeter",
    "WeightedReward",
    "build_judge",
    "build_reward",
    "combine_samples",
    "count_fallbacks",
    "dead_judge",
    "discriminative_dropout",
    "fallback_kind",
    "finalize_group",
    "foundational_rewards",
    "item_score",
    "probe_judge",
    "score_group",
    "transition_items",
]


def score_group(task, trajectories, reward="dynamic", **options):
    """One call for any loop: build the reward named ``reward`` with ``options`` and score
    one group. Build the reward once yourself when scoring many groups (it caches)."""
    built = reward if isinstance(reward, RubricReward) else build_reward(reward, **options)
    return built.score_group(task, trajectories)
