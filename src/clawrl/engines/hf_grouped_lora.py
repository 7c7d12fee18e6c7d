"""The `hf` engine's LoRA adapters as stacks: one batched matmul for rows of any mix of adapters.

PEFT serves several adapters by switching: `set_adapter` walks every module of the model (about
4 ms on the tiny model, more than its whole forward), and its mixed-adapter forward runs, inside
every LoRA layer, one sub-batch per distinct adapter, so a decode step of 32 users' rows costs
about 15 times a one-adapter step. Here, as Punica's and S-LoRA's gathered matmuls do, every LoRA
layer keeps the attached adapters stacked by slot, Aᵀ as (slots, in, r) and (B·scaling)ᵀ as
(slots, r, out), slot 0 all zeros for the base model. A forward either names one slot for all its
rows (`select`: a prefill, a scoring pass, a batch of one version) or one slot per row (`rows`: a
decode step of several users); a forward hook on each LoRA layer adds the LoRA term, gathered per
row with two batched matmuls whatever the number of distinct adapters. PEFT's own adapter layers
stay switched off, so its forward runs the base layers only, and nothing of it is copied or patched.

Attaching an adapter writes its slot (the stacks grow by doubling, and to a larger rank when one
comes, padded with zeros); freeing one empties its slot. The stacks are a second copy of the
attached adapters' weights, which `--max-loaded-adapters` bounds. An adapter PEFT builds
differently (DoRA and other variants, a bias on B, LoRA on embeddings) cannot be stacked: `add`
says so, and the caller goes back to PEFT's own switching for good.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from peft.tuners.lora.layer import Linear as LoraLinear

_INITIAL_SLOTS = 4  # the base's zeros and three adapters; doubled as more are attached


class _Stack:
    """One LoRA layer's adapters by slot, laid out for `bmm`: Aᵀ (slots, in, r), (B·scaling)ᵀ (slots, r, out)."""

    def __init__(self, layer: LoraLinear, slots: int, rank: int, dtype: torch.dtype) -> None:
        base = layer.get_base_layer()
        self.layer = layer
        device = base.weight.device
        self.a_t = torch.zeros(slots, base.in_features, rank, dtype=dtype, device=device)
        self.b_t = torch.zeros(slots, rank, base.out_features, dtype=dtype, device=device)

    def write(self, slot: int, name: str | None) -> None:
        """Slot `slot` holds adapter `name` of this layer (zeros: the adapter does not reach this layer)."""
        self.a_t[slot].zero_()
        self.b_t[slot].zero_()
        if name is not None and name in self.layer.lora_A:
            a, b = self.layer.lora_A[name].weight, self.layer.lora_B[name].weight
            self.a_t[slot, :, : a.shape[0]] = a.T
            self.b_t[slot, : b.shape[1]] = (b * self.layer.scaling[name]).T  # the scale folded in once

    def resized(self, slots: int, rank: int) -> _Stack:
        bigger = _Stack(self.layer, slots, rank, self.a_t.dtype)
        old_slots, old_rank = self.a_t.shape[0], self.a_t.shape[2]
        bigger.a_t[:old_slots, :, :old_rank] = self.a_t
        bigger.b_t[:old_slots, :old_rank] = self.b_t
        return bigger


class GroupedLoRA:
    """Every adapter attached to one `PeftModel`, stacked per LoRA layer, and the hooks that apply them."""

    def __init__(self, peft: PeftModel) -> None:
        self._peft = peft
        self._slots: dict[str, int] = {}
        self._capacity = _INITIAL_SLOTS
        self._rank = 1
        self._stacks: dict[torch.nn.Module, _Stack] = {}
        self._hooks: list[Any] = []
        self._rows: int | torch.Tensor = 0  # one slot for every row, or each row's slot

    def add(self, name: str) -> bool:
        """Stack adapter `name` (already loaded into PEFT) into a free slot; False when it cannot be
        stacked, and then nothing changed."""
        layers = [module for module in self._peft.modules() if isinstance(module, LoraLayer)]
        if not all(_plain(layer, name) for layer in layers):
            return False
        reached = [layer for layer in layers if name in layer.lora_A]
        rank = max([self._rank, *(layer.lora_A[name].weight.shape[0] for layer in reached)])
        dtype = reached[0].lora_A[name].weight.dtype if reached else torch.float32  # the math PEFT would do
        free = self._free_slot()
        capacity = self._capacity if free < self._capacity else 2 * self._capacity
        for layer in layers:
            layer.enable_adapters(False)  # PEFT's forward runs the base layer only; the hook adds the LoRA term
            if layer not in self._stacks:  # a layer the first adapters did not reach
                self._stacks[layer] = _Stack(layer, capacity, rank, dtype)  # type: ignore[arg-type]
                self._hooks.append(layer.register_forward_hook(self._add_lora_term))
            elif capacity != self._capacity or rank != self._rank:
                self._stacks[layer] = self._stacks[layer].resized(capacity, rank)
            self._stacks[layer].write(free, name)
        self._capacity, self._rank = capacity, rank
        self._slots[name] = free
        return True

    def remove(self, name: str) -> None:
        """Empty the slot of adapter `name`, for the next one attached."""
        slot = self._slots.pop(name)
        for stack in self._stacks.values():
            stack.write(slot, None)

    def close(self) -> None:
        """Remove the hooks and switch PEFT's adapter layers back on (falling back to PEFT's switching)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        for layer in self._stacks:
            layer.enable_adapters(True)  # type: ignore[operator]
        self._stacks.clear()

    def select(self, name: str | None) -> None:
        """Every row of the following forwards runs with adapter `name` (None: the base model)."""
        self._rows = 0 if name is None else self._slots[name]

    @contextmanager
    def rows(self, adapter_names: Sequence[str | None], device: torch.device) -> Iterator[None]:
        """Within the block, row i of a forward runs with adapter `adapter_names[i]` (None: none)."""
        selected = self._rows
        self._rows = torch.tensor([0 if name is None else self._slots[name] for name in adapter_names], device=device)
        try:
            yield
        finally:
            self._rows = selected

    def _add_lora_term(self, layer: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor | None:
        rows = self._rows
        if isinstance(rows, int) and rows == 0:
            return None  # the base model: nothing to add
        stack = self._stacks[layer]
        x = args[0].to(stack.a_t.dtype)  # (rows, tokens, in)
        if isinstance(rows, int):
            term = (x @ stack.a_t[rows]) @ stack.b_t[rows]
        else:  # index_select, not `a_t[rows]`: on CPU the advanced-indexing gather costs several times more
            term = torch.bmm(torch.bmm(x, stack.a_t.index_select(0, rows)), stack.b_t.index_select(0, rows))
        return output + term.to(output.dtype)

    def _free_slot(self) -> int:
        taken = set(self._slots.values())
        return next(slot for slot in range(1, self._capacity + 1) if slot not in taken)


def _plain(layer: LoraLayer, name: str) -> bool:
    """Adapter `name` of this LoRA layer is A then B: a linear layer, no variant (DoRA, ...), no bias on B."""
    if name in getattr(layer, "lora_embedding_A", {}) or name in getattr(layer, "lora_variant", {}):
        return False
    if not isinstance(layer, LoraLinear):
        return name not in layer.lora_A
    return name not in layer.lora_B or layer.lora_B[name].bias is None
