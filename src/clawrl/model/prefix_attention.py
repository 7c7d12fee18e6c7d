"""Attention over a prefix tree whose shared keys and values exist once (`engines.scoring`'s shared prefixes).

A decoder pass of a prefix tree (a node's tokens as one row, or the rows that go on alone after a
node, padded together) attends to two kinds of keys: its ancestors' and its own. Every token of
every row sees all of its ancestors' tokens (they come before its own, at earlier positions), so
one tensor [1, kv_heads, length, head_dim] per ancestor and layer serves all rows of the pass: the
rows' queries are folded into one long sequence per key head ([kv_heads, rows × heads per key head
× tokens, head_dim]) and multiplied by it, with neither a per-row copy nor a concatenation with the
rows' own keys. Its own keys a pass sees causally, and rows past their left padding.

The softmax over both kinds is exact: `_TreeAttention` goes over the keys a block at a time with a
running maximum and sum (flash attention's online softmax: each block's log-sum-exp merges into
the whole one), and its backward pass recomputes each block's probabilities from the whole
log-sum-exp, in PyTorch. No fused kernel fits: SDPA returns no log-sum-exp, the private kernels that
do treat it as not differentiable (a split attention merged through it would get a wrong
gradient), and none reads keys shared by rows without a copy per row. Memory besides the keys and
values themselves (kept once, by the pass that made them): the queries, the output and its
log-sum-exp, and one block of scores at a time (`BLOCK_ELEMENTS`). Matrix products run in the
model's dtype, the softmax and its sums in float32 at least, as transformers' eager attention does.

transformers dispatches attention by name (`AttentionInterface`, `config._attn_implementation`):
`tree_attention` switches a decoder to this module's function for one call and hands it the
`TreePass` through a keyword argument, which transformers passes down to the attention function.
A model that ran its attention some other way would ignore both; `tree_attention` checks that
every layer came through here. The switch is of the model's config, for the length of one forward
pass: a model must not run other forward passes meanwhile (the trainer's update runs one at a
time), and a layer recomputed later (activation checkpointing) would not attend through it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AttentionInterface

ATTENTION_NAME = "clawrl_prefix_tree"

# Scores of one block of keys, [kv_heads, rows × query heads × tokens, keys]: 4M numbers, 16 MiB in
# float32 (the backward pass holds three such at a time), and at least 128 keys, so that a pass with
# many queries still multiplies blocks of a useful size. On a 2-core CPU, blocks of 0.5M to 4M
# numbers took about two thirds of the time of 16M (whose blocks stream through memory).
BLOCK_ELEMENTS = 1 << 22
MIN_BLOCK_KEYS = 128

KeysValues = tuple[Tensor, Tensor]  # one layer's keys and values, [batch, kv_heads, length, head_dim] each


@dataclass
class TreePass:
    """What one decoder pass of a prefix tree reads besides its own tokens, and the keys and values it makes.

    `ancestors[n][layer]`: the keys and values of the n-th node above this pass (root first), one
    row each. `real`: [B, L] bool, the pass's real tokens (rows are padded); None for a node (one
    row, every token real). `made[layer]`: this pass's own keys and values, filled as it runs: a
    node's are what the passes below it read.
    """

    ancestors: tuple[dict[int, KeysValues], ...]
    real: Tensor | None
    made: dict[int, KeysValues] = field(default_factory=dict)


def tree_attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    tree_pass: TreePass | None = None,
    **kwargs: object,
) -> tuple[Tensor, None]:
    """transformers' attention-function contract: query [B, H, L, D], key and value [B, KV, L, D] → [B, L, H, D].

    `attention_mask` is None (transformers makes no mask for an attention it does not know): the
    pass's own mask comes from `tree_pass.real`.
    """
    if tree_pass is None:
        raise ValueError(f"the {ATTENTION_NAME!r} attention runs only within `tree_pass`")
    if dropout:
        raise ValueError("attention dropout is not supported over prefix trees (see engines.scoring.can_share_prefix)")
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise ValueError("soft-capped attention and attention sinks are not supported over prefix trees")
    tree_pass.made[module.layer_idx] = (key, value)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    above = [keys_values for node in tree_pass.ancestors for keys_values in node[module.layer_idx]]
    if not above and tree_pass.real is None:
        # the root: its own tokens, causally, as one row; the fused kernel does that best
        output = F.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scale, enable_gqa=query.shape[1] != key.shape[1]
        )
        return output.transpose(1, 2).contiguous(), None
    return _TreeAttention.apply(query, key, value, tree_pass.real, scale, *above), None


AttentionInterface.register(ATTENTION_NAME, tree_attention_forward)


@contextmanager
def tree_attention(decoder: torch.nn.Module, tree_pass: TreePass) -> Iterator[dict[str, TreePass]]:
    """Run `decoder` with this module's attention for one call; yields the keyword argument that call takes.

    Raises RuntimeError when a layer did not attend through it (the model does not dispatch its
    attention through transformers' `AttentionInterface`): its rows would not have seen their prefix.
    """
    config = decoder.config
    original = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield {"tree_pass": tree_pass}
    finally:
        config._attn_implementation = original
    layers = config.get_text_config().num_hidden_layers
    if len(tree_pass.made) != layers:
        raise RuntimeError(f"{layers - len(tree_pass.made)} of {layers} layers did not attend through transformers' "
                           "AttentionInterface: this model cannot share prompt prefixes")  # fmt: skip


@dataclass(frozen=True)
class _Block:
    """A block of keys from key `start` on: of the ancestor `source` (shared by every row) or, source None, the pass's own."""

    keys: Tensor  # shared: [KV, C, D]; own: [KV, B, C, D]
    values: Tensor
    start: int
    source: int | None

    @property
    def first_query(self) -> int:
        """The first query position that can see the block: every one for an ancestor's, none before an own key."""
        return self.start if self.source is None else 0

    @property
    def key_subscripts(self) -> str:
        """The keys' einsum subscripts: (h)ead, (b)atch row, (c) key, (d) head dimension."""
        return "hbcd" if self.source is None else "hcd"


def _blocks(own_keys: Tensor, own_values: Tensor, above: Sequence[Tensor], block_keys: int) -> Iterator[_Block]:
    """Every key in blocks of `block_keys`: the ancestors' first (every row sees all of them), then the pass's own."""
    for source, (keys, values) in enumerate(zip(above[0::2], above[1::2])):
        for start in range(0, keys.shape[2], block_keys):
            stop = start + block_keys
            yield _Block(keys[0, :, start:stop], values[0, :, start:stop], start, source)
    for start in range(0, own_keys.shape[2], block_keys):
        stop = start + block_keys
        yield _Block(own_keys[:, :, start:stop], own_values[:, :, start:stop], start, None)


def _scores(queries: Tensor, block: _Block, real: Tensor | None, compute: torch.dtype) -> Tensor:
    """[KV, B, G, L', C] scores of the queries that can see `block` (L' = L − its first query), −inf where masked.

    `queries` [KV, B, G, L, D]: each key head's G query heads per row, already scaled. Against an
    ancestor's keys ([KV, C, D]) einsum folds the rows, heads and tokens into one product per key
    head: the keys are read once, not copied per row.
    """
    visible = queries[:, :, :, block.first_query :]
    scores = torch.einsum(f"hbgqd,{block.key_subscripts}->hbgqc", visible, block.keys).to(compute)
    if block.source is not None:
        return scores
    hidden = ~_own_mask(block.start, visible.shape[3], block.keys.shape[2], real, queries.device)
    return scores.masked_fill_(hidden, float("-inf"))


def _own_mask(start: int, queries: int, keys: int, real: Tensor | None, device: torch.device) -> Tensor:
    """[1, B or 1, 1, L', C] bool: query i sees own key j when j ≤ i and j is a real token.

    A padding position also sees itself, so that no row of the softmax is empty: its output is
    finite and never read (no real token attends to padding).
    """
    query_positions = torch.arange(start, start + queries, device=device).unsqueeze(1)
    key_positions = torch.arange(start, start + keys, device=device).unsqueeze(0)
    causal = key_positions <= query_positions  # [L', C]
    if real is None:
        return causal.view(1, 1, 1, queries, keys)
    seen = real[:, start : start + keys].unsqueeze(1) | (key_positions == query_positions)  # [B, L', C]
    return (causal & seen).view(1, real.shape[0], 1, queries, keys)


def _block_keys(queries: Tensor) -> int:
    """Keys per block: `BLOCK_ELEMENTS` scores over every query of the pass."""
    heads, batch, groups, length, _ = queries.shape
    return max(MIN_BLOCK_KEYS, BLOCK_ELEMENTS // (heads * batch * groups * length))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The softmax's dtype: float32 for 16-bit models, else the model's."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _by_key_head(query: Tensor, kv_heads: int) -> Tensor:
    """[B, H, L, D] → [KV, B, G, L, D]: query head h reads key head h // G (transformers' `repeat_kv` order)."""
    batch, heads, length, dim = query.shape
    return query.reshape(batch, kv_heads, heads // kv_heads, length, dim).transpose(0, 1)


def _rows_first(grouped: Tensor) -> Tensor:
    """[KV, B, G, L, D] → [B, L, KV·G, D]: transformers' attention output layout."""
    heads, batch, groups, length, dim = grouped.shape
    return grouped.permute(1, 3, 0, 2, 4).reshape(batch, length, heads * groups, dim)


class _TreeAttention(torch.autograd.Function):
    """Softmax attention of a pass's queries over its ancestors' keys (shared by its rows) and its own (masked).

    Inputs: query [B, H, L, D], key and value [B, KV, L, D], `real` ([B, L] bool or None), the
    scale, then each ancestor's keys and values [1, KV, length, D]. Gradients flow to all of them:
    an ancestor's is the sum over every row that read it. The queries are scaled once, not every
    block's scores; the blocks' large tensors are worked on in place, for memory traffic.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, query: Tensor, key: Tensor, value: Tensor, real: Tensor | None, scale: float, *above: Tensor
    ) -> Tensor:
        queries = (_by_key_head(query, key.shape[1]) * scale).contiguous()  # a new tensor: `query` is left as it is
        compute = _compute_dtype(query.dtype)
        maximum = torch.full(queries.shape[:-1], float("-inf"), dtype=compute, device=query.device)
        total = torch.zeros_like(maximum)
        output = torch.zeros(queries.shape, dtype=compute, device=query.device)
        for block in _blocks(key.transpose(0, 1), value.transpose(0, 1), above, _block_keys(queries)):
            rows = slice(block.first_query, None)
            scores = _scores(queries, block, real, compute)
            new_maximum = torch.maximum(maximum[..., rows], scores.amax(-1))
            # a row that has seen no key yet keeps −inf: exp(−inf − 0) = 0, where exp(−inf + inf) would be nan
            finite = new_maximum.masked_fill(new_maximum == float("-inf"), 0.0)
            probabilities = scores.sub_(finite.unsqueeze(-1)).exp_()
            decay = torch.exp(maximum[..., rows] - finite)
            weighted = torch.einsum(f"hbgqc,{block.key_subscripts}->hbgqd", probabilities.to(query.dtype), block.values)
            output[..., rows, :].mul_(decay.unsqueeze(-1)).add_(weighted.to(compute))
            total[..., rows].mul_(decay).add_(probabilities.sum(-1))
            maximum[..., rows] = new_maximum
        log_sum_exp = maximum + torch.log(total)
        output = (output / total.unsqueeze(-1)).to(query.dtype)
        ctx.save_for_backward(queries, key, value, real, output, log_sum_exp, *above)
        ctx.scale = scale
        return _rows_first(output)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        queries, key, value, real, output, log_sum_exp, *above = ctx.saved_tensors
        heads, batch, groups, length, dim = queries.shape
        dtype, compute = queries.dtype, _compute_dtype(queries.dtype)
        # [B, L, H, D] → [KV, B, G, L, D], the layout of `queries`
        grad_out = grad_output.reshape(batch, length, heads, groups, dim).permute(2, 0, 3, 1, 4).to(dtype).contiguous()
        # Σ_d dO·O per query: the term that softmax's Jacobian subtracts from every key's score gradient
        shared_term = (grad_out.to(compute) * output.to(compute)).sum(-1)
        grad_queries = torch.zeros(queries.shape, dtype=compute, device=queries.device)  # a sum over blocks
        grads = [torch.zeros_like(tensor) for tensor in (key, value, *above)]  # each key's, from its one block
        for block in _blocks(key.transpose(0, 1), value.transpose(0, 1), above, _block_keys(queries)):
            rows = slice(block.first_query, None)
            keys = block.key_subscripts
            probabilities = _scores(queries, block, real, compute).sub_(log_sum_exp[..., rows].unsqueeze(-1)).exp_()
            grad_rows = grad_out[..., rows, :]
            # the scores' gradient, but for the scale (on the queries: applied once, at the end)
            grad_scores = torch.einsum(f"hbgqd,{keys}->hbgqc", grad_rows, block.values).to(compute)
            grad_scores = grad_scores.sub_(shared_term[..., rows].unsqueeze(-1)).mul_(probabilities).to(dtype)
            grad_queries[..., rows, :] += torch.einsum(f"hbgqc,{keys}->hbgqd", grad_scores, block.keys).to(compute)
            # the queries are scaled: the keys' gradient, scale included
            block_keys = torch.einsum(f"hbgqc,hbgqd->{keys}", grad_scores, queries[..., rows, :])
            block_values = torch.einsum(f"hbgqc,hbgqd->{keys}", probabilities.to(dtype), grad_rows)
            _store(block, block_keys, block_values, grads)
        grad_query = grad_queries.mul_(ctx.scale).transpose(0, 1).reshape(batch, heads * groups, length, dim)
        grad_key, grad_value, *grad_above = grads
        return (grad_query.to(dtype), grad_key, grad_value, None, None, *grad_above)


def _store(block: _Block, grad_keys: Tensor, grad_values: Tensor, grads: list[Tensor]) -> None:
    """Write a block's key and value gradients where its keys came from (each key is in one block only).

    `grads`: [own keys, own values, then each ancestor's keys and values], in the inputs' layouts.
    """
    stop = block.start + grad_keys.shape[-2]
    if block.source is None:
        grads[0][:, :, block.start : stop] = grad_keys.transpose(0, 1)
        grads[1][:, :, block.start : stop] = grad_values.transpose(0, 1)
        return
    index = 2 + 2 * block.source
    grads[index][0, :, block.start : stop] = grad_keys
    grads[index + 1][0, :, block.start : stop] = grad_values
