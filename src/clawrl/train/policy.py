"""The weights a trainer trains and what moves them: the model, its frozen reference, the optimizer.

The trainer (`trainer.py`) holds one beside the store, the samples and the publishing; each
data-parallel worker (`workers.py`) holds an identical one and nothing else, which is why they
are apart: a worker builds, loads and steps the same weights without a store of its own.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from clawrl.config import EngineConfig, LossConfig, TrainConfig
from clawrl.model.cuda_share import build_from_tensors, import_weights, wait_for_export
from clawrl.model.device import resolve_dtype
from clawrl.model.weights import load_causal_lm, shared_weights
from clawrl.train.update import update_step
from clawrl.types import StepMetrics, TrainingExample, WeightsKind
from clawrl.versions.files import TRAINER_STATE

log = logging.getLogger(__name__)

ADAPTER_WEIGHTS = "adapter_model.safetensors"
# how long a trainer started with the server waits for it to load and share the base on a GPU
SHARED_BASE_WAIT_S = 1800.0


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each decoder layer in the backward pass (`TrainConfig.activation_checkpointing`).

    Non-reentrant, so that gradients reach a LoRA adapter without the embeddings needing one;
    transformers 5.24 renamed the method from gradient to activation checkpointing.
    """
    options = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)


def lora_config(config: TrainConfig) -> LoraConfig:
    names = list(config.lora_target_modules)
    targets = "all-linear" if names == ["all-linear"] else names  # peft reads `all-linear` only as text, not as a name
    return LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules=targets, lora_dropout=0.0)


class TrainedPolicy:
    """The model being trained (a LoRA adapter on the base, or every weight with `--full`), the frozen
    reference where one is needed, the AdamW optimizer and the count of steps behind the weights."""

    def __init__(self, config: TrainConfig, engine_config: EngineConfig, device: torch.device,
                 server_pid: int | None = None) -> None:
        """`server_pid`: the `clawrl serve` that started this trainer; on a GPU its base weights are mapped."""
        self.config, self.device = config, device
        self.kind: WeightsKind = "full" if config.full else "lora"
        self.source = source = engine_config.model  # a local directory or hub id: `tiny` is resolved by the caller
        dtype = resolve_dtype(engine_config.dtype, device)
        torch.manual_seed(config.train_seed)  # the LoRA initialisation: the same on every data-parallel rank
        # on a CPU, the weights the server maps: one copy of the base on the host (LoRA never writes it)
        weights = shared_weights(source, dtype, device, engine_config.cache_dir, engine_config.share_weights)
        base = self._servers_base(engine_config, dtype, server_pid) or load_causal_lm(weights, dtype, device, engine_config.quantize)
        if config.activation_checkpointing:
            enable_activation_checkpointing(base)
        # The frozen starting weights: the OPD teacher with --teacher base and the KL reference.
        # With LoRA they are the same model with its adapter switched off; full fine-tuning needs a copy.
        self.reference: PreTrainedModel | None = None
        if config.full:
            self.model: Any = base
            if config.kl_beta > 0 or (config.teacher == "base" and config.method != "rl"):
                self.reference = load_causal_lm(weights, dtype, device)
                self.reference.eval().requires_grad_(False)
        else:
            self.model = get_peft_model(base, lora_config(config))
            self._initial_adapter = {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}
        self.optimizer = self.new_optimizer()
        self.step = 0  # optimizer steps behind the weights in memory

    def _servers_base(self, engine_config: EngineConfig, dtype: torch.dtype, server_pid: int | None) -> PreTrainedModel | None:
        """On a GPU, with LoRA, the base weights of the hf server that started this trainer, mapped
        through CUDA IPC (one copy on the device); None when they are not to be shared or not there."""
        shares = (server_pid is not None and self.kind == "lora" and engine_config.engine == "hf"
                  and self.device.type == "cuda" and engine_config.share_weights)  # fmt: skip
        if not shares:
            return None
        path = wait_for_export(engine_config.cache_dir, server_pid, SHARED_BASE_WAIT_S)
        if path is None:
            log.warning("the server's base weights were not shared within %.0f s; loading a copy", SHARED_BASE_WAIT_S)
            return None
        tensors, quantized = import_weights(path)
        log.info("mapped the server's base weights (%d tensors, one copy on the GPU)", len(tensors))
        return build_from_tensors(self.source, dtype, tensors, quantized)

    def update(self, examples: list[TrainingExample], loss: LossConfig, group: dist.ProcessGroup | None = None) -> StepMetrics:
        """One update on `examples` with the trainer's settings (`update.update_step`; `group`: data parallel)."""
        return update_step(
            self.model,
            self.optimizer,
            examples,
            loss,
            micro_batch_size=self.config.micro_batch_size,
            grad_clip=self.config.grad_clip,
            reference_model=self.reference,
            logit_chunk_tokens=self.config.logit_chunk_tokens,
            micro_batch_tokens=self.config.micro_batch_tokens,
            share_prefix=self.config.share_prefix,
            ppo_epochs=self.config.ppo_epochs,
            mini_batches=self.config.mini_batches,
            group=group,
        )

    def load_initial(self) -> None:
        """The starting point: the adapter as first initialised, or the base weights (from disk)."""
        if self.config.full:
            self._load_full_weights(self.source)
        else:
            set_peft_model_state_dict(self.model, self._initial_adapter)
        self.optimizer = self.new_optimizer()
        torch.manual_seed(self.config.train_seed)
        self.step = 0

    def load(self, path: Path) -> None:
        """The weights, optimizer moments, RNG and step count of the (verified) version directory `path`."""
        if self.config.full:
            self._load_full_weights(str(path))
        else:
            set_peft_model_state_dict(self.model, load_file(str(path / ADAPTER_WEIGHTS), device=str(self.device)))
        state = torch.load(path / TRAINER_STATE, map_location=self.device, weights_only=True)
        self.optimizer = self.new_optimizer()
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # the moments resume; the learning rate is today's flag
            group["lr"] = self.config.learning_rate()
        torch.set_rng_state(state["rng"].cpu())
        self.step = int(state["step"])

    def _load_full_weights(self, source: str) -> None:
        saved = load_causal_lm(source, self.model.dtype, self.device)
        self.model.load_state_dict(saved.state_dict())

    def save_weights(self, directory: Path) -> None:
        if self.config.full:
            self.model.save_pretrained(str(directory))
            return
        assert isinstance(self.model, PeftModel)
        # the adapter alone, as `PeftModel.save_pretrained` lays it out, without its README model card
        self.model.peft_config["default"].save_pretrained(str(directory))
        weights = {name: tensor.detach().contiguous() for name, tensor in get_peft_model_state_dict(self.model).items()}
        save_file(weights, str(directory / ADAPTER_WEIGHTS))

    def save_trainer_state(self, path: Path) -> None:
        torch.save({"optimizer": self.optimizer.state_dict(), "rng": torch.get_rng_state(), "step": self.step + 1}, path)

    def new_optimizer(self) -> torch.optim.Optimizer:
        parameters = [parameter for parameter in self.model.parameters() if parameter.requires_grad]
        return torch.optim.AdamW(parameters, lr=self.config.learning_rate())
