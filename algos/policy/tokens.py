"""Token bookkeeping for trajectories that did not come from the trainer.

Credit rules spread a step's advantage over that step's tokens, so they need what the
trainer records while sampling: ``Step.n_tokens``, ``Trajectory.token_ids`` and
``Trajectory.token_step``. A trajectory from your own loop (``gym.make``, ``env.step``,
``env.unwrapped.trajectory()``) has only text; ``attach_tokens`` tokenises it the way the
trainer lays out a conversation (``algos/policy/chat.py``: prompt and observations are gap tokens,
each assistant turn plus its end-of-turn token belongs to its step), so credit computed on it
is what the trainer would compute on the same text::

    traj = attach_tokens(env.unwrapped.trajectory(), tokenizer)
    per_step = get_credit_rule("draco")(trajs, group, A)
    batch = pad_token_advantages(trajs, [token_advantages(a, t.token_step) for a, t in zip(per_step, trajs)])
    loss = -(torch.from_numpy(batch["advantages"]) * logp * torch.from_numpy(batch["policy_mask"])).sum() / ...

Importing this module does not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from draco_gym.types import GAP, Trajectory

from draco_gym.algos.policy.chat import ChatFormat


def attach_tokens(trajectory: Trajectory, tokenizer, *, max_prompt_tokens: int | None = None) -> Trajectory:
    """A copy of ``trajectory`` with ``token_ids``, ``token_step`` and every ``Step.n_tokens``
    set from ``tokenizer``'s chat template (a ``ChatFormat`` is accepted too).

    The layout is the trainer's: the agent prompt as the first user turn (left-truncated to
    ``max_prompt_tokens``, as the trainer's ``rollout.max_prompt_tokens``), then per step its
    text and the end-of-turn token (step tokens), then, unless it is the last step, the
    observation as the next user turn (gap tokens). Text is encoded, not sampled, so the ids
    equal the trainer's wherever the policy's sampled tokens are the tokenizer's own encoding
    of the text. Sampling log-probs are left empty (there were none)."""
    chat = tokenizer if isinstance(tokenizer, ChatFormat) else ChatFormat.from_tokenizer(tokenizer)
    ids = chat.prompt_ids(trajectory.task.agent_prompt, max_prompt_tokens)
    token_step = [GAP] * len(ids)
    steps = []
    for position, step in enumerate(trajectory.steps):
        turn = chat.encode(step.text) + [chat.eos_ids[0]]
        ids += turn
        token_step += [step.index] * len(turn)
        steps.append(step.model_dump() | {"n_tokens": len(turn)})
        if position < len(trajectory.steps) - 1:
            gap = chat.observation_ids(step.observation, ended_with_eos=True)
            ids += gap
            token_step += [GAP] * len(gap)
    data = trajectory.model_dump(exclude={"steps", "token_ids", "token_step", "token_logprobs"})
    return Trajectory.model_validate({**data, "steps": steps, "token_ids": ids, "token_step": token_step})


def pad_token_advantages(trajectories: Sequence[Trajectory], token_advantages: Sequence[Sequence[float]],
                         pad_id: int = 0) -> dict:
    """Numpy arrays ``[B, T]`` (T: the longest trajectory) for a plain PyTorch loop, the
    trainer's own batch layout (``iteration.token_batch``), right-padded:

    - ``input_ids`` (pad: ``pad_id``), ``attention_mask`` (1 on real tokens),
    - ``policy_mask``: 1 on step tokens, where the loss is taken (0 on gap tokens, padding and
      the first token, which nothing predicts),
    - ``advantages``: ``token_advantages[i]`` per token (``credit.token_advantages``), 0 on padding,
    - ``old_logp``: the sampling log-probs, present only when every trajectory has them.
    """
    from draco_gym.algos.policy.iteration import token_batch  # (imports torch: on call, not on import)

    batch = token_batch(trajectories, token_advantages, pad_id=pad_id, require_logprobs=False)
    if not all(t.token_logprobs for t in trajectories):
        del batch["old_logp"]
    return batch
