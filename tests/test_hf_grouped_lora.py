"""The stacked LoRA adapters give each row exactly what its own adapter alone gives under PEFT (float64)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from clawrl.engines.hf_grouped_lora import GroupedLoRA

EVERY_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# ranks 4, 16 then 8 (the stacks grow to a larger rank), and one adapter on two layer kinds only
ADAPTERS = {"a": {"r": 4, "lora_alpha": 8, "target_modules": EVERY_LINEAR},
            "b": {"r": 16, "lora_alpha": 32, "target_modules": EVERY_LINEAR},
            "c": {"r": 8, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj"]},
            "d": {"r": 4, "lora_alpha": 4, "target_modules": ["down_proj"]},
            "e": {"r": 2, "lora_alpha": 2, "target_modules": EVERY_LINEAR}}


def save_adapter(model_dir: Path, out: Path, seed: int, **config: object) -> Path:
    """A float64 LoRA adapter with random non-zero A and B, of the given LoraConfig fields."""
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64),
                           LoraConfig(**config))  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64) * 0.3)
    model.save_pretrained(out)
    return out


def logits_alone(model: PeftModel, input_ids: torch.Tensor, names: list[str | None]) -> torch.Tensor:
    """Row i under adapter names[i] alone, switched by PEFT."""
    rows = []
    for row, name in zip(input_ids, names):
        if name is None:
            with model.disable_adapter():
                rows.append(model(input_ids=row[None]).logits[0])
        else:
            model.set_adapter(name)
            rows.append(model(input_ids=row[None]).logits[0])
    return torch.stack(rows)


@pytest.fixture
def peft_model(tiny_model_dir: Path, tmp_path: Path) -> PeftModel:
    paths = {name: save_adapter(tiny_model_dir, tmp_path / name, seed, **config)
             for seed, (name, config) in enumerate(ADAPTERS.items(), start=1)}
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    model = PeftModel.from_pretrained(base, str(paths["a"]), adapter_name="a")
    for name in ADAPTERS:
        if name != "a":
            model.load_adapter(str(paths[name]), adapter_name=name)
    return model.eval()


@torch.no_grad()
def test_each_row_gets_its_own_adapter_whatever_the_others_in_the_batch(peft_model: PeftModel) -> None:
    names: list[str | None] = ["a", None, "b", "c", "d", "e", "a", "b"]
    input_ids = torch.randint(0, peft_model.config.vocab_size, (len(names), 5), generator=torch.Generator().manual_seed(0))
    alone = logits_alone(peft_model, input_ids, names)
    assert not torch.allclose(alone[0], alone[2], atol=1e-3)  # the adapters differ, so the checks can fail
    grouped = GroupedLoRA(peft_model)
    assert all(grouped.add(name) for name in ADAPTERS)  # five adapters: the stacks doubled their slots once
    base = peft_model.base_model.model  # what the engine runs: PEFT's adapter layers off, the hooks on
    with grouped.rows(names, torch.device("cpu")):
        torch.testing.assert_close(base(input_ids=input_ids).logits, alone, rtol=0, atol=1e-10)
    for index, name in enumerate(names):
        grouped.select(name)
        torch.testing.assert_close(base(input_ids=input_ids[index:index + 1]).logits[0], alone[index], rtol=0, atol=1e-10)


@torch.no_grad()
def test_a_freed_slot_serves_the_next_adapter_and_close_gives_back_pefts_switching(peft_model: PeftModel) -> None:
    input_ids = torch.randint(0, peft_model.config.vocab_size, (3, 4), generator=torch.Generator().manual_seed(1))
    alone = logits_alone(peft_model, input_ids, ["b", "e", None])
    grouped = GroupedLoRA(peft_model)
    for name in ("a", "b", "c"):
        grouped.add(name)
    grouped.remove("a")
    grouped.add("e")  # into a's slot
    base = peft_model.base_model.model
    with grouped.rows(["b", "e", None], torch.device("cpu")):
        torch.testing.assert_close(base(input_ids=input_ids).logits, alone, rtol=0, atol=1e-10)
    grouped.close()
    peft_model.set_adapter("e")
    torch.testing.assert_close(peft_model(input_ids=input_ids[1:2]).logits[0], alone[1], rtol=0, atol=1e-10)


def test_an_adapter_of_another_kind_is_not_stacked(tiny_model_dir: Path, tmp_path: Path) -> None:
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    model = PeftModel.from_pretrained(
        base, str(save_adapter(tiny_model_dir, tmp_path / "dora", 1, r=4, target_modules=["q_proj"], use_dora=True)),
        adapter_name="dora")
    assert GroupedLoRA(model).add("dora") is False
