"""The `hf` engine's decode batches: requests, their rows, and the left-padded KV cache they share.

A batch holds the rows that run on one model: the base model's (version 0 and every LoRA version
on it, whatever adapter each row uses) or one full-weight copy's. A prefilled row joins by left-padding the shorter
caches with zero columns; finished rows leave, and columns that became padding for every row are
trimmed. Padding only ever sits left of a row's real tokens, so the relative distances between
real tokens are those of a solo decode. Worker-thread state: nothing here is shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from clawrl.engines.base import GenerationStream, SamplingParams
from clawrl.model.constraints import Constraint


def _left_pad(states: torch.Tensor, columns: int) -> torch.Tensor:
    """Prepend `columns` zero positions to KV states shaped [batch, heads, seq, head_dim]."""
    return F.pad(states, (0, 0, columns, 0)) if columns else states


@dataclass
class Request:
    """A submitted generation, waiting for or holding a batch row."""

    prompt_ids: list[int]
    sampling: SamplingParams
    stream: GenerationStream
    max_new_tokens: int  # sampling.max_tokens, cut so that prompt + response fits the context
    constraint: Constraint | None = None  # sampling.grammar as it is decoded

    @property
    def version(self) -> int:
        return self.stream.policy_version


@dataclass
class Row:
    """One sequence being decoded inside a `Batch`."""

    request: Request
    generator: torch.Generator | None
    next_token: int = -1  # the last sampled token: the input of the next decode step
    generated: int = 0
    pad: int = 0  # leading padding columns of this row in the batch's KV cache


class Batch:
    """Rows of one model (`frame`: 0 for the base model and its adapters, N for full-weight vN) decoded
    together over one left-padded `DynamicCache`.

    Invariants: every layer's keys/values are [len(rows), heads, width, head_dim]; row i's real
    tokens occupy columns [rows[i].pad, width); at least one row has pad 0 (no wasted column).
    """

    def __init__(self, frame: int) -> None:
        self.frame = frame
        self.rows: list[Row] = []
        self.cache: DynamicCache | None = None

    @property
    def width(self) -> int:
        return self.cache.get_seq_length() if self.cache is not None else 0

    def add(self, joining: list[tuple[Row, DynamicCache]]) -> None:
        """Merge freshly prefilled rows (each with its own single-row cache) into the batch."""
        caches = ([self.cache] if self.cache is not None else []) + [cache for _, cache in joining]
        width = max(cache.get_seq_length() for cache in caches)
        shifts = [width - cache.get_seq_length() for cache in caches]
        if self.cache is not None:
            for row in self.rows:
                row.pad += shifts[0]
        for (row, _), shift in zip(joining, shifts[len(caches) - len(joining) :]):
            row.pad = shift
        merged = caches[0]
        if len(caches) > 1:
            for index, layer in enumerate(merged.layers):
                layer.keys = torch.cat([_left_pad(c.layers[index].keys, s) for c, s in zip(caches, shifts)])
                layer.values = torch.cat([_left_pad(c.layers[index].values, s) for c, s in zip(caches, shifts)])
        self.cache = merged
        self.rows.extend(row for row, _ in joining)

    def keep(self, indices: list[int]) -> None:
        """Keep only the rows at `indices`, then drop columns that are padding for all of them."""
        if len(indices) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in indices]
        if not self.rows:
            self.cache = None
            return
        trim = min(row.pad for row in self.rows)
        assert self.cache is not None
        selected = torch.tensor(indices, device=self.cache.layers[0].keys.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys[selected, :, trim:]
            layer.values = layer.values[selected, :, trim:]
        for row in self.rows:
            row.pad -= trim

    def decode_inputs(self, device: torch.device) -> dict[str, Any]:
        """Forward kwargs for one decode step: the last token of every row, masked and positioned."""
        width = self.width
        pads = torch.tensor([row.pad for row in self.rows], device=device)
        return {
            "input_ids": torch.tensor([[row.next_token] for row in self.rows], device=device),
            # Columns [0, pad) are padding; the new token's own column (index `width`) is real.
            "attention_mask": torch.arange(width + 1, device=device)[None, :] >= pads[:, None],
            # A row's next position is the number of real tokens it already has.
            "position_ids": (width - pads)[:, None],
            "past_key_values": self.cache,
            "use_cache": True,
        }
