"""One copy of the base weights on a GPU: the trainer maps the server's tensors through CUDA IPC.

With LoRA the trainer never writes the base weights (only the adapter trains), and the OPD teacher
with `--teacher base` is the same base with the adapter switched off, so the server's copy is all
both processes need. On a CPU the page cache shares it (`clawrl.model.weights`); on a GPU nothing
does that by itself: each process that loads the model allocates its own copy (8 GB for a 4B model
in bf16). CUDA's inter-process memory handles let a second process map an allocation of the first.

How it goes: the hf engine, once it has loaded the base on a GPU, writes a handoff file under
`--cache-dir` named by its process id, holding for every parameter and buffer what torch's own
multiprocessing sends for a CUDA tensor (the allocation's IPC handle, offset, shape, strides and
dtype). A LoRA trainer started by that server (`--parent-pid`) waits for the file, builds the
model's skeleton on the `meta` device (no memory) and puts the mapped tensors in place, by name.
The file holds pickled torch objects, so it is only ever read from `--cache-dir` (the user's own
folder), only by a process whose parent wrote it, and it is written readable by its owner alone.

What a user gives up: the mapped weights live as long as the server (which never frees its base),
and nothing stops a buggy trainer from writing into them (a LoRA trainer's optimizer only holds the
adapter). Full fine-tuning writes every weight, so it always loads a copy of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import pickle
import time
from pathlib import Path

import torch
from torch.multiprocessing.reductions import reduce_tensor
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from clawrl.model.quantize import quantize_linears

log = logging.getLogger(__name__)

HANDOFF_FOLDER = "cuda-ipc"


def handoff_path(cache_dir: Path, server_pid: int) -> Path:
    """Where the server with process id `server_pid` writes its handoff file."""
    return Path(cache_dir) / HANDOFF_FOLDER / f"{server_pid}.pkl"


def named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by its qualified name, tied ones under each of their names (the
    skeleton has a slot for each), the non-persistent buffers too (RoPE's frequencies)."""
    tensors = itertools.chain(model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False))
    return {name: tensor.detach() for name, tensor in tensors}


def export_weights(model: torch.nn.Module, cache_dir: Path, quantized: bool = False) -> Path:
    """Write the handoff file for `model` (on a CUDA device) and return its path.

    The server keeps `model` alive as long as it runs: the handles stay valid only that long.
    Handoff files of servers that are gone are deleted first.
    """
    folder = Path(cache_dir) / HANDOFF_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    _delete_stale(folder)
    shared = {name: reduce_tensor(tensor) for name, tensor in named_tensors(model).items()}
    record = {"pid": os.getpid(), "quantized": quantized, "tensors": shared}
    path = handoff_path(cache_dir, os.getpid())
    staging = path.with_suffix(".partial")
    with open(os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as file:
        pickle.dump(record, file)
    staging.replace(path)  # a reader never sees half a file
    return path


def withdraw_export(cache_dir: Path) -> None:
    """Delete this process's handoff file (the server is stopping)."""
    with contextlib.suppress(FileNotFoundError):
        handoff_path(cache_dir, os.getpid()).unlink()


def _delete_stale(folder: Path) -> None:
    for path in folder.glob("*.pkl"):
        if path.stem.isdigit() and not _alive(int(path.stem)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_for_export(cache_dir: Path, server_pid: int, timeout_s: float, poll_s: float = 0.5) -> Path | None:
    """The server's handoff file once it is written; None when the server is gone or `timeout_s` passed
    (the caller then loads a copy of its own). The server writes it once its model is loaded."""
    path = handoff_path(cache_dir, server_pid)
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline or not _alive(server_pid):
            return None
        time.sleep(poll_s)
    return path


def import_weights(path: Path) -> tuple[dict[str, torch.Tensor], bool]:
    """The server's tensors mapped into this process (no copy), and whether the base is quantized."""
    record = pickle.loads(Path(path).read_bytes())  # noqa: S301 - written by this user's own server (module docstring)
    tensors = {name: rebuild(*arguments) for name, (rebuild, arguments) in record["tensors"].items()}
    return tensors, bool(record["quantized"])


def build_from_tensors(source: str | Path, dtype: torch.dtype, tensors: dict[str, torch.Tensor],
                       quantized: bool = False) -> PreTrainedModel:
    """The model at `source` with `tensors` (every parameter and buffer, by name) as its weights.

    The skeleton is built on the meta device, so nothing is allocated; `quantize` gives it the
    `quantized`: the tensors are a 4-bit base's, so the skeleton's linear layers are made 4-bit first.
    """
    config = AutoConfig.from_pretrained(str(source))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if quantized:
        quantize_linears(model)
    slots = named_tensors(model)
    missing, unknown = sorted(slots.keys() - tensors.keys()), sorted(tensors.keys() - slots.keys())
    if missing or unknown:
        raise ValueError(f"the shared weights do not match {source}: missing {missing[:5]}, unknown {unknown[:5]}")
    for name, tensor in tensors.items():
        _put(model, name, tensor)
    with contextlib.suppress(OSError):
        model.generation_config = GenerationConfig.from_pretrained(str(source))
    return model.eval()


def _put(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    owner_name, _, leaf = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    if leaf in owner._parameters:
        owner._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=False)
    else:
        owner._buffers[leaf] = tensor
