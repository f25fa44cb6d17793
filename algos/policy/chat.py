"""Token-level multi-turn conversations in the model's own chat template.

The policy's tokens must be kept exactly as sampled: decoding and re-encoding a turn can
change its tokenisation, and then the log-probabilities the learner recomputes are not the
ones the sampler drew. So a conversation is built by appending token chunks, never by
re-rendering the whole dialogue:

    prompt_ids(agent_prompt)        [template start ... user prompt ... assistant opener]   gap
    <sampled tokens of turn j>      [assistant text ... end-of-turn token]                  step j
    observation_ids(obs, ...)       [end-of-turn rest, user opener, obs, assistant opener]  gap

The scaffolding between turns is read off the template once, by rendering a conversation
with sentinel strings and cutting at the sentinels, so any chat template that renders user
and assistant turns in sequence works (ChatML, Llama 3, Gemma, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

_USER1, _ASSISTANT, _USER2 = "\u27e6U1\u27e7", "\u27e6A1\u27e7", "\u27e6U2\u27e7"


@dataclass(frozen=True)
class ChatFormat:
    """The pieces of a chat template the rollout loop needs, for one tokenizer."""

    tokenizer: object
    between_turns: str  # after an assistant message, up to the next user message's text
    after_user: str  # after a user message's text, up to the assistant's first token
    eos_ids: tuple[int, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer) -> ChatFormat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template; "
                "the policy must be a chat model (set tokenizer.chat_template)"
            )
        rendered = tokenizer.apply_chat_template(
            [
                {"role": "user", "content": _USER1},
                {"role": "assistant", "content": _ASSISTANT},
                {"role": "user", "content": _USER2},
            ],
            tokenize=False,
            add_generation_prompt=True,
        )
        try:
            between = rendered[rendered.index(_ASSISTANT) + len(_ASSISTANT) : rendered.index(_USER2)]
            after_user = rendered[rendered.index(_USER2) + len(_USER2) :]
        except ValueError:
            raise ValueError("the chat template does not render user and assistant turns verbatim") from None
        return cls(tokenizer=tokenizer, between_turns=between, after_user=after_user, eos_ids=eos_token_ids(tokenizer))

    def prompt_ids(self, agent_prompt: str, max_tokens: int | None = None) -> list[int]:
        """The first user turn and the assistant opener; left-truncated to ``max_tokens``."""
        ids = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": agent_prompt}], tokenize=True, add_generation_prompt=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers >= 5 returns a BatchEncoding
            ids = ids["input_ids"]
        ids = list(ids)
        if max_tokens is not None and len(ids) > max_tokens:
            ids = ids[-max_tokens:]
        return ids

    def observation_ids(self, observation: str, ended_with_eos: bool) -> list[int]:
        """The gap tokens between two assistant turns: the rest of the closed turn, the
        observation as a user message, and the next assistant opener.

        When the sampled turn already ended with the end-of-turn token, that token is the
        policy's and is not repeated; when the turn was cut by the token limit, the
        template's full closing is added so the next turn starts on a well-formed prompt.
        """
        closing = self.between_turns
        if ended_with_eos:
            for eos in self.eos_ids:
                text = self.tokenizer.decode([eos])
                if text and closing.startswith(text):
                    closing = closing[len(text) :]
                    break
        return self.encode(closing + observation + self.after_user)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def eos_token_ids(tokenizer, generation_config=None) -> tuple[int, ...]:
    """Every token that ends an assistant turn (the tokenizer's EOS and the model's)."""
    ids: list[int] = []
    for source in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if source is None:
            continue
        for i in source if isinstance(source, (list, tuple)) else [source]:
            if i not in ids:
                ids.append(int(i))
    if not ids:
        raise ValueError("the tokenizer has no EOS token: generation could never end a turn")
    return tuple(ids)
