"""Real shapes (issue 30): random-weight models of the architectures users run, the memory planner,
and the GPU check's dry run, as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from transformers import AutoConfig, AutoTokenizer

from clawrl.model.plan import NF4_BLOCK as PLANNER_BLOCK
from clawrl.model.plan import CUDA_RUNTIME_GIB, Workload, micro_batch_tokens, plan
from clawrl.model.quantize import NF4_BLOCK, Linear4bit, quantize_linears
from clawrl.model.shapes import ARCHITECTURES, architecture_of_config
from clawrl.serve.runner import free_port
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parent.parent


def clawrl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawrl", *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def qwen3_06b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("qwen3-0.6b")
    built = clawrl("model", "build-random", "--like", "qwen3-0.6b", "--out", str(out))
    assert built.returncode == 0, built.stderr
    yield out
    shutil.rmtree(out)  # 1.2 GB that pytest would keep for three runs


def test_build_random_writes_the_published_shape(qwen3_06b: Path) -> None:
    config = AutoConfig.from_pretrained(qwen3_06b)
    assert (config.model_type, config.hidden_size, config.num_hidden_layers, config.vocab_size) == ("qwen3", 1024, 28, 151936)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.intermediate_size) == (16, 8, 128, 3072)
    tokenizer = AutoTokenizer.from_pretrained(qwen3_06b)
    # every id the output layer can sample decodes: the tokenizer is as wide as the vocabulary
    assert len(tokenizer) == 151936
    assert tokenizer.decode(list(range(151900, 151936)))
    text = "Could you make it shorter? Gracias — 谢谢"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    weights = sum(path.stat().st_size for path in qwen3_06b.glob("*.safetensors"))
    assert weights == pytest.approx(ARCHITECTURES["qwen3-0.6b"].parameters * 2, rel=0.001)  # bf16


def test_serve_answers_with_the_random_model(qwen3_06b: Path, tmp_path: Path) -> None:
    port = free_port()
    # the bf16 weights are served in fp32 on a CPU: a 2.4 GB converted copy, kept in this test's folder
    cache = tmp_path / "cache"
    server = subprocess.Popen(
        [sys.executable, "-m", "clawrl", "serve", "--model", str(qwen3_06b), "--port", str(port), "--run-dir", str(tmp_path / "run"),
         "--cache-dir", str(cache), "--cpu-threads", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(base) or server.poll() is not None, timeout=240, what="the server to start")
        assert server.poll() is None, server.stdout.read() if server.stdout else ""
        model = httpx.get(base + "/v1/models").json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0}
        answer = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] >= 1
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        shutil.rmtree(cache, ignore_errors=True)


def _healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_parameter_counts_match_the_published_models() -> None:
    # Qwen3's model cards: 0.6B (0.44B without embeddings), 4.0B, 8.2B
    assert ARCHITECTURES["qwen3-0.6b"].parameters == pytest.approx(0.596e9, rel=0.01)
    assert ARCHITECTURES["qwen3-4b"].parameters == pytest.approx(4.02e9, rel=0.01)
    assert ARCHITECTURES["qwen3-8b"].parameters == pytest.approx(8.19e9, rel=0.01)
    # a 20K-token prompt's keys and values at 4B: 144 KiB a token, about 2.7 GiB
    assert ARCHITECTURES["qwen3-4b"].kv_bytes_per_token == 144 * 1024


def test_a_config_file_gives_the_same_shape(qwen3_06b: Path) -> None:
    assert architecture_of_config(json.loads((qwen3_06b / "config.json").read_text())) == ARCHITECTURES["qwen3-0.6b"]


def test_plan_says_what_does_not_fit_and_what_to_change() -> None:
    shape = ARCHITECTURES["qwen3-4b"]
    crowded = plan(shape, Workload(prompt_tokens=20000, sessions=8), device_gib=80)
    assert crowded.fits is False
    assert any("--activation-checkpointing" in line for line in crowded.advice)
    lean = plan(shape, Workload(prompt_tokens=4000, sessions=2, activation_checkpointing=True, micro_batch_size=1), device_gib=80)
    assert lean.fits is True and not lean.advice
    # serving only: the weights and the sessions' keys and values
    serving = plan(shape, Workload(prompt_tokens=20000, response_tokens=0, sessions=8, train=False))
    assert serving.total_bytes == shape.parameters * 2 + 8 * 20000 * 144 * 1024 + int(CUDA_RUNTIME_GIB * 2**30)


def test_a_4bit_shared_base_fits_serving_and_training_a_4b_model_on_24_gib() -> None:
    shape = ARCHITECTURES["qwen3-4b"]
    # the aim: an agent's 8K-token prompts, four sessions, a checkpointed step of one row at a time
    load = Workload(prompt_tokens=8000, sessions=4, activation_checkpointing=True, micro_batch_size=1)
    two_copies = plan(shape, load, device_gib=24)
    assert two_copies.fits is False
    assert any(line.startswith("--quantize nf4") for line in two_copies.advice)
    assert any(line.startswith("--share-weights") for line in two_copies.advice)
    small = plan(shape, Workload(**{**load.__dict__, "quantize": "nf4", "shared_base": True}), device_gib=24)
    assert small.fits is True
    by_name = {part.name: part.bytes for part in small.parts}
    # the projections at half a byte and a bf16 scale per 64 weights; embeddings and norms in bf16
    linear = shape.linear_parameters
    assert by_name["serving weights"] == int(linear * (0.5 + 2 / NF4_BLOCK) + (shape.parameters - linear) * 2)
    assert by_name["trainer weights"] == 0
    assert by_name["serving weights"] < 0.35 * shape.parameters * 2


def test_the_planner_counts_the_layers_that_are_quantized(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_model_dir)
    shape = architecture_of_config(config.to_dict())
    model = AutoModelForCausalLM.from_config(config)
    assert quantize_linears(model) == 7 * shape.num_hidden_layers
    packed = sum(module.weight.numel() * 2 for module in model.modules() if isinstance(module, Linear4bit))
    assert packed == shape.linear_parameters and PLANNER_BLOCK == NF4_BLOCK


def test_prefix_sharing_runs_the_prefix_once() -> None:
    load = Workload(prompt_tokens=2000, response_tokens=100, turn_tokens=50, micro_batch_size=4)
    assert micro_batch_tokens(load, shared=True) == 2000 + 4 * 150
    assert micro_batch_tokens(load, shared=False) == 4 * (2000 + 3 * 150 + 100)  # left-padded to the longest


def test_plan_command(tmp_path: Path) -> None:
    fits = clawrl("plan", "--like", "qwen3-0.6b", "--gpu-memory", "80", "--prompt-tokens", "4000", "--sessions", "2", "--json")
    assert fits.returncode == 0, fits.stderr
    assert json.loads(fits.stdout)["fits"] is True
    over = clawrl("plan", "--like", "qwen3-8b", "--gpu-memory", "24", "--prompt-tokens", "20000")
    assert over.returncode == 2 and "does NOT fit" in over.stdout and "GiB" in over.stdout
    missing = clawrl("plan", "--model", str(tmp_path / "nowhere"))
    assert missing.returncode == 1 and missing.stderr.startswith("error:") and "Traceback" not in missing.stderr


def test_gpu_check_dry_run(tmp_path: Path) -> None:
    """benchmarks/gpu_check.sh on the tiny shape on this CPU: every stage runs and the planner answers."""
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--dry-run"], capture_output=True, text=True,
                          timeout=900, env=env, cwd=REPO, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu-check-dry-run.json").read_text())
    failed = {name: stage for name, stage in result["stages"].items() if stage["returncode"] != 0}
    assert not failed
    assert {"build", "serve", "swap"} <= set(result["stages"]) and any(name.startswith("train") for name in result["stages"])
    assert [level["concurrency"] for level in result["serve"]["throughput"]] == [1, 8, 32]
    assert all(row["measured_bytes"] and row["predicted_bytes"] for row in result["plan"]["versus_measured"])
    assert result["swap"]["phases"]
    # server + trainer with one base, and with a 4-bit one; the trainer step beside a 4-bit base
    assert all("error" not in result["share"][variant] for variant in ("shared", "nf4")), result["share"]
    assert any(name.endswith("nf4") for name in result["stages"])
