"""One copy of the base weights for every process on a host (the server, the trainer, a judge).

On a CPU, transformers loads safetensors weights that are already in the asked-for dtype by mapping
the file: the parameters are pages of the file, which the kernel keeps once in its page cache
however many processes map them, so the server and the trainer (its own process, DESIGN §2) hold
one copy between them, each counted half in its proportional set size (PSS). Weights stored in
another dtype (a bf16 checkpoint served in fp32, the CPU default) are converted by every process
into private memory instead: two full copies. `shared_weights` converts them once, into a cache
folder, and returns that folder for every process to map. A copy whose source folder is gone, or
whose source has changed since, is deleted the next time any process asks (a model built in a
temporary folder would otherwise leave gigabytes behind at every run).

A LoRA trainer never writes the base weights (only the adapter trains), so the mapped pages stay
shared; full fine-tuning writes every weight and gets private copies, as it must. On a GPU each
process still loads its own copy (`docs/sizing.md`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, PreTrainedModel

from clawrl.model.folders import build_once
from clawrl.model.quantize import quantize_linears

# safetensors' names for the dtypes a checkpoint holds
SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
CONVERTED_VERSION = "weights-v2"
# copies in a layout that no version reads any more; they are deleted (v1 had no record of its source)
RETIRED_VERSIONS = ("weights-v1",)
SOURCE_RECORD = "clawrl-source.json"


def stored_dtypes(model_dir: Path) -> set[torch.dtype]:
    """The floating-point dtypes of the tensors in `model_dir`'s safetensors files (read from their headers)."""
    dtypes = set()
    for shard in sorted(model_dir.glob("*.safetensors")):
        with shard.open("rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
        dtypes |= {SAFETENSORS_DTYPES[entry["dtype"]] for name, entry in header.items()
                   if name != "__metadata__" and entry["dtype"] in SAFETENSORS_DTYPES}  # fmt: skip
    return dtypes


def shared_weights(source: str | Path, dtype: torch.dtype, device: torch.device, cache_dir: Path, enabled: bool = True) -> str:
    """The model folder to load `source` from so that the processes of this host share its weights.

    `source` itself when nothing needs converting (a GPU, a hub id, weights already in `dtype`) or
    sharing is not `enabled`;
    else a copy of it with the weights converted to `dtype`, made once under `cache_dir` (keyed by
    the folder, its files' sizes and times, and the dtype) and reused by every process after.
    """
    model_dir = Path(source)
    if not enabled or device.type != "cpu":
        return str(source)
    delete_stale_copies(Path(cache_dir))
    if not model_dir.is_dir() or not any(model_dir.glob("*.safetensors")) or stored_dtypes(model_dir) <= {dtype}:
        return str(source)
    target = Path(cache_dir) / CONVERTED_VERSION / _copy_name(model_dir, dtype)
    return str(build_once(target, lambda staging: _convert(model_dir, dtype, staging)))


def delete_stale_copies(cache_dir: Path) -> list[Path]:
    """Delete the converted copies under `cache_dir` that no process can ask for again; return them.

    A copy is stale when its source folder is gone, or when the source's files changed (its key no
    longer matches), or when it is in a retired layout. A process still serving from a deleted copy
    keeps working: its mapped pages live until it unmaps them.
    """
    stale = [cache_dir / version for version in RETIRED_VERSIONS if (cache_dir / version).is_dir()]
    root = cache_dir / CONVERTED_VERSION
    for copy in sorted(root.iterdir()) if root.is_dir() else []:
        if copy.name.startswith(".") or not copy.is_dir():
            continue  # another process's half-written staging folder
        if _is_stale(copy):
            stale.append(copy)
    for folder in stale:
        shutil.rmtree(folder, ignore_errors=True)
    return stale


def _is_stale(copy: Path) -> bool:
    try:
        record = json.loads((copy / SOURCE_RECORD).read_text())
        source, dtype = Path(record["source"]), getattr(torch, record["dtype"])
    except (OSError, ValueError, KeyError, AttributeError):
        return True  # no readable record: nothing could find this copy to reuse it
    return not source.is_dir() or copy.name != _copy_name(source, dtype)


def _copy_name(model_dir: Path, dtype: torch.dtype) -> str:
    """The copy's folder name: the source's name and a key of its path, files' sizes and times, and the dtype."""
    model_dir = model_dir.resolve()
    digest = hashlib.sha256(str(model_dir).encode() + str(dtype).encode())
    for path in sorted(model_dir.iterdir()):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return f"{model_dir.name}-{digest.hexdigest()[:16]}"


def _convert(model_dir: Path, dtype: torch.dtype, staging: Path) -> None:
    """Write `model_dir` with its floating-point weights in `dtype` into `staging`."""
    for path in model_dir.iterdir():
        if path.suffix == ".safetensors":
            tensors = load_file(path)
            converted = {name: tensor.to(dtype) if tensor.is_floating_point() else tensor for name, tensor in tensors.items()}
            save_file(converted, staging / path.name, metadata={"format": "pt"})
        elif path.is_file():
            shutil.copy2(path, staging / path.name)
    _set_config_dtype(staging / "config.json", dtype)
    record = {"source": str(model_dir.resolve()), "dtype": str(dtype).removeprefix("torch.")}
    (staging / SOURCE_RECORD).write_text(json.dumps(record))


def _set_config_dtype(config_file: Path, dtype: torch.dtype) -> None:
    if not config_file.exists():
        return
    config = json.loads(config_file.read_text())
    name = str(dtype).removeprefix("torch.")
    config.update({key: name for key in ("dtype", "torch_dtype") if key in config})
    config_file.write_text(json.dumps(config, indent=2) + "\n")


def load_causal_lm(source: str | Path, dtype: torch.dtype, device: torch.device, quantize: str = "none") -> PreTrainedModel:
    """The model at `source` (a folder or hub id), its weights put straight on `device` in `dtype`;
    with `quantize="nf4"` its linear layers then stored in 4 bits (`clawrl.model.quantize`).

    `device_map` places each tensor as it loads, without a full copy in host memory first. Caveat:
    from_pretrained briefly sets torch's process-wide default dtype while it loads; code running
    beside it (the engine's decode thread) passes explicit dtypes, so it is unaffected.

    A 4-bit base is loaded into host memory (mapped from the file where the dtypes agree), and its
    layers are moved to `device` and quantized there one at a time; the rest follows. Loading it on
    the GPU first would not do: transformers reserves one block the size of the whole model for
    the weights, and the caching allocator cannot hand back a block that the kept 16-bit tensors
    (the embeddings) still use, so the 16-bit size stays taken (measured on an H200: 9.3 GB held
    by a 4B server whose weights were 2.7 GB).
    """
    if quantize != "nf4":
        return AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype, device_map=str(device))
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype, device_map="cpu")
    quantize_linears(model, device=device)
    model.to(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the layers' 16-bit copies, each freed once quantized
    return model
