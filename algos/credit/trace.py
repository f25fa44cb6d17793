"""TRACE: step credit from how much each step raises a frozen model's belief in the gold answer.

For a task with a gold answer, a frozen reference model reads the episode up to step k and
scores the answer (teacher forcing). A step that makes the answer more predictable moved the
episode toward it:

    l_k       mean log-prob of the gold answer's tokens after the first k steps (k = 0..T)
    d_k       = -l_k + eps                      distance to the answer (eps keeps d_k > 0)
    V_k       = log(d_0 / d_k)                  value: how much closer than at the start
    delta_k   = V_k - V_{k-1}                   what step k did (k = 1..T)
    r_k       = sum_{i<m} gamma^i delta_{k+i} / sum_{i<m} gamma^i,   m = min(K, T-k+1)
                + lambda_term * gamma^(T-k+1) * A_out    if the window reaches the end (k+K-1 >= T)
    a_k       = alpha_out * A_out + alpha_turn * r_k

(k is 1-based here; the reference implementation writes the fill gamma^(T-t) with t = k-1 the
0-based transition index, so even the last action's fill is lambda_term * gamma * A_out.)

The K-step window lets a step take credit for what it set up in the next few turns without
inheriting the whole future; the terminal fill ties the last steps to the episode's outcome
advantage A_out. TRACE needs a gold answer: it is the verifier-anchored comparison point, not
an outcome-blind rule.

Whose is each value (paper: the TRACE paper's text; reference implementation: the public
implementation that follows the paper's Algorithm 1; ours: this project's choice):

    l_k, d_k, V_k, delta_k, a K-step window of deltas, a terminal
      outcome term and the mix a_k                                            paper (Algorithm 1)
    the window's normalisation (dividing by sum_{i<m} gamma^i)                reference implementation
    the terminal fill lambda_term * gamma^(T-k+1) * A_out, and when it
      applies (the window reaches the end)                                    reference implementation
    A_out, the group advantage of the verifiable outcome (answer correctness) paper
    eps = 0.1, K = 3, gamma = 0.8, lambda_term = 2.0                          reference implementation
    alpha_out = 1.0, alpha_turn = 0.2                                         reference implementation
    the reference model defaults to the initial policy (the base model)      ours
    the transcript rendering and the answer prompt "Final answer: "           ours
    batch_size = 8, max_length = 4096 (left truncation, never the answer)     ours
    T counts code steps only; a turn without code gets A_out                  ours (DRACO's step is
                                                                              one code block)

Which turn's credit lands on which action's tokens (ours, a reading): the paper indexes the
turn reward by state, with r_turn = 0 for the initial state k = 0, since no action led to it.
Here delta_k, the change from state k-1 to state k, is credited to action k, the action whose
result state k is: the first action gets the value its own step produced, and no action is
credited for what its predecessor did. The shifted reading (action k gets the reward of the
state it was taken from) would give the first action r_turn = 0 always and every later action
its predecessor's gain, pushing tokens that did not cause the change.

A_out: the rule reads the advantages it is handed as A_out, so they must come from the
outcome: the shipped config uses the ``outcome`` reward, and a config that pairs trace with
another reward is refused (``algos/config.py``) unless ``base_advantage: reward`` says so.

The math here is pure Python. ``ReferenceScorer`` (transformers, imported only when used)
computes l_0..l_T for a trajectory in batched teacher-forced passes.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

from draco_gym.algos.credit.core import BaseAdvantage, CreditRule
from draco_gym.algos.credit.registry import credit_rule
from draco_gym.algos.credit.spec import Need, RuleOptions, option
from draco_gym.types import Step, Task, Trajectory

__all__ = ["ReferenceScorer", "TraceOptions", "trace_credit", "trace_turn_rewards", "trace_values"]


class TraceOptions(RuleOptions):
    """TRACE's options (``credit.options`` of a run config), each labelled with whose value its
    default is; the formula's constants are the reference implementation's, not values the
    paper's text gives."""

    eps: float = option(0.1, "reference", "d_k = -l_k + eps keeps the distance to the answer > 0",
                        gt=0, allow_inf_nan=False)
    K: int = option(3, "reference", "the window of TD deltas a step is credited with", ge=1, strict=True)
    gamma: float = option(0.8, "reference", "discount inside the window and of the terminal fill", gt=0, le=1)
    lambda_term: float = option(2.0, "reference", "terminal fill lambda_term * gamma^(T-k+1) * A_out",
                                allow_inf_nan=False)
    alpha_out: float = option(1.0, "reference", "a_k = alpha_out * A_out + alpha_turn * r_k", allow_inf_nan=False)
    alpha_turn: float = option(0.2, "reference", "a_k = alpha_out * A_out + alpha_turn * r_k", allow_inf_nan=False)
    base_advantage: BaseAdvantage = option(
        "outcome", "paper", "A_out is the outcome's group advantage (reward: the run's reward's A_i, on purpose)")
    reference_model: Any = option(
        None, "ours", "the frozen reference: a path or a loaded HF causal LM; null: the trainer's base model, the "
                      "initial policy (the paper leaves the reference open)")
    answer_key: str = option("answer", "ours", "the task.metadata entry holding the gold answer")
    batch_size: int = option(8, "ours", "step prefixes per teacher-forced pass of the reference", ge=1)
    max_length: int = option(4096, "ours", "prefix tokens the reference reads; longer prefixes lose their oldest "
                                           "(left truncation), never the answer", ge=2)


