"""How much memory `clawrl serve --method combine` holds on a CPU: server + trainer, by proportional set size.

Starts `clawrl serve --model DIR --method combine` (LoRA, the trainer as its own process) for each
setting of `--share-weights` (on: one copy of the base weights mapped by both processes; off: each
converts its own, as before issue 30), teaches it one session with a correction and a 👍 so that the
trainer takes a step and publishes a version (the adapter, its gradients and AdamW's moments then
exist), and reads both processes' PSS from /proc/PID/smaps_rollup: memory shared between them counts
half in each, so the sum is what the pair costs the host. Reported beside one copy of the base weights
(at the served dtype) and the adapter with its optimizer state (16 bytes a parameter).

    python benchmarks/shared_weights.py --model DIR     # e.g. clawrl model build-random --like qwen3-0.6b

Prints a table and writes JSON (`--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))  # the checkout's clawrl, installed or not

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


def measure(args: argparse.Namespace, share: bool, scratch: Path) -> dict[str, Any]:
    port = free_port()
    env = {**os.environ, "CLAWRL_CACHE_DIR": str(scratch / "cache"), "PYTHONPATH": str(HERE.parent / "src")}
    command = [sys.executable, "-m", "clawrl", "serve", "--model", args.model, "--served-model-name", "bench",
               "--port", str(port), "--run-dir", str(scratch / f"run-{share}"), "--method", "combine", "--batch-size", "1", "--judge", "rule",
               "--cpu-threads", str(args.cpu_threads), "--share-weights" if share else "--no-share-weights",
               "--background-cpus", "all"]  # fmt: skip
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=open(scratch / f"serve-{share}.log", "w"))
    base = f"http://127.0.0.1:{port}"
    try:
        wait(lambda: health(base) or server.poll() is not None, args.timeout_s, "the server")
        teach(base)
        wait(lambda: (health(base) or {}).get("policy_version", 0) >= 1, args.timeout_s, "a published version")
        time.sleep(2)  # the trainer settles after publishing
        trainer = children(server.pid)
        figures = {"server": pss(server.pid), "trainer": {key: sum(pss(pid)[key] for pid in trainer) for key in ("pss", "pss_anon", "pss_file", "rss")}}
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    figures["pss_bytes"] = figures["server"]["pss"] + figures["trainer"]["pss"]
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model directory (clawrl model build-random --like qwen3-0.6b)")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--cpu-threads", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/shared_weights.json"))
    args = parser.parse_args(argv)
    shape = architecture_of_config(json.loads((Path(args.model) / "config.json").read_text()))
    base_bytes = shape.parameters * 4  # served in fp32 on the CPU
    adapter_bytes = shape.lora_parameters(args.lora_rank) * 16
    results: dict[str, Any] = {"benchmark": "shared_weights", "command": "python " + " ".join(sys.argv),
                               "base_bytes": base_bytes, "adapter_and_optimizer_bytes": adapter_bytes}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="clawrl-shared-weights-") as scratch:
        for share in (True, False):
            figures = measure(args, share, Path(scratch))
            figures["ratio"] = figures["pss_bytes"] / (base_bytes + adapter_bytes)
            results["shared" if share else "separate"] = figures
    print("| weights | server PSS (GiB) | trainer PSS (GiB) | together (GiB) | / (base + adapter state) |\n|---|---:|---:|---:|---:|")
    for name in ("shared", "separate"):
        row = results[name]
        print(f"| {name} | {row['server']['pss'] / 2**30:.2f} | {row['trainer']['pss'] / 2**30:.2f} | "
              f"{row['pss_bytes'] / 2**30:.2f} | {row['ratio']:.2f} |")  # fmt: skip
    print(f"\nbase weights {base_bytes / 2**30:.2f} GiB, adapter with its optimizer state {adapter_bytes / 2**30:.2f} GiB")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
