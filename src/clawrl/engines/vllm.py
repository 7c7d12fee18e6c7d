"""The `vllm` engine: clawrl starts vLLM's OpenAI server and drives it in token ids (DESIGN §7).

vLLM lives in an environment of its own (`make test` creates `.venv-vllm`): it pins its own torch
and transformers, which clash with clawrl's. So clawrl never imports it; it runs
`python -m vllm.entrypoints.openai.api_server` from that environment on a free loopback port, with
runtime LoRA loading switched on, and talks to it exactly as the `openai` engine talks to any
server (`clawrl.engines.remote`). What this adds:

* finding the environment (`--vllm-python`, `CLAWRL_VLLM_PYTHON`, or `.venv-vllm` in the current
  directory or beside clawrl's source), starting the server, waiting for it to load (its log goes
  to a file whose tail is shown when it fails), and stopping it with everything it spawned;
* full-weight versions: a second server loads the new weights while the first goes on serving;
  new requests then go to the new one, and the old one stops once its last request is done. No
  request waits for a load; memory holds two copies of the model while it happens.

On a CPU the server runs in float32 with `--enforce-eager` (no compilation) and a KV cache of
`--vllm-kv-cache-gib`; on a GPU it keeps vLLM's own defaults. `--vllm-args` passes anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import torch

from clawrl.config import EngineConfig
from clawrl.engines.remote import RemoteEngine, RemoteEngineError, RemoteVersion

_VENV_NAME = ".venv-vllm"
_PR_SET_PDEATHSIG = 1
SERVED_NAME = "clawrl-policy"  # the base model's name on the server; LoRA versions add a suffix
_SOURCE_ROOT = Path(__file__).resolve().parents[3]  # the checkout, for an editable install


def find_vllm_python(configured: Path | None = None) -> Path:
    """The Python that has vLLM: the configured one, else `.venv-vllm` here or beside the source."""
    if configured is not None:
        if Path(configured).is_file() and os.access(configured, os.X_OK):
            return Path(configured)
        raise RemoteEngineError(f"--vllm-python {configured} is not an executable file")
    candidates = [Path(os.environ["CLAWRL_VLLM_PYTHON"])] if os.environ.get("CLAWRL_VLLM_PYTHON") else []
    candidates += [Path.cwd() / _VENV_NAME / "bin" / "python", _SOURCE_ROOT / _VENV_NAME / "bin" / "python"]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise RemoteEngineError(
        f"--engine vllm needs vLLM in an environment of its own: none at ./{_VENV_NAME} or {_SOURCE_ROOT / _VENV_NAME}. "
        "Create it with `make vllm` (scripts/install-vllm.sh), or pass --vllm-python PATH"
    )


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class VLLMServer:
    """One `vllm.entrypoints.openai.api_server` process on a loopback port."""

    def __init__(self, config: EngineConfig, model_dir: str | Path, tokenizer_dir: str | Path | None = None) -> None:
        self.config = config
        self.model_dir = str(model_dir)
        self.tokenizer_dir = str(tokenizer_dir or model_dir)
        self.port = free_loopback_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = Path(tempfile.mkstemp(prefix="clawrl-vllm-", suffix=".log")[1])
        self.process: subprocess.Popen[bytes] | None = None

    def command(self, python: Path) -> list[str]:
        on_cpu = self.config.device == "cpu" or (self.config.device == "auto" and not _has_cuda())
        dtype = "float32" if on_cpu and self.config.dtype == "auto" else self.config.dtype
        command = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model_dir, "--tokenizer", self.tokenizer_dir, "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(self.port), "--dtype", dtype, "--seed", str(self.config.seed),
            "--enable-lora", "--max-lora-rank", str(self.config.max_lora_rank), "--max-loras", str(self.config.max_loras),
            "--max-num-seqs", str(self.config.max_batch_size), "--logprobs-mode", "raw_logprobs",
        ]  # fmt: skip
        if self.config.max_context_tokens:
            command += ["--max-model-len", str(self.config.max_context_tokens)]
        if on_cpu:
            command.append("--enforce-eager")
        return command + shlex.split(self.config.vllm_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",  # /v1/load_lora_adapter
            "VLLM_CPU_KVCACHE_SPACE": f"{self.config.vllm_kv_cache_gib:g}",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_DO_NOT_TRACK": "1",
            # vLLM pins a CPU worker's threads to fixed cores; a second server (a full-weight swap)
            # would be pinned to the very cores the first keeps busy and starve while it loads
            "VLLM_CPU_OMP_THREADS_BIND": env.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
            "HF_HUB_OFFLINE": env.get("HF_HUB_OFFLINE", "1" if Path(self.model_dir).is_dir() else "0"),
        })  # fmt: skip
        env.pop("PYTHONPATH", None)  # clawrl's environment must not leak into vLLM's
        return env

    async def start(self) -> None:
        """Start the server and wait until it answers; raises RemoteEngineError with its log's tail."""
        python = find_vllm_python(self.config.vllm_python)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command(python), stdout=log, stderr=subprocess.STDOUT, env=self.environment(),
                start_new_session=True,  # its workers share the group, so a stop reaches them all
                preexec_fn=_terminate_with_parent,
            )  # fmt: skip
        deadline = time.monotonic() + self.config.vllm_start_timeout_s
        async with httpx.AsyncClient(timeout=5) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RemoteEngineError(f"vLLM's server exited with status {self.process.returncode}:\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"http://127.0.0.1:{self.port}/health")).status_code == 200:
                        return
                await asyncio.sleep(0.5)
        self.stop()
        raise RemoteEngineError(f"vLLM's server did not load within {self.config.vllm_start_timeout_s:g} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Stop the server and every process it started."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""
        return "\n".join(text.splitlines()[-lines:])


def _terminate_with_parent() -> None:
    """In the server's process before exec: SIGTERM when clawrl dies, even by SIGKILL (vLLM then
    stops its own workers)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _has_cuda() -> bool:
    return torch.cuda.is_available()


class VLLMEngine(RemoteEngine):
    """vLLM run by clawrl; see the module docstring."""

    def __init__(self, config: EngineConfig, model_path: str | Path | None = None) -> None:
        super().__init__(config, model_path)
        self._servers: dict[str, VLLMServer] = {}  # base URL -> the server there

    async def start(self) -> None:
        if self._servers:
            return
        server = VLLMServer(self.config, self._source)
        await server.start()
        self._servers[server.base_url] = server
        self._base_url = server.base_url
        try:
            await super().start()
        except BaseException:
            server.stop()
            raise

    async def close(self) -> None:
        await super().close()
        for server in self._servers.values():
            await asyncio.to_thread(server.stop)
        self._servers.clear()

    @property
    def servers(self) -> list[VLLMServer]:
        """The servers running now (two while a full-weight version takes over)."""
        return list(self._servers.values())

    async def _load_full_weights(self, version: int, path: Path) -> RemoteVersion:
        server = VLLMServer(self.config, path, tokenizer_dir=self._source)
        await server.start()
        self._servers[server.base_url] = server
        return RemoteVersion(SERVED_NAME, server.base_url)

    async def _retire_version(self, held: RemoteVersion) -> None:
        if held.lora:
            await super()._retire_version(held)
            return
        in_use = {kept.base_url for kept in self._versions.values()}
        server = self._servers.get(held.base_url)
        if server is not None and held.base_url not in in_use:
            del self._servers[held.base_url]
            await asyncio.to_thread(server.stop)