DEFAULTS = TraceOptions()


def trace_needs(options: TraceOptions) -> set[Need]:
    """A frozen reference and the gold answer; A_out from the outcome reward unless
    ``base_advantage: reward``."""
    base = Need.OUTCOME_REWARD if options.base_advantage == "outcome" else Need.REWARD_ADVANTAGE
    return {Need.BASE_POLICY, Need.GOLD_ANSWER, base}


def trace_values(answer_logprobs: Sequence[float], eps: float = DEFAULTS.eps) -> list[float]:
    """V_k = log(d_0 / d_k) with d_k = -l_k + eps, for k = 0..T (so V_0 = 0)."""
    if len(answer_logprobs) < 1:
        raise ValueError("answer_logprobs must hold l_0 (before any step) and one value per step")
    d = []
    for k, l_k in enumerate(answer_logprobs):
        l_k = float(l_k)
        if not math.isfinite(l_k) or l_k > 1e-9:
            raise ValueError(f"answer_logprobs[{k}] must be a finite log-probability (<= 0), got {l_k}")
        d.append(-min(l_k, 0.0) + eps)
    return [math.log(d[0] / d_k) for d_k in d]


def trace_turn_rewards(values: Sequence[float], outcome_advantage: float, params: TraceOptions = DEFAULTS) -> list[float]:
    """r_k for steps k = 1..T from V_0..V_T (see the module docstring)."""
    T = len(values) - 1
    K, gamma = params.K, params.gamma
    delta = [values[k] - values[k - 1] for k in range(1, T + 1)]  # delta[k-1] is step k's
    rewards = []
    for k in range(1, T + 1):
        m = min(K, T - k + 1)
        discounts = [gamma**i for i in range(m)]
        r_k = sum(g * delta[k - 1 + i] for i, g in enumerate(discounts)) / sum(discounts)
        if k + K - 1 >= T:  # the window reaches the end: fill with the outcome, gamma^(T - t), t = k - 1
            r_k += params.lambda_term * gamma ** (T - k + 1) * outcome_advantage
        rewards.append(r_k)
    return rewards


