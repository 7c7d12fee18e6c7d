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
* LoRA slots that stay correct. Two things in vLLM 0.32 would let a request's tokens come from
  weights other than its version's (docs/engines.md, "LoRA slots"):
  - `/v1/unload_lora_adapter` only forgets an adapter's name; the engine keeps it in one of its
    LoRA slots, so slots fill with retired adapters. clawrl runs the server in dev mode
    (`VLLM_SERVER_DEV_MODE=1`, which opens `/collective_rpc` on its loopback port) and also
    removes a retired adapter from the engine (`remove_lora`, the very call of vLLM's own
    `LLM.remove_lora`) by its integer id. vLLM numbers runtime-loaded adapters 1, 2, 3, ... in
    load order and never reuses a number (`OpenAIServingModels.lora_id_counter`), and clawrl is the
    only one loading adapters on its server, so the adapter just loaded is the highest id the
    engine lists (`list_loras`). Each load and each retirement removes every adapter no live
    version holds (a request aborted just before a removal makes vLLM load its adapter back).
  - On a CPU, vLLM's LoRA kernels (`lora/ops/torch_ops`) mark a base-model token with slot -1 and
    index the stacked slot weights with it, which in torch is the LAST slot: a base-model request
    decoded in one batch with LoRA requests got the delta of whatever adapter was ever written to
    the last slot (removing it does not clear the weights). The GPU kernels skip -1. So on a CPU
    clawrl asks vLLM for one slot more than `--max-loras` and fills that last slot, for the
    server's life, with an all-zero adapter it pins there: its delta is exactly 0.

On a CPU the server runs in float32 with `--enforce-eager` (no compilation), a KV cache of
`--vllm-kv-cache-gib` and, with `--cpu-threads`, that many OpenMP threads; on a GPU it keeps vLLM's
own defaults. `--vllm-args` passes anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import shutil
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

from clawrl.config import EngineConfig
from clawrl.engines.remote import RemoteEngine, RemoteEngineError, RemoteVersion

