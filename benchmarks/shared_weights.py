"""How much memory `clawrl serve --method combine` holds: server + trainer, on a CPU or on one GPU.

Starts `clawrl serve --model DIR --method combine` (LoRA, the trainer as its own process) for each
variant: `shared` (`--share-weights`: one copy of the base weights, the page cache's on a CPU, the
server's mapped by the trainer through CUDA IPC on a GPU), `separate` (`--no-share-weights`: each
process its own copy, as before issue 30) and `nf4` (shared, and the base's projections in 4 bits:
`--quantize nf4`). It teaches each one session with a correction and a 👍 so that the trainer takes
a step and publishes a version (the adapter, its gradients and AdamW's moments then exist), then
reads what the pair holds:

* on a CPU, both processes' PSS from /proc/PID/smaps_rollup: memory shared between them counts half
  in each, so the sum is what the pair costs the host;
* on a GPU, the device's used memory (nvidia-smi), sampled every half second from the start: at the
  end, and its peak (the trainer's step included). Each process's CUDA context is in it.

Reported beside one copy of the base weights (at the served dtype, or 4-bit) and the adapter with
its optimizer state (16 bytes a parameter).

    python benchmarks/shared_weights.py --model DIR     # e.g. clawrl model build-random --like qwen3-0.6b
    python benchmarks/shared_weights.py --model DIR --device cuda --variants shared,separate,nf4

Prints a table and writes JSON (`--out`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))  # the checkout's clawrl, installed or not

from clawrl.model.plan import Workload, weight_bytes  # noqa: E402
from clawrl.model.shapes import architecture_of_config  # noqa: E402
from clawrl.serve.runner import free_port  # noqa: E402

CORRECTION = "too long and too formal, make it two short friendly sentences"


def pss(pid: int) -> dict[str, int]:
    """Pss, Pss_Anon and Pss_File of one process, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("Pss", "Pss_Anon", "Pss_File", "Rss"):
            fields[name.lower()] = int(value.split()[0]) * 1024
    return fields


def children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def teach(base: str) -> None:
    """One session: a request, a correction, thanks and a 👍: the judge and the feedback make samples."""
    with httpx.Client(base_url=base + "/v1", timeout=600) as http:
        messages: list[dict[str, Any]] = []
        for line in ("Write a short note to my team about Friday's release.", CORRECTION, "thanks, perfect"):
            messages.append({"role": "user", "content": line})
            body = {"model": "bench", "messages": messages, "max_tokens": 8}
            answer = http.post("/chat/completions", json=body, headers={"X-Session-Id": "teach"})
            answer.raise_for_status()
            messages.append(answer.json()["choices"][0]["message"])
        http.post("/feedback", json={"session_id": "teach", "score": 1}).raise_for_status()


def wait(condition: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"timed out waiting for {what}")


def health(base: str) -> dict | None:
    try:
        return httpx.get(base + "/healthz", timeout=5).json()
    except httpx.HTTPError:
        return None


