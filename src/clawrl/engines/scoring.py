"""Teacher-forced scoring: log π(response_t | prompt, response_<t), computed in one place.

Serving (`HFEngine.score`), the trainer's OPD teacher and the policy update all compare numbers
of this one quantity: the importance weight divides the trainer's log-prob by the engine's, the
OPD advantage subtracts the student's from the teacher's. One implementation keeps them equal up
to the model's own arithmetic, instead of up to three chances of a shift or padding mismatch.

Sequence layout of a packed batch (why: bounded memory for long prompts):

    [pad … pad | prompt | response | pad … pad]      prompts left-padded to end in one column

Every response then starts in the same column, so the logits that predict response tokens are the
last R columns (R = the longest response) and the model is asked for just those
(`logits_to_keep`): the vocabulary-sized tensors are [B, R, V] however long the prompts are.
The last column (the last response token) is only ever a target, so it is not fed. Position ids
are counted from each row's first real token, so padding changes nothing but the amount of work.
All log-probs are of the RAW distribution (temperature 1), in float32.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint
from torch import Tensor

from clawrl.engines.base import ScoredResponse


@dataclass(frozen=True)
class PackedRows:
    """Prompt/response rows packed for teacher forcing (layout in the module docstring)."""

    input_ids: Tensor  # [B, P + R - 1]
    attention_mask: Tensor  # [B, P + R - 1]: 1 on real tokens
    position_ids: Tensor  # [B, P + R - 1]: counted from each row's first real token
    response_ids: Tensor  # [B, R], right-padded with 0
    mask: Tensor  # [B, R] bool: a real response token
    # [1, L]: tokens every row's prompt starts with, computed once (`shared_prefix_length`); the
    # rows above then hold only what follows them, and their positions count on from L
    prefix_ids: Tensor | None = None


def shared_prefix_length(prompts: Sequence[list[int]]) -> int:
    """How many leading tokens all `prompts` share, leaving each at least its last token of its own.

    That last token is the position that predicts the first response token, so every row still
    has a prompt after the prefix (G rollouts of one task share their whole prompt).
    """
    if len(prompts) < 2:
        return 0
    common = os.path.commonprefix([list(prompt) for prompt in prompts])
    return max(0, min(len(common), min(len(prompt) for prompt in prompts) - 1))


def pack_rows(
    prompts: Sequence[list[int]], responses: Sequence[list[int]], device: torch.device, share_prefix: bool = False
) -> PackedRows:
    """Left-pad the prompts and right-pad the responses so that every response starts in one column.

    With `share_prefix`, the prompts' common prefix is taken out and kept once (`prefix_ids`): the
    forward pass computes it for one row and lets every row attend to its keys and values, which
    is exact (each row sees the same tokens at the same positions) and costs the prefix once
    instead of once per row: an agent's 24K-token prompt re-sent every turn, a group's G rollouts.
    """
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        if response and not prompt:
            raise ValueError(f"row {row}: a response needs at least one prompt token to be predicted from")
    shared = shared_prefix_length(prompts) if share_prefix else 0
    if shared:
        rows = pack_rows([prompt[shared:] for prompt in prompts], responses, device)
        prefix = torch.tensor([list(prompts[0][:shared])], dtype=torch.long, device=device)
        return dataclasses.replace(rows, prefix_ids=prefix)
    prompt_width = max(len(prompt) for prompt in prompts)
    response_width = max(len(response) for response in responses)
    ids, real, response_ids = [], [], []
    for prompt, response in zip(prompts, responses):
        left, right = prompt_width - len(prompt), response_width - len(response)
        ids.append([0] * left + prompt + response + [0] * right)
        real.append([0] * left + [1] * (len(prompt) + len(response)) + [0] * right)
        response_ids.append(response + [0] * right)
    attention = torch.tensor(real, device=device)[:, :-1]
    lengths = torch.tensor([len(response) for response in responses], device=device)
    return PackedRows(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device)[:, :-1],
        attention_mask=attention,
        position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
        response_ids=torch.tensor(response_ids, dtype=torch.long, device=device),
        mask=torch.arange(response_width, device=device).unsqueeze(0) < lengths.unsqueeze(1),
    )


def response_logits(model: torch.nn.Module, rows: PackedRows) -> Tensor:
    """[B, R, V] logits, position t predicting response token t (float32 at least, for the loss math)."""
    width = rows.response_ids.shape[1]
    if width == 0:
        # logits_to_keep=0 would mean "every position" to transformers, not "none".
        raise ValueError("no response token to score")
    output = model(**_forward_inputs(model, rows), logits_to_keep=width)
    return _at_least_float32(output.logits)


def _forward_inputs(model: torch.nn.Module, rows: PackedRows) -> dict[str, Any]:
    """The keyword arguments of the forward pass over `rows`: with a shared prefix, its keys and values.

    The prefix goes through the decoder once, as one row, and its cache is repeated for every row
    (a differentiable copy: the gradient of each row's loss flows back into the one prefix pass).
    Each row's attention mask covers the prefix, then its own tokens; positions count on from L.
    """
    if rows.prefix_ids is None:
        return {"input_ids": rows.input_ids, "attention_mask": rows.attention_mask, "position_ids": rows.position_ids,
                "use_cache": False}  # fmt: skip
    length, batch = rows.prefix_ids.shape[1], rows.input_ids.shape[0]
    positions = torch.arange(length, device=rows.prefix_ids.device).unsqueeze(0)
    decoder = model.get_decoder()
    output = decoder(input_ids=rows.prefix_ids, position_ids=positions, use_cache=True)
    cache = output.cache if "cache" in output else output.past_key_values
    cache.batch_repeat_interleave(batch)
    prefix_mask = torch.ones(batch, length, dtype=rows.attention_mask.dtype, device=rows.attention_mask.device)
    # transformers 5.24 renamed `past_key_values` to `cache`; older releases know only the first
    cache_argument = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
    return {"input_ids": rows.input_ids, "attention_mask": torch.cat([prefix_mask, rows.attention_mask], dim=1),
            "position_ids": rows.position_ids + length, cache_argument: cache, "use_cache": True}  # fmt: skip


def _at_least_float32(values: Tensor) -> Tensor:
    return values if values.dtype in (torch.float32, torch.float64) else values.float()


@dataclass(frozen=True)
class ResponseScores:
    """Per-response-token figures of one forward pass, computed without a [B, R, V] tensor."""

    logprobs: Tensor  # [B, R] log π(response_t)
    entropy: Tensor  # [B, R] entropy of π at position t, in nats
    at_ids: Tensor | None  # [B, R, K] log π of the `extra_ids` asked for (the OPD teacher's top K)


def response_scores(
    model: torch.nn.Module, rows: PackedRows, extra_ids: Tensor | None = None, chunk_tokens: int = 1024
) -> ResponseScores:
    """Log-probs, entropies and log-probs at `extra_ids` of the response tokens, `chunk_tokens` positions at a time.

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
    if not logits_are_the_output_layer(model):
        logits = response_logits(model, rows)
        return _scores_of_logits(logits, rows.response_ids, extra_ids)
    hidden = model.get_decoder()(**_forward_inputs(model, rows)).last_hidden_state[:, -width:, :]
    output_layer = model.get_output_embeddings()
    batch = hidden.shape[0]
    flat_hidden = hidden.reshape(batch * width, hidden.shape[-1])
    flat_ids = rows.response_ids.reshape(-1)
    flat_extra = extra_ids.reshape(batch * width, -1) if extra_ids is not None else None
    parts = []
    for start in range(0, batch * width, chunk_tokens):
        stop = start + chunk_tokens
        extra = flat_extra[start:stop] if flat_extra is not None else None

        def chunk(states: Tensor, ids: Tensor, extra: Tensor | None = extra) -> tuple[Tensor, ...]:
            scores = _scores_of_logits(_at_least_float32(output_layer(states)), ids, extra)
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
    # H = logsumexp(z) − Σ p·z: never evaluates log p, so finite where p underflows (losses.entropy_from_logits)
    entropy = normaliser - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
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
    model: torch.nn.Module, prompt_token_ids: list[int], response_token_ids: list[int], top_k: int
) -> ScoredResponse:
    """The `Engine.score` contract for one row: each response token's log-prob, plus the top_k per position.

    top_k=0 gives empty lists per position; a top_k above the vocabulary size is clamped to it.
    """
    if not response_token_ids:
        return ScoredResponse(logprobs=[], top_token_ids=[], top_logprobs=[])
    rows = pack_rows([prompt_token_ids], [response_token_ids], next(model.parameters()).device)
    logits = response_logits(model, rows)[0]
    chosen = token_logprobs(logits, rows.response_ids[0]).tolist()
    if not top_k:
        return ScoredResponse(chosen, [[] for _ in chosen], [[] for _ in chosen])
    top_values, top_ids = logits.topk(min(top_k, logits.shape[-1]), dim=-1)
    top_logprobs = top_values - torch.logsumexp(logits, dim=-1, keepdim=True)
    return ScoredResponse(chosen, top_ids.tolist(), top_logprobs.tolist())