def trace_credit(answer_logprobs: Sequence[float], outcome_advantage: float, params: TraceOptions = DEFAULTS) -> list[float]:
    """a_k = alpha_out * A_out + alpha_turn * r_k for one trajectory of T steps, given
    l_0..l_T (T + 1 values)."""
    a_out = float(outcome_advantage)
    if not math.isfinite(a_out):
        raise ValueError(f"outcome_advantage must be finite, got {a_out}")
    values = trace_values(answer_logprobs, params.eps)
    return [params.alpha_out * a_out + params.alpha_turn * r for r in trace_turn_rewards(values, a_out, params)]


# -- the reference model -------------------------------------------------------------------


def default_render(task: Task, steps: Sequence[Step]) -> str:
    """Plain-text transcript of the task and the first k steps, as the reference reads it."""
    parts = [task.agent_prompt or task.instruction]
    if task.agent_prompt and task.instruction and task.instruction not in task.agent_prompt:
        parts.append(task.instruction)
    for step in steps:
        parts.append(f"Assistant:\n{step.text}")
        if step.observation:
            parts.append(f"Output:\n{step.observation}")
    return "\n\n".join(parts)


class ReferenceScorer:
    """l_k for every step prefix of a trajectory, from a frozen causal LM.

    All T + 1 prefixes of one trajectory go through the model in batches of ``batch_size``
    (right-padded, one forward pass per batch, no generation): the answer tokens are teacher
    forced after ``answer_prompt`` and their log-probs averaged. Prefixes longer than
    ``max_length`` tokens lose their oldest tokens (left truncation), never the answer.

    ``model`` is an ``AutoModelForCausalLM`` (the initial policy, or any HF model sharing
    nothing with the policy) or a path to load one from. The gold answer is read from
    ``task.metadata[answer_key]`` (``"answer"``, where PythonTools keeps it).
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        *,
        answer_key: str = DEFAULTS.answer_key,
        answer_prompt: str = "\n\nFinal answer: ",
        render: Callable[[Task, Sequence[Step]], str] = default_render,
        batch_size: int = DEFAULTS.batch_size,
        max_length: int = DEFAULTS.max_length,
        device: str | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, str):
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            model = AutoModelForCausalLM.from_pretrained(model)
        if tokenizer is None:
            raise ValueError("tokenizer is required when model is a loaded model")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        self.model = model.eval().requires_grad_(False)
        if device is not None:
            self.model.to(device)
        self.device = next(self.model.parameters()).device
        self.tokenizer = tokenizer
        self.answer_key = answer_key
        self.answer_prompt = answer_prompt
        self.render = render
        self.batch_size = batch_size
        self.max_length = max_length
        self._torch = torch
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters

    def gold_answer(self, task: Task) -> str:
        answer = task.metadata.get(self.answer_key)
        if answer is None or str(answer) == "":
            raise ValueError(f"task {task.id!r}: metadata[{self.answer_key!r}] (the gold answer) is missing; TRACE needs one")
        return str(answer)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def __call__(self, trajectory: Trajectory) -> list[float]:
        """[l_0, ..., l_T] for one trajectory."""
        torch = self._torch
        answer = self._encode(self.gold_answer(trajectory.task))
        if not answer:
            raise ValueError(f"task {trajectory.task.id!r}: the gold answer encodes to no tokens")
        if len(answer) >= self.max_length:
            raise ValueError(f"the gold answer has {len(answer)} tokens, max_length is {self.max_length}")
        room = self.max_length - len(answer)
        bos = [self.tokenizer.bos_token_id] if self.tokenizer.bos_token_id is not None else []
        sequences = []
        for k in range(len(trajectory.steps) + 1):
            context = bos + self._encode(self.render(trajectory.task, trajectory.steps[:k]) + self.answer_prompt)
            sequences.append(context[-room:] + answer)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        n_ans = len(answer)
        target = torch.tensor(answer, device=self.device)
        out: list[float] = []
        with torch.inference_mode():
            for start in range(0, len(sequences), self.batch_size):
                batch = sequences[start : start + self.batch_size]
                width = max(len(s) for s in batch)
                # Left padding puts every answer in the same last n_ans columns, so only the
                # n_ans predicting positions need logits (a vocabulary-wide row per context
                # token would cost GBs on long episodes); explicit position ids keep padded
                # rows identical to unpadded ones.
                ids = torch.full((len(batch), width), pad, dtype=torch.long)
                mask = torch.zeros((len(batch), width), dtype=torch.long)
                for b, s in enumerate(batch):
                    ids[b, width - len(s) :] = torch.tensor(s)
                    mask[b, width - len(s) :] = 1
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                kwargs = {"logits_to_keep": n_ans + 1} if self._keeps_logits else {}
                logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                    position_ids=positions.to(self.device), **kwargs).logits
                # logits at position t predict token t+1: the answer's predictors end one short
                logp = torch.log_softmax(logits[:, -(n_ans + 1) : -1].float(), dim=-1)
                out += logp.gather(-1, target.expand(len(batch), n_ans)[..., None]).squeeze(-1).mean(-1).tolist()
        return out


_LOADED: dict[tuple, ReferenceScorer] = {}


def _reference_scorer(model, tokenizer, answer_key: str, batch_size: int, max_length: int) -> ReferenceScorer:
    """One scorer per model path and settings for the whole process: a trainer rebuilds its
    credit rule every iteration, and the reference must not be reloaded each time."""
    if not isinstance(model, str):
        return ReferenceScorer(model, tokenizer, answer_key=answer_key, batch_size=batch_size, max_length=max_length)
    key = (model, answer_key, batch_size, max_length)
    if key not in _LOADED:
        _LOADED[key] = ReferenceScorer(model, tokenizer, answer_key=answer_key, batch_size=batch_size, max_length=max_length)
    return _LOADED[key]


# -- the registry entry --------------------------------------------------------------------

@credit_rule("trace", TraceOptions, needs=trace_needs, inputs=("scorer", "tokenizer"))
def trace_rule(options: TraceOptions, *, scorer: Callable[[Trajectory], Sequence[float]] | None = None,
               tokenizer=None) -> CreditRule:
    """TRACE with l_0..l_T from ``scorer(trajectory)``, or from a ``ReferenceScorer`` over
    ``options.reference_model`` (a loaded HF causal LM with ``tokenizer``, or a path), built
    on first use. The advantages handed to the rule are A_out: the outcome's group advantage
    (``base_advantage="outcome"``, the paper's), or by choice the run's reward's ("reward")."""
    reference_model = options.reference_model
    if scorer is None and reference_model is None:
        raise ValueError("trace needs a reference: pass scorer=(trajectory -> l_0..l_T) or reference_model=")
    if scorer is not None and not callable(scorer):
        raise ValueError(f"scorer must be callable, got {type(scorer).__name__}")
    state: dict = {"scorer": scorer}

    def score(traj: Trajectory) -> list[float]:
        if state["scorer"] is None:
            state["scorer"] = _reference_scorer(reference_model, tokenizer, options.answer_key, options.batch_size,
                                                options.max_length)
        values = list(state["scorer"](traj))
        if len(values) != len(traj.steps) + 1:
            raise ValueError(f"the scorer returned {len(values)} log-probs for {len(traj.steps)} steps; expected {len(traj.steps) + 1}")
        return values

    def one(traj: Trajectory, a_out: float) -> list[float]:
        """r_k over the code steps (the paper's actions); a turn without code gets A_out."""
        code = traj.credit_steps
        out = [float(a_out)] * len(traj.steps)
        if not code:
            return out
        logprobs = score(traj)
        for k, a_k in zip(code, trace_credit([logprobs[0]] + [logprobs[k] for k in code], a_out, options)):
            out[k - 1] = a_k
        return out

    def assign(trajectories: Sequence[Trajectory], group, advantages: Sequence[float]) -> list[list[float]]:
        return [one(t, a) for t, a in zip(trajectories, advantages)]

    return assign
