"""The `hf` engine's policies: what serves each version, and the LoRA adapter switched on for it.

A LoRA version is a PEFT adapter named `v{N}` attached to the one base model and stacked by
`GroupedLoRA` (`hf_grouped_lora.py`): a forward for one version selects its slot (slot 0, the
base, for version 0), and a forward of rows of several versions names each row's slot
(`mixed_forward`), so no forward waits for PEFT to switch adapters. Should an adapter come that
cannot be stacked, PEFT's own switching (`set_adapter`, its mixed-adapter batch) serves from then
on. A full-weight version is a model copy of its own. Every `Policy` has a key that is never
reused, not even when a version is loaded again, so that the prefix cache can never serve one
version's keys and values to another. Which versions are held, current and in use is the engine's
`VersionTable`; this module only builds policies and frees their adapters. Worker-thread state:
the selected slot and PEFT's switching are not thread-safe, and nothing else touches them.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import PreTrainedModel

from clawrl.engines.hf_grouped_lora import GroupedLoRA

# Marks "which adapter is switched on is unknown", forcing the next forward to set it explicitly.
_ADAPTER_UNKNOWN = "<unknown>"
_MIXED = "<mixed>"  # marks "the adapter layers are on, each row names its adapter"
_BASE_ROW = "__base__"  # PEFT's name, in a mixed-adapter batch, for a row that runs without an adapter
_POLICY_KEYS = itertools.count(1)
logger = logging.getLogger(__name__)


@dataclass
class Policy:
    """What serves one version: a model, plus the LoRA adapter to switch on (None = plain model)."""

    model: PreTrainedModel
    adapter: str | None = None
    # never reused, not even for a version loaded again: what the prefix cache keys its entries by
    key: int = field(default_factory=lambda: next(_POLICY_KEYS))


class Adapters:
    """The base model and the LoRA adapters attached to it: stacked (`GroupedLoRA`), or, once an
    adapter that cannot be stacked comes, switched by PEFT."""

    def __init__(self, base: PreTrainedModel, device: torch.device) -> None:
        self.base = base
        self.device = device
        self._peft: PeftModel | None = None  # wraps the base once the first adapter is attached
        self._grouped: GroupedLoRA | None = None  # None: PEFT's own switching (no adapter yet, or one not stackable)
        self._selected: str | None = _ADAPTER_UNKNOWN  # PEFT's switching only: the adapter switched on

    def model_for(self, policy: Policy) -> PreTrainedModel:
        """The model to run for `policy`, with its adapter (or none) switched on."""
        if self._peft is None or policy.model is not self.base:
            return policy.model
        if self._grouped is not None:
            self._grouped.select(policy.adapter)
        elif self._selected != policy.adapter:
            if policy.adapter is None:
                self._peft.base_model.disable_adapter_layers()
            else:
                self._peft.base_model.enable_adapter_layers()
                self._peft.set_adapter(policy.adapter, inference_mode=True)
            self._selected = policy.adapter
        return policy.model

    def mixed_forward(self, adapter_names: list[str | None], inputs: dict[str, Any]) -> Any:
        """One forward of the base model in which row i runs with adapter `adapter_names[i]` (None:
        none), for a batch whose rows use several."""
        assert self._peft is not None, "rows of several versions on the base model need an adapter attached"
        if self._grouped is not None:
            with self._grouped.rows(adapter_names, self.device):
                return self.base(**inputs)
        if self._selected != _MIXED:  # off for version 0, or unknown: the mixed forward needs the layers on
            self._peft.base_model.enable_adapter_layers()
            self._selected = _MIXED  # layers on; which adapter is active is left to the next `model_for`
        names = [_BASE_ROW if name is None else name for name in adapter_names]
        return self._peft(**inputs, adapter_names=names)

    def attach(self, version: int, path: Path) -> Policy:
        """Attach the LoRA adapter at `path` as `v{version}`: the policy that serves that version."""
        name = f"v{version}"
        if self._peft is None:
            # Injecting LoRA layers leaves the base model's outputs unchanged while the adapter
            # is disabled, so rows of version 0 decoding right now are unaffected.
            self._peft = PeftModel.from_pretrained(
                self.base, str(path), adapter_name=name, is_trainable=False, torch_device=str(self.device)
            )
            self._grouped = GroupedLoRA(self._peft)
        else:
            self._peft.load_adapter(str(path), adapter_name=name, is_trainable=False, torch_device=str(self.device))
        if self._grouped is not None and not self._grouped.add(name):
            logger.info("adapter %s cannot be stacked (a LoRA variant or bias): PEFT switches adapters from now on", name)
            self._grouped.close()
            self._grouped = None
        self._selected = _ADAPTER_UNKNOWN
        return Policy(self.base, name)

    def delete(self, name: str) -> None:
        """Free an adapter no version uses any more."""
        assert self._peft is not None
        if self._grouped is not None:
            self._grouped.remove(name)
        others = [adapter for adapter in self._peft.peft_config if adapter != name]
        if self._peft.active_adapter == name and others:
            # Move off it first: PEFT warns when the active adapter is deleted under it.
            self._peft.set_adapter(others[-1], inference_mode=True)
        self._selected = _ADAPTER_UNKNOWN
        self._peft.delete_adapter(name)
