"""Prefix sharing: the tokens a group's sequences have in common are computed once.

The G rollouts of a task begin with the same prompt, and in agent tasks the prompt is a large
part of every sequence (the quickstart's is 358 tokens; a turn samples 64). The sampler and
the learner both encode such a shared prefix once, batch 1, and let every row's own
continuation attend to its cached keys and values:

    prefix        x_1 .. x_P          identical in every row of the group, one forward
    continuation  x_P+1 .. x_n_i      row i's own tokens (later turns differ), batched;
                                      position ids continue from P, so rotary embeddings see
                                      the angles of an unshared forward

Each row's hidden states are then those of the unshared forward, up to the float rounding
of a different batch shape. ``prefix_groups`` decides what the prefix is, for the sampler
(``generation.SamplingSession``) and the learner alike.

Training through a shared prefix. The prefix's outputs (its last hidden states and every
layer's keys and values) are cut from its graph into leaf tensors. Each micro-batch of
continuations reads the leaves, and its backward adds its share into their ``.grad``; after
the group's last micro-batch, one backward through the prefix carries the summed gradient
into the weights (LoRA included). The prefix is so computed and differentiated once per
group, however many micro-batches its continuations fill, and since the gradient is linear
in the loss the result is the unshared gradient.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from draco_gym.algos.policy.lm import cache_argument, decoder_and_head, token_logprobs


@dataclass(frozen=True)
class PrefixGroup:
    """Rows (indices into the sequences) whose first ``length`` tokens are identical.
    ``length == 0``: a row computed on its own."""

    rows: tuple[int, ...]
    length: int


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def prefix_groups(sequences: Sequence[Sequence[int]], min_length: int = 1) -> list[PrefixGroup]:
    """Partition rows into groups sharing a prefix, the partition that computes fewest tokens.

    A group of n rows with a common prefix of P tokens computes (n - 1) P tokens fewer than
    its rows one by one. Rows sorted lexicographically put every candidate group in a
    contiguous run whose common prefix is the minimum of its neighbours' common prefixes,
    so the best partition is a dynamic program over runs. A shared prefix stops one token
    short of the group's shortest row: every row keeps a continuation of its own (the
    sampler's next-token logits and the learner's last prediction come from there).
    Groups come back in the order of their first row; rows in each group ascending.
    """
    seqs = [tuple(int(t) for t in s) for s in sequences]
    order = sorted(range(len(seqs)), key=lambda i: seqs[i])
    common = [_common_length(seqs[order[k]], seqs[order[k + 1]]) for k in range(len(order) - 1)]
    best = [0] * (len(order) + 1)  # tokens saved by the best partition of the first j sorted rows
    cut: list[tuple[int, int]] = [(0, 0)] * (len(order) + 1)  # (run start, shared length) ending at j
    for j in range(1, len(order) + 1):
        best[j], cut[j] = best[j - 1], (j - 1, 0)  # row j - 1 on its own
        shared, shortest = None, len(seqs[order[j - 1]])
        for i in range(j - 2, -1, -1):  # run order[i:j]
            shared = common[i] if shared is None else min(shared, common[i])
            shortest = min(shortest, len(seqs[order[i]]))
            length = min(shared, shortest - 1)
            if length < min_length:
                break  # longer runs share no more
            saved = best[i] + (j - i - 1) * length
            if saved > best[j]:
                best[j], cut[j] = saved, (i, length)
    groups, j = [], len(order)
    while j > 0:
        i, length = cut[j]
        groups.append(PrefixGroup(tuple(sorted(order[i:j])), length))
        j = i
    return sorted(groups, key=lambda g: g.rows[0])


# -- the model side ---------------------------------------------------------------------------


def _layers_kv(cache) -> list:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))  # transformers < 4.54


def _one_pass_layer_class():
    from transformers.cache_utils import DynamicLayer

    class OnePassLayer(DynamicLayer):
        """One layer's keys and values for a single forward pass: ``update`` sets them to the
        prefix's (``base``, when given) followed by the new ones, and returns them. The same
        call made twice returns the same tensors, so a decoder layer recomputed under
        activation checkpointing sees what it saw the first time; ``DynamicLayer`` would
        append the new keys a second time."""

        def __init__(self, base_keys=None, base_values=None) -> None:
            super().__init__()
            self.base = (base_keys, base_values)
            if base_keys is not None:
                self.lazy_initialization(base_keys, base_values)
                self.keys, self.values = base_keys, base_values

        def update(self, key_states, value_states, *args, **kwargs):
            import torch

            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            base_keys, base_values = self.base
            self.keys = key_states if base_keys is None else torch.cat([base_keys, key_states], dim=-2)
            self.values = value_states if base_values is None else torch.cat([base_values, value_states], dim=-2)
            return self.keys, self.values

    return OnePassLayer


def one_pass_cache(base: list[tuple] | None = None):
    """A ``DynamicCache`` for one forward pass, empty or holding ``base`` (per layer, the
    prefix's keys and values), whose layers can be recomputed (``OnePassLayer``): the cache
    the learner's prefix and continuation passes use, with or without activation
    checkpointing."""
    from transformers import DynamicCache

    layer = _one_pass_layer_class()
    cache = DynamicCache()
    if base is None:
        cache.layer_class_to_replicate = layer
    else:
        cache.layer_class_to_replicate = None
        cache.layers = [layer(k, v) for k, v in base]
    return cache


class SharedPrefix:
    """One prefix's hidden states and per-layer keys/values, computed once (batch 1).

    With ``grad``, continuations read detached leaf copies and ``backward()`` runs the
    prefix's own backward once with the gradient they accumulated (see the module doc).
    Build it inside the same adapter context (``disable_adapter`` for the reference) as the
    continuations that read it.
    """

    def __init__(self, lm, prefix_ids, *, grad: bool) -> None:
        import torch

        self.backbone, self.head = decoder_and_head(lm)
        self.length = int(prefix_ids.shape[-1])
        self._cache_kw = cache_argument(self.backbone)
        ids = prefix_ids.reshape(1, -1).long()
        cache = one_pass_cache()  # read here: a model under checkpointing returns no cache
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            out = self.backbone(input_ids=ids, use_cache=True, **{self._cache_kw: cache})
        self._outputs = [out.last_hidden_state] + [t for kv in _layers_kv(cache) for t in kv]
        self.grad = self._outputs[0].requires_grad
        self._leaves = [t.detach().requires_grad_() for t in self._outputs] if self.grad else self._outputs

    def row_hidden(self, input_ids, attention_mask):
        """Last hidden states [rows, width] of full rows (right-padded) that begin with the
        prefix: the prefix's own, then the continuations' computed against its cache."""
        import torch

        rows, width = input_ids.shape
        P = self.length
        if width <= P:
            raise ValueError(f"rows of {width} tokens have no continuation after a {P}-token prefix")
        kv = self._leaves[1:]
        cache = one_pass_cache([(kv[2 * i].expand(rows, -1, -1, -1), kv[2 * i + 1].expand(rows, -1, -1, -1))
                                for i in range(len(kv) // 2)])
        own = attention_mask[:, P:].long()
        mask = torch.cat([torch.ones(rows, P, dtype=own.dtype, device=own.device), own], dim=1)
        positions = torch.arange(P, width, device=input_ids.device).expand(rows, -1)
        out = self.backbone(input_ids=input_ids[:, P:].long(), attention_mask=mask, position_ids=positions,
                            use_cache=True, **{self._cache_kw: cache})
        return torch.cat([self._leaves[0].expand(rows, -1, -1), out.last_hidden_state], dim=1)

    def backward(self) -> None:
        """The prefix's backward, once, with the gradient every continuation left on it."""
        import torch

        if not self.grad:
            return
        pairs = [(out, leaf.grad) for out, leaf in zip(self._outputs, self._leaves) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        self._outputs = self._leaves = []  # the graph is spent; free it


def sharing_unsupported(lm) -> str | None:
    """Why this model's attention cannot take a shared prefix, or None when it can.

    Checked from the model's structure, then proved on a two-row probe: shared and unshared
    log-probs of random tokens must agree.
    """
    backbone, head = decoder_and_head(lm)
    if backbone is None:
        return "the model has no separable decoder and vocabulary head"
    config = getattr(backbone, "config", None)
    attn = getattr(config, "_attn_implementation", None) or "eager"
    if attn not in ("eager", "sdpa"):
        return f"attention implementation {attn!r} is not one the shared prefix is verified with (eager, sdpa)"
    kinds = set(getattr(config, "layer_types", None) or [])
    if kinds - {"full_attention"}:
        return f"layers of type {sorted(kinds - {'full_attention'})}: their cache is not the prefix's full keys/values"
    if not kinds and getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention: its cache is not the prefix's full keys/values"
    if any(getattr(m, "gradient_checkpointing", False) and not getattr(m, "_can_checkpoint_with_cache", False)
           for m in backbone.modules()):
        return "gradient checkpointing drops the KV cache that carries the prefix"
    if cache_argument(backbone) not in inspect.signature(type(backbone).forward).parameters:
        return "the decoder's forward takes no KV cache"
    return _probe(lm)


def _probe(lm) -> str | None:
    import torch

    vocab = decoder_and_head(lm)[1].weight.shape[0]
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(vocab, (12,), generator=g)
    ids = torch.stack([torch.cat([shared, torch.randint(vocab, (8,), generator=g)]),
                       torch.cat([shared, torch.randint(vocab, (8,), generator=g)])])
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0  # unequal continuations: padding after the prefix
    device = next(lm.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    targets = mask.float()
    targets[:, 0] = 0
    try:
        with torch.no_grad():
            plain = token_logprobs(lm, ids, mask, targets)
            via_prefix = token_logprobs(lm, ids, mask, targets, prefix=SharedPrefix(lm, ids[0, :12], grad=False))
    except Exception as exc:  # noqa: BLE001 - any failure means: use the unshared path
        return f"a shared-prefix forward failed: {type(exc).__name__}: {exc}"
    tol = 1e-4 if plain.dtype == torch.float32 and next(lm.parameters()).dtype == torch.float32 else 0.25
    gap = float((plain - via_prefix).abs().max())
    if gap > tol:
        return f"shared-prefix log-probs differ from unshared ones by {gap:.2e} on a probe"
    return None


# -- the learner's micro-batches, by shared prefix -------------------------------------------

# The arrays of a token batch (``iteration.TokenBatch``), [rows, width] each.
BATCH_KEYS = ("input_ids", "attention_mask", "policy_mask", "advantages", "old_logp")


def micro_batches(batch: dict, token_budget: int) -> list[dict]:
    """Split a minibatch (tensors [rows, width]) into micro-batches of at most
    ``token_budget`` padded tokens (at least one row each), rows grouped by length so little
    is padding, each trimmed to its own longest row."""
    lengths = [int(n) for n in batch["attention_mask"].sum(-1)]
    return [_take(batch, rows, lengths) for rows in _pack(lengths, range(len(lengths)), token_budget, 0)]


@dataclass
class PrefixUnit:
    """Rows the learner computes together: the token ids their shared prefix holds (None
    when they share none) and their micro-batches (full rows, prefix included), with the
    minibatch row indices each micro-batch holds."""

    prefix: Any | None
    micro: list[dict]
    rows: list[list[int]]


def prefix_micro_batches(batch: dict, token_budget: int, share: bool = True) -> list[PrefixUnit]:
    """Split a minibatch by shared prefix (``prefix.prefix_groups``), then into micro-batches.

    A group's prefix is computed once for all its micro-batches, so the budget counts only
    what runs per micro-batch: the rows' tokens after the prefix. Rows that share nothing
    (or all rows, without ``share``) form one unit split as ``micro_batches`` does."""
    lengths = [int(n) for n in batch["attention_mask"].sum(-1)]
    if share:
        groups = prefix_groups([batch["input_ids"][i, :n].tolist() for i, n in enumerate(lengths)])
    else:
        groups = []
    shared = [g for g in groups if g.length > 0]
    alone = sorted(set(range(len(lengths))) - {r for g in shared for r in g.rows})
    units = []
    if alone:
        packs = _pack(lengths, alone, token_budget, 0)
        units.append(PrefixUnit(None, [_take(batch, rows, lengths) for rows in packs], packs))
    for g in shared:
        packs = _pack(lengths, g.rows, token_budget, g.length)
        units.append(PrefixUnit(batch["input_ids"][g.rows[0], : g.length],
                                [_take(batch, rows, lengths) for rows in packs], packs))
    return units


def _pack(lengths: Sequence[int], rows: Sequence[int], token_budget: int, skip: int) -> list[list[int]]:
    """Rows grouped by length into packs of at most ``token_budget`` padded tokens after the
    first ``skip`` (at least one row each)."""
    packs: list[list[int]] = [[]]
    for i in sorted(rows, key=lambda i: lengths[i]):
        width = max([lengths[j] for j in packs[-1]] + [lengths[i]]) - skip
        if packs[-1] and width * (len(packs[-1]) + 1) > token_budget:
            packs.append([])
        packs[-1].append(i)
    return packs


def _take(batch: dict, rows: list[int], lengths: Sequence[int]) -> dict:
    width = max(lengths[j] for j in rows)
    return {k: batch[k][rows, :width] for k in BATCH_KEYS}
