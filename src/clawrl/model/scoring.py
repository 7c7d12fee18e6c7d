"""Teacher-forced scoring: log π(response_t | prompt, response_<t), computed in one place.

Serving (`HFEngine.score`), the trainer's OPD teacher and the policy update all compare numbers
of this one quantity: the importance weight divides the trainer's log-prob by the engine's, the
OPD advantage subtracts the student's from the teacher's. One implementation keeps them equal up
to the model's own arithmetic, instead of up to three chances of a shift or padding mismatch.

Sequence layout of a packed group of rows (why: bounded memory for long prompts):

    [pad … pad | prompt | response | pad … pad]      prompts left-padded to end in one column

Every response then starts in the same column, so the hidden states that predict response tokens
are the last R columns (R = the longest response), and only those reach the output layer: the
vocabulary-sized tensors are [B, R, V] however long the prompts are, and `response_scores` makes
even those one chunk of positions at a time. The last column (the last response token) is only
ever a target, so it is not fed. Position ids are counted from each row's first real token, so
padding changes nothing but the amount of work. All log-probs are of the RAW distribution
(temperature 1), in float32.

Prefix trees (`pack_rows(share_prefix=True)`): an agent re-sends a 24K-token prompt every turn, a
session's turns share almost all of it, a group's G rollouts share all of it. The rows' prompts
are arranged in a tree (`prefix_tree`): each node holds tokens that every row below it reads next,
and goes through the decoder once, as one row, attending to the keys and values of the nodes
above it; each row then runs only what it shares with no other row, attending to the keys and
values of its path. Those exist once per micro-batch, made by each node's one pass and read by
every row below it without a copy per row (`engines.prefix_attention`: the softmax over a path's
keys and a row's own, merged block by block through their log-sum-exps). Every row sees the same
tokens at the same positions as it would alone, so the numbers are the same up to rounding, and
the gradient of every row's loss flows back into the one pass over each shared node.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor

from clawrl.model.constraints import masked_logits
from clawrl.model.prefix_attention import KeysValues, TreePass, tree_attention
from clawrl.types import ScoredResponse

# A node of the prefix tree costs a forward pass of its own: fewer shared tokens than this are
# cheaper to compute once per row than to split off (a chat template's opening, a common word).
MIN_SHARED_TOKENS = 16


@dataclass(frozen=True)
class PrefixTree:
    """Which rows read which prompt tokens once: positions [start, end) of every row in `members`."""

    start: int
    end: int
    members: tuple[int, ...]  # every row below this node
    children: tuple[PrefixTree, ...]
    alone: tuple[int, ...]  # rows that share nothing more after `end`: they run from there on their own


def prefix_tree(prompts: Sequence[Sequence[int]], min_shared: int = MIN_SHARED_TOKENS) -> PrefixTree:
    """The prompts' shared prefixes as a tree; a node holds at least `min_shared` tokens (the root: any, or none).

    Every row keeps at least its last prompt token of its own: that position predicts the first
    response token, so it must be in the row's own pass (a group's rollouts share all but it).
    """
    if len(prompts) < 2:
        return flat_tree(len(prompts))
    heads = [list(prompt[:-1]) for prompt in prompts]
    return _branch(heads, tuple(sorted(range(len(prompts)), key=heads.__getitem__)), 0, min_shared)


def _branch(heads: list[list[int]], rows: tuple[int, ...], start: int, min_shared: int) -> PrefixTree:
    """The node over `rows` (sorted by their heads, which agree on [0, start)) and what branches off it.

    In lexicographic order the tokens that a run of rows shares are the fewest that neighbours
    share, so the node's end is the least neighbour overlap and the branches are the runs whose
    neighbours overlap by `min_shared` tokens or more past it.
    """
    overlaps = [_overlap(heads[first], heads[second], start) for first, second in pairwise(rows)]
    end = start + min(overlaps) if overlaps else start
    if start == 0 and end < min_shared:
        end = 0  # the root alone may share nothing
    children: list[PrefixTree] = []
    alone: list[int] = []
    run = [rows[0]]
    for row, overlap in zip(rows[1:], overlaps):
        if start + overlap - end >= min_shared:
            run.append(row)
            continue
        _close(heads, run, end, min_shared, children, alone)
        run = [row]
    _close(heads, run, end, min_shared, children, alone)
    return PrefixTree(start, end, rows, tuple(children), tuple(sorted(alone)))


def _close(heads: list[list[int]], run: list[int], end: int, min_shared: int, children: list[PrefixTree], alone: list[int]) -> None:
    if len(run) > 1:
        children.append(_branch(heads, tuple(run), end, min_shared))
    else:
        alone.extend(run)


def _overlap(first: list[int], second: list[int], start: int) -> int:
    """How many tokens from `start` on the two lists have in common."""
    return len(os.path.commonprefix([first[start:], second[start:]]))


def flat_tree(count: int) -> PrefixTree:
    """No sharing: every row runs its whole prompt on its own."""
    rows = tuple(range(count))
    return PrefixTree(0, 0, rows, (), rows)


def packed_positions(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], tree: PrefixTree) -> int:
    """Token positions the forward passes of `tree` lay out: each node's tokens once, then its alone rows padded."""
    own = tree.end - tree.start
    if tree.alone:
        widest_prompt = max(len(prompts[row]) - tree.end for row in tree.alone)
        own += len(tree.alone) * (widest_prompt + max(len(responses[row]) for row in tree.alone))
    return own + sum(packed_positions(prompts, responses, child) for child in tree.children)