logger = logging.getLogger(__name__)

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

    @property
    def on_cpu(self) -> bool:
        """Whether the server runs vLLM's CPU build (`--device cpu`, or `auto` without CUDA)."""
        return self.config.device == "cpu" or (self.config.device == "auto" and not _has_cuda())

    @property
    def lora_slots(self) -> int:
        """vLLM's `--max-loras`: clawrl's, plus the last slot pinned to zeros on a CPU (module docstring)."""
        return self.config.max_loras + 1 if self.on_cpu else self.config.max_loras

    def command(self, python: Path) -> list[str]:
        on_cpu = self.on_cpu
        dtype = "float32" if on_cpu and self.config.dtype == "auto" else self.config.dtype
        command = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model_dir, "--tokenizer", self.tokenizer_dir, "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(self.port), "--dtype", dtype, "--seed", str(self.config.seed),
            "--enable-lora", "--max-lora-rank", str(self.config.max_lora_rank), "--max-loras", str(self.lora_slots),
            # the adapters clawrl keeps loaded beside those on the device wait in vLLM's host cache
            "--max-cpu-loras", str(self.lora_slots + self.config.max_loaded_adapters),
            "--max-num-seqs", str(self.config.max_batch_size), "--logprobs-mode", "raw_logprobs",
            # clawrl's grammars are llguidance's Lark (model/constraints.py); vLLM applies the mask to the
            # logits before its sampler, so its raw log-probs are the masked distribution's, as hf's are
            "--structured-outputs-config", '{"backend": "guidance"}',
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
            # /collective_rpc, to free the LoRA slot of a retired adapter (see the module docstring);
            # the server listens on loopback only
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_CPU_KVCACHE_SPACE": f"{self.config.vllm_kv_cache_gib:g}",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_DO_NOT_TRACK": "1",
            # vLLM pins a CPU worker's threads to fixed cores; a second server (a full-weight swap)
            # would be pinned to the very cores the first keeps busy and starve while it loads
            "VLLM_CPU_OMP_THREADS_BIND": env.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
            "HF_HUB_OFFLINE": env.get("HF_HUB_OFFLINE", "1" if Path(self.model_dir).is_dir() else "0"),
        })  # fmt: skip
        if self.on_cpu and self.config.cpu_threads:
            # vLLM's CPU worker computes with OpenMP threads (torch's default: one per core). Its
            # threads wait for each other by spinning, which on a machine shared with other busy
            # processes made the tiny model 10x slower here (benchmarks/engines.py).
            env["OMP_NUM_THREADS"] = str(self.config.cpu_threads)
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

    constrained_decoding = True  # the server runs the guidance backend (`VLLMServer.command`)

    def __init__(self, config: EngineConfig, model_path: str | Path | None = None) -> None:
        super().__init__(config, model_path)
        self._servers: dict[str, VLLMServer] = {}  # base URL -> the server there
        # A load (which learns its adapter's id) and a sweep of the engine's adapters never
        # interleave, so a sweep never mistakes an adapter being loaded for a retired one.
        self._lora_lock = asyncio.Lock()
        self._pinned_lora_ids: set[int] = set()  # the zero adapter in the last slot, on a CPU
        self._scratch = Path(tempfile.mkdtemp(prefix="clawrl-vllm-engine-"))

    async def start(self) -> None:
        if self._servers:
            return
        server = VLLMServer(self.config, self._source)
        await server.start()
        self._servers[server.base_url] = server
        self._base_url = server.base_url
        try:
            await super().start()
            if server.on_cpu:
                await self._zero_the_last_lora_slot(server)
        except BaseException:
            server.stop()
            raise

    def not_ready(self) -> str | None:
        exited = [server.process.returncode for server in self._servers.values()
                  if server.process is not None and server.process.poll() is not None]  # fmt: skip
        return f"vLLM's server exited with status {exited[0]}" if exited else super().not_ready()

    async def close(self) -> None:
        await super().close()
        for server in self._servers.values():
            await asyncio.to_thread(server.stop)
        self._servers.clear()
        shutil.rmtree(self._scratch, ignore_errors=True)

    async def _zero_the_last_lora_slot(self, server: VLLMServer) -> None:
        """Pin an all-zero adapter in vLLM's last LoRA slot (why: the module docstring). vLLM puts
        an adapter in the first free slot, so one zero adapter per slot fills them in order; the
        last stays, pinned (never evicted), and the others are removed again."""
        zero = write_zero_adapter(self._source, self._scratch / "zero-adapter")
        names = [f"{SERVED_NAME}-zero-slot-{index}" for index in range(server.lora_slots)]
        for name in names:
            await self._request("POST", server.base_url, "/load_lora_adapter", {"lora_name": name, "lora_path": str(zero)})
        ids = sorted(await self.resident_lora_ids(server.base_url))
        if len(ids) != len(names):
            raise RemoteEngineError(f"vLLM holds LoRA adapters {ids} after loading {len(names)} into its empty slots")
        await self._rpc(server.base_url, "pin_lora", [ids[-1]])
        for name, lora_id in zip(names[:-1], ids[:-1], strict=True):
            await self._request("POST", server.base_url, "/unload_lora_adapter", {"lora_name": name})
            await self._rpc(server.base_url, "remove_lora", [lora_id])
        self._pinned_lora_ids = {ids[-1]}

    @property
    def servers(self) -> list[VLLMServer]:
        """The servers running now (two while a full-weight version takes over)."""
        return list(self._servers.values())

    async def _load_full_weights(self, version: int, path: Path) -> RemoteVersion:
        server = VLLMServer(self.config, path, tokenizer_dir=self._source)
        await server.start()
        self._servers[server.base_url] = server
        return RemoteVersion(SERVED_NAME, server.base_url)

    @property
    def pinned_lora_ids(self) -> set[int]:
        """Adapters clawrl keeps in vLLM's engine for the server's life: the zero adapter on a CPU."""
        return set(self._pinned_lora_ids)

    async def resident_lora_ids(self, base_url: str | None = None) -> set[int]:
        """The integer ids of the LoRA adapters vLLM's engine holds now (loaded, in a slot or its
        CPU cache), as its workers list them; `pinned_lora_ids` among them."""
        results = await self._rpc(base_url or self.base_url, "list_loras")
        if not results:
            raise RemoteEngineError("vLLM's /collective_rpc list_loras answered no result")
        return parse_id_set(results[0])

    async def _load_adapter(self, base: RemoteVersion, model: str, path: Path) -> RemoteVersion:
        async with self._lora_lock:
            await self._remove_unheld_adapters(base.base_url)  # a free slot for it, should a removal have failed
            held = await super()._load_adapter(base, model, path)
            # the newest adapter has the highest id (see the module docstring)
            held.lora_id = max(await self.resident_lora_ids(base.base_url), default=None)
        return held

    async def _retire_version(self, held: RemoteVersion) -> None:
        if held.lora:
            await super()._retire_version(held)  # the name: no new request can ask for it
            await self._free_lora_slots(held.base_url)
            return
        in_use = {kept.base_url for _, kept in self._versions.items()}
        server = self._servers.get(held.base_url)
        if server is not None and held.base_url not in in_use:
            del self._servers[held.base_url]
            await asyncio.to_thread(server.stop)

    async def _free_lora_slots(self, base_url: str) -> None:
        async with self._lora_lock:
            await self._remove_unheld_adapters(base_url)

    async def _remove_unheld_adapters(self, base_url: str) -> None:
        """Remove from vLLM's engine every adapter that no live version holds (under the lock)."""
        live = [held.lora_id for _, held in self._versions.items() if held.lora and held.base_url == base_url]
        if None in live:  # a live adapter whose id is unknown could be mistaken for a retired one
            logger.warning("not freeing vLLM's LoRA slots: the id of a live adapter is unknown")
            return
        for lora_id in sorted(await self.resident_lora_ids(base_url) - set(live) - self._pinned_lora_ids):
            results = await self._rpc(base_url, "remove_lora", [lora_id])
            if not all(str(result) == "True" for result in results):
                logger.warning("vLLM did not remove LoRA adapter %d: %s", lora_id, results)

    async def _rpc(self, base_url: str, method: str, args: list[int] | None = None) -> list[object]:
        """Call `method` on every vLLM worker (dev mode's /collective_rpc); their results, one each."""
        body = {"method": method, "args": args or []}
        answer = await self._request("POST", base_url.removesuffix("/v1"), "/collective_rpc", body)
        return list(answer.get("results") or [])


