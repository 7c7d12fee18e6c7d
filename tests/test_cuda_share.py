"""One copy of the base on a GPU (issue 30): the trainer maps the server's weights through CUDA IPC.

The skeleton-and-tensors half runs on any machine; the IPC half needs a CUDA device and is skipped
without one (benchmarks/gpu_check.sh runs it, and measures the whole server + trainer pair).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from clawrl.model.cuda_share import build_from_tensors, handoff_path, import_weights, named_tensors, wait_for_export
from clawrl.model.quantize import Linear4bit, quantize_linears
from clawrl.model.weights import load_causal_lm

CPU = torch.device("cpu")


def _logits(model: torch.nn.Module, device: torch.device) -> torch.Tensor:
    ids = torch.tensor([[5, 17, 42, 99, 3, 8]], device=device)
    with torch.no_grad():
        return model(input_ids=ids).logits.float().cpu()


def test_a_skeleton_given_a_models_tensors_is_that_model(tiny_model_dir: Path) -> None:
    loaded = load_causal_lm(tiny_model_dir, torch.float32, CPU).eval()
    rebuilt = build_from_tensors(tiny_model_dir, torch.float32, named_tensors(loaded))
    # the very same memory, not a copy
    assert all(rebuilt.get_parameter(name).data_ptr() == tensor.data_ptr()
               for name, tensor in named_tensors(loaded).items() if name in dict(rebuilt.named_parameters()))  # fmt: skip
    assert not any(tensor.is_meta for tensor in named_tensors(rebuilt).values())
    assert torch.equal(_logits(loaded, CPU), _logits(rebuilt, CPU))
    assert rebuilt.generation_config.eos_token_id == loaded.generation_config.eos_token_id


def test_a_4bit_skeleton_takes_a_4bit_models_tensors(tiny_model_dir: Path) -> None:
    loaded = load_causal_lm(tiny_model_dir, torch.float32, CPU, quantize="nf4").eval()
    rebuilt = build_from_tensors(tiny_model_dir, torch.float32, named_tensors(loaded), quantized=True)
    assert any(isinstance(module, Linear4bit) for module in rebuilt.modules())
    assert torch.equal(_logits(loaded, CPU), _logits(rebuilt, CPU))


def test_tensors_of_another_model_are_refused(tiny_model_dir: Path) -> None:
    loaded = load_causal_lm(tiny_model_dir, torch.float32, CPU)
    quantize_linears(loaded)  # a 4-bit model's tensors offered to a 16-bit skeleton
    with pytest.raises(ValueError, match="do not match"):
        build_from_tensors(tiny_model_dir, torch.float32, named_tensors(loaded))


def test_no_handoff_from_a_server_that_is_gone(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    assert wait_for_export(tmp_path, int(gone.stdout), timeout_s=5, poll_s=0.05) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a CUDA device")
def test_a_second_process_maps_the_first_ones_weights_without_a_copy(tiny_model_dir: Path, tmp_path: Path) -> None:
    cuda = torch.device("cuda")
    # the server: loads the model, shares it, and stays alive until told to stop
    server = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, torch
        from pathlib import Path
        from clawrl.model.cuda_share import export_weights
        from clawrl.model.weights import load_causal_lm
        model = load_causal_lm({str(tiny_model_dir)!r}, torch.bfloat16, torch.device("cuda"))
        export_weights(model, Path({str(tmp_path)!r}))
        sys.stdin.read()
    """)], stdin=subprocess.PIPE)  # fmt: skip
    try:
        path = wait_for_export(tmp_path, server.pid, timeout_s=120)
        assert path == handoff_path(tmp_path, server.pid) and path.stat().st_mode & 0o077 == 0
        before = torch.cuda.memory_allocated()
        tensors, quantized = import_weights(path)
        model = build_from_tensors(tiny_model_dir, torch.bfloat16, tensors, quantized)
        assert torch.cuda.memory_allocated() == before  # mapped, not allocated here
        reference = load_causal_lm(tiny_model_dir, torch.bfloat16, cuda).eval()
        assert torch.equal(_logits(model, cuda), _logits(reference, cuda))
    finally:
        server.communicate(b"", timeout=60)