@dataclass(frozen=True)
class RowGroup:
    """Rows that run together after a node: their rest of the prompt and response (layout in the module docstring)."""

    rows: Tensor  # [b] their indices in the batch
    input_ids: Tensor  # [b, P + R - 1]
    attention_mask: Tensor  # [b, P + R - 1]: 1 on real tokens
    position_ids: Tensor  # [b, P + R - 1]: counted on from the node's end
    response_width: int  # R: this group's longest response


@dataclass(frozen=True)
class PrefixNode:
    """Tokens every row below reads next (computed once, as one row), what branches off, who goes on alone."""

    token_ids: Tensor  # [1, L]; L = 0 at a root that shares nothing
    children: tuple[PrefixNode, ...]
    alone: RowGroup | None


@dataclass(frozen=True)
class PackedRows:
    """Prompt/response rows packed for teacher forcing: the targets, and the passes that predict them."""

    response_ids: Tensor  # [B, R], right-padded with 0
    mask: Tensor  # [B, R] bool: a real response token
    root: PrefixNode

    @property
    def shares_prefix(self) -> bool:
        """Whether any tokens are computed once for several rows."""
        return self.root.token_ids.shape[1] > 0 or bool(self.root.children)


def pack_rows(
    prompts: Sequence[list[int]], responses: Sequence[list[int]], device: torch.device, share_prefix: bool = False
) -> PackedRows:
    """Pack the rows for teacher forcing; with `share_prefix`, every prefix shared by rows is computed once.

    Without it, one group: prompts left-padded, responses right-padded, every response starting in
    one column. With it, the prompts' `prefix_tree`: exact (each row sees the same tokens at the
    same positions), and a prefix costs its length once instead of once per row.
    """
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        if response and not prompt:
            raise ValueError(f"row {row}: a response needs at least one prompt token to be predicted from")
    tree = prefix_tree(prompts) if share_prefix else flat_tree(len(prompts))
    response_width = max(len(response) for response in responses)
    lengths = torch.tensor([len(response) for response in responses], device=device)
    return PackedRows(
        response_ids=torch.tensor([response + [0] * (response_width - len(response)) for response in responses],
                                  dtype=torch.long, device=device),  # fmt: skip
        mask=torch.arange(response_width, device=device).unsqueeze(0) < lengths.unsqueeze(1),
        root=_node(tree, prompts, responses, device),
    )


def _node(tree: PrefixTree, prompts: Sequence[list[int]], responses: Sequence[list[int]], device: torch.device) -> PrefixNode:
    token_ids = torch.tensor([prompts[tree.members[0]][tree.start : tree.end]], dtype=torch.long, device=device)
    children = tuple(_node(child, prompts, responses, device) for child in tree.children)
    alone = _row_group(tree.alone, prompts, responses, tree.end, device) if tree.alone else None
    return PrefixNode(token_ids.reshape(1, -1), children, alone)