class DeviceMemory:
    """The GPU's used memory, sampled by nvidia-smi every `interval_s` in a thread: the last and the peak."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s, self.samples = interval_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def used_bytes() -> int:
        query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "--id=0"]
        return int(subprocess.run(query, capture_output=True, text=True, check=True).stdout.split()[0]) * 2**20

    @staticmethod
    def by_process() -> dict[str, int]:
        """What nvidia-smi attributes to each process (memory mapped from another process is the other's)."""
        query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        rows = subprocess.run(query, capture_output=True, text=True, check=True).stdout.splitlines()
        return {pid.strip(): int(used) * 2**20 for pid, used in (row.split(",") for row in rows if row.strip())}

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(self.used_bytes())

    def __enter__(self) -> DeviceMemory:
        self.idle_bytes = self.used_bytes()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def serve_command(args: argparse.Namespace, variant: str, port: int, scratch: Path) -> list[str]:
    command = [sys.executable, "-m", "clawrl", "serve", "--model", args.model, "--served-model-name", "bench",
               "--port", str(port), "--run-dir", str(scratch / f"run-{variant}"), "--method", "combine", "--batch-size", "1",
               "--judge", "rule", "--device", args.device, "--cpu-threads", str(args.cpu_threads), "--background-cpus", "all",
               "--lora-rank", str(args.lora_rank), "--share-weights" if variant != "separate" else "--no-share-weights"]  # fmt: skip
    return command + (["--quantize", "nf4"] if variant == "nf4" else [])


def published_or_failed(base: str) -> bool:
    """True once a version is served; raises when the trainer died (a restart), so no time is lost waiting."""
    status = health(base) or {}
    if (status.get("trainer") or {}).get("restarts", 0):
        raise RuntimeError("the trainer process died (see the log)")
    return status.get("policy_version", 0) >= 1


def own_cache(scratch: Path) -> Path:
    """A cache directory of the run's own, so that a converted copy of the weights (gigabytes at real
    sizes) goes with the scratch folder; the judge's classifier, which depends only on its corpus and
    code, is the caller's (trained once, not for every run: seconds of CPU beside the measurement)."""
    cache = scratch / "cache"
    if not cache.exists():
        callers = Path(os.environ.get("CLAWRL_CACHE_DIR") or Path.home() / ".cache" / "clawrl") / "judge"
        callers.mkdir(parents=True, exist_ok=True)
        cache.mkdir()
        (cache / "judge").symlink_to(callers, target_is_directory=True)
    return cache


def measure(args: argparse.Namespace, variant: str, scratch: Path) -> dict[str, Any]:
    port = free_port()
    path = os.pathsep.join(filter(None, [str(HERE.parent / "src"), os.environ.get("PYTHONPATH")]))  # keep the caller's
    env = {**os.environ, "CLAWRL_CACHE_DIR": str(own_cache(scratch)), "PYTHONPATH": path}
    log = open(scratch / f"serve-{variant}.log", "w")
    gpu = DeviceMemory() if args.device.startswith("cuda") else contextlib.nullcontext()
    base, figures = f"http://127.0.0.1:{port}", {}
    started = time.perf_counter()
    with gpu:
        server = subprocess.Popen(serve_command(args, variant, port, scratch), env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait(lambda: health(base) or server.poll() is not None, args.timeout_s, "the server")
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with status {server.returncode} (see the log)")
            teach(base)
            wait(lambda: published_or_failed(base), args.timeout_s, "a published version")
            time.sleep(2)  # the trainer settles after publishing
            figures["seconds_to_first_version"] = round(time.perf_counter() - started, 1)
            if isinstance(gpu, DeviceMemory):
                figures["device_used_bytes"] = gpu.used_bytes() - gpu.idle_bytes
                names = {str(server.pid): "server", **{str(pid): "trainer" for pid in children(server.pid)}}
                figures["by_process"] = {names.get(pid, pid): used for pid, used in gpu.by_process().items()}
            else:
                trainer = children(server.pid)
                figures["server"] = pss(server.pid)
                figures["trainer"] = {key: sum(pss(pid)[key] for pid in trainer) for key in ("pss", "pss_anon", "pss_file", "rss")}
                figures["pss_bytes"] = figures["server"]["pss"] + figures["trainer"]["pss"]
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    if isinstance(gpu, DeviceMemory):
        figures["device_peak_bytes"] = max(gpu.samples, default=0) - gpu.idle_bytes
        figures["mapped_by_trainer"] = "mapped the server's base weights" in (scratch / f"serve-{variant}.log").read_text()
    return figures


def base_bytes_of(shape: Any, device: str, quantize: str) -> int:
    """One copy of the base as served: fp32 on a CPU, bf16 on a GPU; 4-bit projections with nf4."""
    return weight_bytes(shape, Workload(dtype_bytes=2 if device.startswith("cuda") else 4, quantize=quantize))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model directory (clawrl model build-random --like qwen3-0.6b)")
    parser.add_argument("--device", default="cpu", help="cpu (PSS) or cuda (the device's used memory)")
    parser.add_argument("--variants", default="shared,separate", help="comma-separated: shared, separate, nf4")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--cpu-threads", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/shared_weights.json"))
    args = parser.parse_args(argv)
    shape = architecture_of_config(json.loads((Path(args.model) / "config.json").read_text()))
    adapter_bytes = shape.lora_parameters(args.lora_rank) * 16
    variants = args.variants.split(",")
    results: dict[str, Any] = {"benchmark": "shared_weights", "command": "python " + " ".join(sys.argv), "device": args.device,
                               "base_bytes": base_bytes_of(shape, args.device, "none"), "adapter_and_optimizer_bytes": adapter_bytes}  # fmt: skip
    held = "device_used_bytes" if args.device.startswith("cuda") else "pss_bytes"
    with tempfile.TemporaryDirectory(prefix="clawrl-shared-weights-") as scratch:
        for variant in variants:
            try:
                figures = measure(args, variant, Path(scratch))
            except (TimeoutError, RuntimeError, httpx.HTTPError, subprocess.SubprocessError, OSError) as error:
                log_tail = (Path(scratch) / f"serve-{variant}.log").read_text()[-3000:]
                results[variant] = {"error": f"{type(error).__name__}: {error}", "log_tail": log_tail}
                print(f"{variant}: {error}\n{log_tail}", flush=True)
                continue
            figures["base_bytes"] = base_bytes_of(shape, args.device, "nf4" if variant == "nf4" else "none")
            figures["ratio"] = round(figures[held] / (figures["base_bytes"] + adapter_bytes), 3)
            results[variant] = figures
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"| variant | held by server + trainer (GiB, {held}) | one base (GiB) | / (base + adapter state) |\n|---|---:|---:|---:|")
    for variant in variants:
        row = results[variant]
        if "error" not in row:
            print(f"| {variant} | {row[held] / 2**30:.2f} | {row['base_bytes'] / 2**30:.2f} | {row['ratio']:.2f} |")
    print(f"\nadapter with its optimizer state {adapter_bytes / 2**30:.2f} GiB")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
