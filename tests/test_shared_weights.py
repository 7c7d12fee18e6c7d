"""One copy of the base weights per host (issue 30): the weights every process maps on a CPU."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from clawrl.config import EngineConfig
from clawrl.engines.hf import HFEngine
from clawrl.model.weights import shared_weights, stored_dtypes

CPU = torch.device("cpu")


def test_weights_in_the_served_dtype_are_mapped_as_they_are(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert stored_dtypes(tiny_model_dir) == {torch.float32}
    assert shared_weights(tiny_model_dir, torch.float32, CPU, tmp_path) == str(tiny_model_dir)
    assert not any(tmp_path.iterdir())  # nothing converted


def test_other_dtypes_are_converted_once_for_every_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    converted = Path(shared_weights(tiny_model_dir, torch.bfloat16, CPU, tmp_path))
    assert converted != tiny_model_dir and converted.is_relative_to(tmp_path)
    assert stored_dtypes(converted) == {torch.bfloat16}
    original, copy = load_file(tiny_model_dir / "model.safetensors"), load_file(converted / "model.safetensors")
    assert set(original) == set(copy)
    assert all(torch.equal(original[name].to(torch.bfloat16), copy[name]) for name in original)
    assert (converted / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()
    written = (converted / "model.safetensors").stat().st_mtime_ns
    # a second process (the trainer) gets the same folder, not a second conversion
    assert shared_weights(tiny_model_dir, torch.bfloat16, CPU, tmp_path) == str(converted)
    assert (converted / "model.safetensors").stat().st_mtime_ns == written


def test_nothing_is_converted_on_a_gpu_or_when_sharing_is_off(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert shared_weights(tiny_model_dir, torch.bfloat16, torch.device("cuda"), tmp_path) == str(tiny_model_dir)
    assert shared_weights(tiny_model_dir, torch.bfloat16, CPU, tmp_path, enabled=False) == str(tiny_model_dir)
    assert shared_weights("Qwen/Qwen3-0.6B", torch.bfloat16, CPU, tmp_path) == "Qwen/Qwen3-0.6B"  # a hub id
    assert not any(tmp_path.iterdir())


def test_the_engine_serves_from_pages_of_the_shared_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The engine's weights are mappings of the shared file (so the trainer's mapping shares its pages)."""
    config = EngineConfig(model=str(tiny_model_dir), device="cpu", dtype="bfloat16", cache_dir=tmp_path, cpu_threads=1)
    engine = HFEngine(config)
    asyncio.run(engine.start())
    try:
        shared = Path(shared_weights(tiny_model_dir, torch.bfloat16, CPU, tmp_path)) / "model.safetensors"
        mapped = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if line.endswith(".safetensors")}
        assert str(shared) in mapped
    finally:
        asyncio.run(engine.close())


def test_a_copy_is_deleted_once_its_source_is_gone_or_changed(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A model built in a temporary folder leaves no converted copy behind after the folder goes."""
    cache = tmp_path / "cache"
    source = tmp_path / "built-in-tmp"
    shutil.copytree(tiny_model_dir, source)
    gone_later = Path(shared_weights(source, torch.bfloat16, CPU, cache))
    kept = Path(shared_weights(tiny_model_dir, torch.bfloat16, CPU, cache))
    retired = cache / "weights-v1" / "model-0123456789abcdef"  # a copy from a layout without a source record
    retired.mkdir(parents=True)
    # the same source in float16 is a second copy; both are kept while the source stands
    half = Path(shared_weights(source, torch.float16, CPU, cache))
    assert {gone_later, half, kept} <= set((cache / "weights-v2").iterdir()) and not retired.exists()

    (source / "tokenizer_config.json").write_text((source / "tokenizer_config.json").read_text() + "\n")  # the source changes
    rebuilt = Path(shared_weights(source, torch.bfloat16, CPU, cache))
    assert rebuilt != gone_later and not gone_later.exists() and not half.exists() and kept.is_dir()

    shutil.rmtree(source)
    # any process asking, even for weights it maps as they are, clears copies of vanished sources
    assert shared_weights(tiny_model_dir, torch.float32, CPU, cache) == str(tiny_model_dir)
    assert list((cache / "weights-v2").iterdir()) == [kept]