def _row_group(
    rows: Sequence[int], prompts: Sequence[list[int]], responses: Sequence[list[int]], offset: int, device: torch.device
) -> RowGroup:
    """`rows` from prompt position `offset` on, left-padded so that their responses start in one column."""
    rests = [prompts[row][offset:] for row in rows]
    answers = [responses[row] for row in rows]
    prompt_width, response_width = max(len(rest) for rest in rests), max(len(answer) for answer in answers)
    ids, real = [], []
    for rest, answer in zip(rests, answers):
        left, right = prompt_width - len(rest), response_width - len(answer)
        ids.append([0] * left + rest + answer + [0] * right)
        real.append([0] * left + [1] * (len(rest) + len(answer)) + [0] * right)
    attention = torch.tensor(real, device=device)[:, :-1]
    return RowGroup(
        rows=torch.tensor(list(rows), dtype=torch.long, device=device),
        input_ids=torch.tensor(ids, dtype=torch.long, device=device)[:, :-1],
        attention_mask=attention,
        position_ids=(attention.cumsum(-1) - 1).clamp(min=0) + offset,
        response_width=response_width,
    )


def can_share_prefix(model: torch.nn.Module) -> bool:
    """Whether `model` can run prefix trees: logits from its output layer, full attention without dropout, no checkpointing.

    Sliding-window and recurrent layers keep other state than keys and values; a checkpointed
    layer is recomputed in the backward pass, after its tree pass, with the model's own attention
    (`engines.prefix_attention` is the model's for one pass only); the tree's attention has no dropout.
    """
    if not logits_are_the_output_layer(model):
        return False
    if getattr(model.config.get_text_config(), "attention_dropout", 0.0):
        return False
    # transformers 5.24 calls it activation checkpointing; earlier releases, gradient checkpointing
    checkpointing = getattr(model, "is_activation_checkpointing", None)
    if checkpointing if checkpointing is not None else getattr(model, "is_gradient_checkpointing", False):
        return False
    layer_types = getattr(model.config.get_text_config(), "layer_types", None) or ["full_attention"]
    return all(layer_type == "full_attention" for layer_type in layer_types)


def response_logits(model: torch.nn.Module, rows: PackedRows) -> Tensor:
    """[B, R, V] logits, position t predicting response token t (float32 at least, for the loss math)."""
    width = rows.response_ids.shape[1]
    if width == 0:
        # logits_to_keep=0 would mean "every position" to transformers, not "none".
        raise ValueError("no response token to score")
    if rows.shares_prefix:
        raise ValueError("whole logits are computed for unshared rows only (pack_rows without share_prefix)")
    group = rows.root.alone
    assert group is not None  # a flat tree runs every row alone
    output = model(input_ids=group.input_ids, attention_mask=group.attention_mask, position_ids=group.position_ids,
                   use_cache=False, logits_to_keep=width)  # fmt: skip
    return _at_least_float32(output.logits)


def response_hidden_states(model: torch.nn.Module, rows: PackedRows) -> Tensor:
    """[B, R, H] the decoder's last hidden states at the positions that predict the response tokens.

    Walks the prefix tree: a node's tokens go through the decoder once, attending to its
    ancestors' keys and values and causally to its own; its rows that go on alone run together,
    attending to the keys and values of every node on their path, read once for all of them
    (`engines.prefix_attention`), and causally to their own. Each row's gradient flows back into
    the one pass of every node it read.
    """
    width = rows.response_ids.shape[1]
    decoder = model.get_decoder()
    parts: list[tuple[Tensor, Tensor]] = []
    _walk(decoder, rows.root, (), 0, width, parts)
    batch = rows.response_ids.shape[0]
    if len(parts) == 1 and parts[0][0].numel() == batch:
        return parts[0][1]  # one group of every row, in order (a group's rows are sorted)
    first = parts[0][1]
    hidden = first.new_zeros(batch, width, first.shape[-1])
    return hidden.index_copy(0, torch.cat([index for index, _ in parts]), torch.cat([states for _, states in parts]))