def parse_id_set(listed: object) -> set[int]:
    """The ids a worker's `list_loras` returned through /collective_rpc (a list once serialised)."""
    if isinstance(listed, list):
        return {int(item) for item in listed}
    spelled = str(listed).strip()  # a result that is neither list nor dict arrives as str(result)
    if spelled == "set()":
        return set()
    if not (spelled.startswith("{") and spelled.endswith("}")):
        raise RemoteEngineError(f"vLLM listed its LoRA adapters as {spelled!r}, not a set of ids")
    return {int(item) for item in spelled[1:-1].split(",") if item.strip()}


# Linear layers one of which every decoder vLLM runs LoRA on has (the zero adapter needs just one).
_ZERO_ADAPTER_TARGETS = ("o_proj", "down_proj", "q_proj", "v_proj", "dense", "out_proj", "c_proj")


def write_zero_adapter(model_source: str | Path, out: Path) -> Path:
    """A rank-1 PEFT LoRA adapter of zeros on one linear layer of the model: loading it into a
    slot writes zeros there for every layer (vLLM resets the layers an adapter leaves out). The
    model is built on the meta device for its layer names and shapes: no weights are read."""
    config = AutoConfig.from_pretrained(str(model_source))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in _ZERO_ADAPTER_TARGETS:
            break
    else:
        raise RemoteEngineError(f"{model_source} has no linear layer named {' or '.join(_ZERO_ADAPTER_TARGETS)} to attach a LoRA adapter to")
    out.mkdir(parents=True, exist_ok=True)
    prefix = f"base_model.model.{name}"
    tensors = {f"{prefix}.lora_A.weight": torch.zeros(1, module.in_features), f"{prefix}.lora_B.weight": torch.zeros(module.out_features, 1)}
    save_file(tensors, str(out / "adapter_model.safetensors"))
    adapter_config = {"peft_type": "LORA", "r": 1, "lora_alpha": 1, "target_modules": [name.rsplit(".", 1)[-1]], "bias": "none",
                      "base_model_name_or_path": str(model_source)}  # fmt: skip
    (out / "adapter_config.json").write_text(json.dumps(adapter_config))
    return out
