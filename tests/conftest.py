"""Shared fixtures: a tiny model built once per test run, a real server on a real port, and a real
PostgreSQL server. Plain helpers shared by the test modules are in helpers.py.

`tool_model_dir` is the tiny model fitted (a few seconds of real training) to a handful of
conversations, so that greedy decoding really emits a tool call and a final answer: the tool
round trip is then exercised end to end, with nothing faked.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import Tensor
from transformers.models.qwen2 import modeling_qwen2

from clawrl.config import EngineConfig
from clawrl.engines import Engine
from clawrl.engines.vllm import VLLMEngine
from clawrl.serve.runner import ServerThread
from clawrl.sim.tiny import build_tiny_model
from clawrl.store import Store
from tests.helpers import BorrowedEngine, PostgresServer, fit, require_vllm, start_server, weather_conversations


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def tool_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fit(tiny_model_dir, tmp_path_factory.mktemp("tool-model"), weather_conversations(), steps=60)


@pytest.fixture(scope="session")
def vllm_tool_engine(tool_model_dir: Path) -> Iterator[Engine]:
    """vLLM's server (from .venv-vllm) on the tool model, started once for all the tests that
    serve through it (about 40 s); skips where vLLM is not installed (see `require_vllm`)."""
    require_vllm()
    config = EngineConfig(model=str(tool_model_dir), engine="vllm", device="cpu", cpu_threads=1)
    engine = VLLMEngine(config, model_path=tool_model_dir)
    asyncio.run(engine.start())
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(params=["hf", "vllm"])
def serving_engine(request: pytest.FixtureRequest) -> Engine | None:
    """Runs a test once per engine: None (`start_server` then builds a fresh hf engine), or the
    shared vLLM engine lent to the test's server."""
    if request.param == "hf":
        return None
    return BorrowedEngine(request.getfixturevalue("vllm_tool_engine"))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture
def server(tool_model_dir: Path, run_dir: Path) -> Iterator[ServerThread]:
    with start_server(tool_model_dir, run_dir) as running:
        yield running


@pytest.fixture
def store(server: ServerThread, run_dir: Path) -> Store:
    return Store.for_run_dir(run_dir)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole run; skips where the server binaries are not installed."""
    # Not under pytest's tmp dir: that is private to the user running the tests (0700), and the
    # server runs as `postgres` when the tests run as root.
    root = Path(tempfile.mkdtemp(prefix="clawrl-postgres-"))
    try:
        server = PostgresServer(root)
        yield server
        server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty database on `postgres_server`, one per test."""
    return postgres_server.new_database()


@pytest.fixture
def float64_norms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen2's RMSNorm computes in float32 whatever the model's dtype. Sharing a prefix sums the rows'
    gradients before they pass back through the prefix's norms, not after, so in float32 the two
    ways differ by float32 rounding (1e-7); with the norms in float64 they must agree to float64's."""

    def forward(self: modeling_qwen2.Qwen2RMSNorm, hidden_states: Tensor) -> Tensor:
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", forward)