def _walk(
    decoder: torch.nn.Module,
    node: PrefixNode,
    ancestors: tuple[dict[int, KeysValues], ...],
    start: int,
    width: int,
    parts: list[tuple[Tensor, Tensor]],
) -> None:
    """Run `node` on top of `ancestors` (the keys and values of the nodes above it), then its children and alone rows."""
    length = node.token_ids.shape[1]
    if length:
        positions = torch.arange(start, start + length, device=node.token_ids.device).unsqueeze(0)
        node_pass = TreePass(ancestors, real=None)
        _tree_pass(decoder, node.token_ids, positions, node_pass)
        ancestors = (*ancestors, node_pass.made)
    for child in node.children:
        _walk(decoder, child, ancestors, start + length, width, parts)
    group = node.alone
    if group is None or group.response_width == 0:
        return  # nothing of these rows is scored (a padded column of zeros is never read)
    if ancestors:
        states = _tree_pass(decoder, group.input_ids, group.position_ids, TreePass(ancestors, group.attention_mask.bool()))
    else:  # rows that share nothing: transformers' own attention, as unshared packing runs them
        states = decoder(input_ids=group.input_ids, attention_mask=group.attention_mask, position_ids=group.position_ids,
                         use_cache=False).last_hidden_state  # fmt: skip
    parts.append((group.rows, F.pad(states[:, -group.response_width :, :], (0, 0, 0, width - group.response_width))))


def _tree_pass(decoder: torch.nn.Module, input_ids: Tensor, position_ids: Tensor, tree_pass: TreePass) -> Tensor:
    """One pass of the prefix tree through `decoder`: its last hidden states [b, L, H]; `tree_pass.made` fills in."""
    with tree_attention(decoder, tree_pass) as attention:
        return decoder(input_ids=input_ids, position_ids=position_ids, use_cache=False, **attention).last_hidden_state


def _at_least_float32(values: Tensor) -> Tensor:
    return values if values.dtype in (torch.float32, torch.float64) else values.float()


@dataclass(frozen=True)
class ResponseScores:
    """Per-response-token figures of one forward pass, computed without a [B, R, V] tensor."""

    logprobs: Tensor  # [B, R] log π(response_t)
    entropy: Tensor  # [B, R] entropy of π at position t, in nats
    at_ids: Tensor | None  # [B, R, K] log π of the `extra_ids` asked for (the OPD teacher's top K)


def response_scores(
    model: torch.nn.Module, rows: PackedRows, extra_ids: Tensor | None = None, chunk_tokens: int = 1024,
    allowed_bits: Tensor | None = None,
) -> ResponseScores:
    """Log-probs, entropies and log-probs at `extra_ids` of the response tokens, `chunk_tokens` positions at a time.

    `allowed_bits` ([B, R, W] int32, `model.constraints`): for responses decoded under a grammar, the
    tokens each position could have been sampled from; the distribution is masked to them and
    renormalised (the one the engine sampled from), everywhere it is used here.

    The same numbers as `response_logits` followed by a log-softmax, but the vocabulary-sized
    logits exist for one chunk of positions at a time, forward and backward: the decoder's hidden
    states [B, R, H] are kept, and each chunk's logits are recomputed from them in the backward
    pass (activation checkpointing over the output layer). For a 152K vocabulary the logits of
    4 × 1,024 response tokens are 2.5 GB in float32, before the log-softmax and its gradient;
    here they are 0.6 GB per 1,024 positions, whatever the batch. Models whose logits are not
    just the output layer of the decoder's last hidden state (a soft cap, a scale) take the
    plain path (`response_logits`), which is exact for every model.
    """
    width = rows.response_ids.shape[1]
    if width == 0:
        raise ValueError("no response token to score")
    if chunk_tokens < 1:
        raise ValueError("chunk_tokens must be at least 1")
    if rows.shares_prefix and not can_share_prefix(model):
        raise ValueError("this model cannot share prompt prefixes between rows (see can_share_prefix): pack them unshared")
    if not logits_are_the_output_layer(model):
        logits = masked_logits(response_logits(model, rows), allowed_bits)
        return _scores_of_logits(logits, rows.response_ids, extra_ids)
    hidden = response_hidden_states(model, rows)
    output_layer = model.get_output_embeddings()
    batch = hidden.shape[0]
    flat_hidden = hidden.reshape(batch * width, hidden.shape[-1])
    flat_ids = rows.response_ids.reshape(-1)
    flat_extra = extra_ids.reshape(batch * width, -1) if extra_ids is not None else None
    flat_allowed = allowed_bits.reshape(batch * width, -1) if allowed_bits is not None else None
    parts = []
    for start in range(0, batch * width, chunk_tokens):
        stop = start + chunk_tokens
        extra = flat_extra[start:stop] if flat_extra is not None else None
        allowed = flat_allowed[start:stop] if flat_allowed is not None else None

        def chunk(states: Tensor, ids: Tensor, extra: Tensor | None = extra, allowed: Tensor | None = allowed) -> tuple[Tensor, ...]:
            logits = masked_logits(_at_least_float32(output_layer(states)), allowed)
            scores = _scores_of_logits(logits, ids, extra)
            return (scores.logprobs, scores.entropy) + ((scores.at_ids,) if scores.at_ids is not None else ())

        if torch.is_grad_enabled() and flat_hidden.requires_grad:
            parts.append(torch.utils.checkpoint.checkpoint(chunk, flat_hidden[start:stop], flat_ids[start:stop], use_reentrant=False))
        else:
            parts.append(chunk(flat_hidden[start:stop], flat_ids[start:stop]))
    logprobs = torch.cat([part[0] for part in parts]).reshape(batch, width)
    entropy = torch.cat([part[1] for part in parts]).reshape(batch, width)
    at_ids = torch.cat([part[2] for part in parts]).reshape(batch, width, -1) if extra_ids is not None else None
    return ResponseScores(logprobs, entropy, at_ids)


