"""The hf engine's prefix cache: the KV of recent prompts, so that a prompt sharing a start with one
of them prefills only the rest.

Agents re-send everything on every request: OpenClaw's system prompt and tool schemas alone are
some 20K tokens with the tiny tokenizer, and a later turn's prompt is the previous turn's prompt
plus the answer and a new message. Without a cache every turn pays a full prefill.

Correctness:

* An entry belongs to one policy (`policy_key`: a number given to each loaded policy, never reused,
  so a version's cache can never serve another version's requests, nor a version loaded again
  under the same number) and its keys and values are exactly what that policy computed for its
  tokens. Causal attention makes the KV of the first n tokens depend on those n tokens only, so a
  prompt that starts with the same n ids can take them as they are.
* Reuse is by exact token ids (the longest common prefix with any entry of the same policy), never
  by text.
* The stored tensors are never written to: the engine's cache layers replace their tensors on
  every update (`torch.cat`, slicing), so an entry can hold the very tensors a request's prefill
  made, without a copy. A request starts from a copy of the entry's slice.
* Memory is bounded by `budget_bytes`; the least recently used entries go first. An entry that a
  newer prompt of the same policy extends is dropped at once: an agent's session keeps one entry
  that grows turn by turn.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass
class _Entry:
    policy_key: int
    ids: torch.Tensor  # int64 [n], on the CPU
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values of shape [1, heads, n, head_dim]
    nbytes: int


def common_prefix_length(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading ids two 1-D id tensors share."""
    length = min(len(a), len(b))
    differs = (a[:length] != b[:length]).nonzero()
    return int(differs[0]) if len(differs) else length


class PrefixCache:
    """KV of recent prompts by policy; see the module docstring. Used by one thread only."""

    def __init__(self, budget_bytes: int, max_entries: int = 64) -> None:
        self.budget_bytes = budget_bytes
        self.max_entries = max_entries
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # by entry serial, least recently used first
        self._serial = 0
        self.nbytes = 0
        self.hits = 0  # prompts that reused a cached prefix
        self.reused_tokens = 0  # prompt tokens not prefilled thanks to the cache

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, policy_key: int, prompt: list[int]) -> tuple[DynamicCache | None, int]:
        """A cache holding the longest cached prefix of `prompt` under `policy_key` (at most all but
        the prompt's last token, which must be run for its logits), and its length; (None, 0) if none
        covers at least half the prompt: a prefill after a prefix attends through an explicit mask,
        which costs more than a short prefix saves (measured: 20K tokens after a 5-token prefix took
        6x as long as without one)."""
        if not self._entries:
            return None, 0
        ids = torch.tensor(prompt)
        best, best_length = None, 0
        for serial, entry in self._entries.items():
            if entry.policy_key == policy_key:
                length = common_prefix_length(entry.ids, ids)
                if length > best_length:
                    best, best_length = serial, length
        best_length = min(best_length, len(prompt) - 1)
        if best is None or best_length <= 0 or 2 * best_length < len(prompt):
            return None, 0
        entry = self._entries[best]
        self._entries.move_to_end(best)
        self.hits += 1
        self.reused_tokens += best_length
        return DynamicCache(ddp_cache_data=[(keys[:, :, :best_length], values[:, :, :best_length]) for keys, values in entry.layers]), best_length

    def store(self, policy_key: int, prompt: list[int], cache: DynamicCache) -> None:
        """Keep the KV that a prefill of `prompt` under `policy_key` left in `cache` (no copy)."""
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        nbytes = sum(keys.nbytes + values.nbytes for keys, values in layers)
        if not self.enabled or nbytes > self.budget_bytes or any(keys.shape[2] != len(prompt) for keys, _ in layers):
            return  # too big, or a cache of another shape (a sliding window): not cached
        ids = torch.tensor(prompt)
        for serial, entry in list(self._entries.items()):  # entries this prompt extends are superseded
            if entry.policy_key == policy_key and len(entry.ids) <= len(ids) and common_prefix_length(entry.ids, ids) == len(entry.ids):
                self._drop(serial)
        self._serial += 1
        self._entries[self._serial] = _Entry(policy_key, ids, layers, nbytes)
        self.nbytes += nbytes
        while self.nbytes > self.budget_bytes or len(self._entries) > self.max_entries:
            self._drop(next(iter(self._entries)))

    def forget(self, policy_key: int) -> None:
        """Drop every entry of a policy (it was released)."""
        for serial in [serial for serial, entry in self._entries.items() if entry.policy_key == policy_key]:
            self._drop(serial)

    def _drop(self, serial: int) -> None:
        self.nbytes -= self._entries.pop(serial).nbytes