def _scores_of_logits(logits: Tensor, token_ids: Tensor, extra_ids: Tensor | None) -> ResponseScores:
    """Log-prob of each token, entropy, and log-probs at `extra_ids`, from logits [..., V] (one logsumexp)."""
    normaliser = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1) - normaliser
    # H = logsumexp(z) − Σ p·z: never evaluates log p, so finite where p underflows (losses.entropy_from_logits);
    # a token masked out by a grammar (z = −inf, p = 0) adds 0, not 0·(−inf)
    finite = logits.masked_fill(logits == float("-inf"), 0.0)
    entropy = normaliser - (torch.softmax(logits, dim=-1) * finite).sum(dim=-1)
    at_ids = logits.gather(-1, extra_ids) - normaliser.unsqueeze(-1) if extra_ids is not None else None
    return ResponseScores(chosen, entropy, at_ids)


def logits_are_the_output_layer(model: torch.nn.Module) -> bool:
    """Whether the model's logits are its output layer applied to its decoder's last hidden state, nothing more."""
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if config is not None else None
    if text_config is None or getattr(text_config, "final_logit_softcapping", None) or getattr(text_config, "logit_scale", None):
        return False
    try:
        return model.get_decoder() is not None and model.get_output_embeddings() is not None
    except (AttributeError, NotImplementedError):
        return False


def token_logprobs(logits: Tensor, token_ids: Tensor) -> Tensor:
    """log softmax(logits)[token] without materialising the full log-softmax: z_token − logsumexp(z)."""
    return logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


@torch.no_grad()  # the result is Python lists: no gradient could flow through it
def score_response(
    model: torch.nn.Module, prompt_token_ids: list[int], response_token_ids: list[int], top_k: int,
    allowed_bits: Tensor | None = None,
) -> ScoredResponse:
    """The `Engine.score` contract for one row: each response token's log-prob, plus the top_k per position.

    top_k=0 gives empty lists per position; a top_k above the vocabulary size is clamped to it.
    `allowed_bits` ([R, W]): score under a grammar's masks, as `response_scores` does.
    """
    if not response_token_ids:
        return ScoredResponse(logprobs=[], top_token_ids=[], top_logprobs=[])
    rows = pack_rows([prompt_token_ids], [response_token_ids], next(model.parameters()).device)
    logits = response_logits(model, rows)[0]
    if allowed_bits is not None:
        logits = masked_logits(logits, allowed_bits.to(logits.device))
    chosen = token_logprobs(logits, rows.response_ids[0]).tolist()
    if not top_k:
        return ScoredResponse(chosen, [[] for _ in chosen], [[] for _ in chosen])
    top_values, top_ids = logits.topk(min(top_k, logits.shape[-1]), dim=-1)
    top_logprobs = top_values - torch.logsumexp(logits, dim=-1, keepdim=True)
    return ScoredResponse(chosen, top_ids.tolist(), top_logprobs.tolist())
