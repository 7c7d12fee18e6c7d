"""Cost and memory at the sizes users run: a random-weight model of a real architecture, measured.

Builds `clawrl model build-random --like LIKE` (its answers are noise; cost and memory are the real
model's) and runs the project's own benchmarks on it, each as a subprocess with a time limit, so that
one stage that fails or runs out of memory leaves the others' figures:

1. `build`: writing the model (random weights initialised on `--device`);
2. `serve`: `serve_overhead.py`, the HTTP server on the hf engine at 1, 8 and 32 clients:
   tokens/s and p50/p99 latency, and on a GPU the serving process's peak memory;
3. `train`: `agent_shaped_training.py`, one LoRA step on the agent-shaped batch (two sessions x four
   turns) with and without prefix sharing, for each `--train-prefix` (`N` both sides, `N:shared` that side
   only, `N:ckpt` without sharing and with activation checkpointing, `N:full` every weight trained,
   `N:nf4` beside a 4-bit base; `+` joins);
4. `share`: `shared_weights.py`, what server + trainer hold with one copy of the base, a copy each,
   and a 4-bit base (`--share-variants`);
5. `swap`: `swap_under_load.py`, clients asking while the trainer trains and versions are swapped in;
6. `plan`: `clawrl.model.plan`'s predictions for the same runs, beside the measurements.

Everything goes into one JSON file (`--out`), rewritten after each stage.

    python benchmarks/real_shapes.py --like qwen3-0.6b                    # this CPU (tens of minutes)
    python benchmarks/real_shapes.py --like qwen3-4b --device cuda        # benchmarks/gpu_check.sh
    python benchmarks/real_shapes.py --dry-run                            # the tiny shape, a minute
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))  # runs from a checkout where clawrl is not installed (the GPU machine)

from clawrl.model.plan import CUDA_RUNTIME_GIB, Workload, plan
from clawrl.model.shapes import architecture_of


def run_stage(name: str, command: list[str], timeout_s: float, results: dict[str, Any], out: Path) -> dict | None:
    """Run one stage; its JSON (written to a file the command is told of) or None, with the outcome recorded."""
    print(f"== {name}: {' '.join(command)}", flush=True)
    started = time.perf_counter()
    outcome: dict[str, Any] = {"command": " ".join(command)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=_env(), check=False)
        outcome.update(returncode=done.returncode, stderr_tail=done.stderr[-3000:] if done.returncode else "")
        print(done.stdout[-4000:], flush=True)
        if done.returncode:
            print(done.stderr[-4000:], flush=True)
    except subprocess.TimeoutExpired:
        outcome.update(returncode=None, timed_out=True)
    outcome["seconds"] = round(time.perf_counter() - started, 1)
    results["stages"][name] = outcome
    _write(results, out)
    return outcome


def _env() -> dict[str, str]:
    source = str(HERE.parent / "src")
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{source}:{path}" if path else source, "PYTHONUNBUFFERED": "1"}


def _write(results: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def train_workload(args: argparse.Namespace, prefix: int, share: bool, checkpointing: bool = False, full: bool = False,
                   nf4: bool = False) -> Workload:  # fmt: skip
    """The planner's view of one `agent_shaped_training.py` micro-batch: one session's four turns."""
    return Workload(prompt_tokens=prefix, response_tokens=args.response_max, sessions=0, turn_tokens=args.turn_tokens,
                    micro_batch_size=4, share_prefix=share, activation_checkpointing=checkpointing, full=full,
                    dtype_bytes=2 if args.device.startswith("cuda") else 4, quantize="nf4" if nf4 else "none")  # fmt: skip


def step_bytes(predicted: Any, shape: Any, load: Workload) -> int:
    """What a step adds to what was in use when it began: activations and logits, and with every weight
    trained their gradients (freed after each step; the optimizer's moments stay from the first)."""
    added = sum(part.bytes for part in predicted.parts if part.name in ("activations", "logits"))
    return added + (shape.parameters * load.dtype_bytes if load.full else 0)


def predictions(args: argparse.Namespace, results: dict[str, Any]) -> dict[str, Any]:
    """The planner beside each measurement: a step's added peak is its activations and logits (the weights
    and the optimizer state were there before the step began)."""
    shape = architecture_of(args.like)
    rows = []
    for spec, measured in results.get("train", {}).items():
        prefix, _, variant = spec.partition(":")
        variants = set(variant.split("+"))
        for side, peak_mib in (measured.get("peak_mib") or {}).items():
            load = train_workload(args, int(prefix), side == "shared", "ckpt" in variants, "full" in variants, "nf4" in variants)
            step = step_bytes(plan(shape, load), shape, load)
            rows.append({
                "run": f"train {spec} {side}", "predicted_bytes": step,
                "measured_bytes": None if peak_mib is None else int(peak_mib * 2**20),
                "ratio": None if peak_mib is None else round(step / (peak_mib * 2**20), 3),
            })  # fmt: skip
    serve = results.get("serve") or {}
    if serve.get("cuda_peak_bytes"):
        # the engine's peak of allocated tensors: no runtime
        load = Workload(prompt_tokens=64, response_tokens=args.serve_max_tokens, sessions=32, train=False, runtime_gib=0)
        predicted = plan(shape, load).total_bytes
        rows.append({"run": "serve 32 clients", "predicted_bytes": predicted, "measured_bytes": serve["cuda_peak_bytes"],
                     "ratio": round(predicted / serve["cuda_peak_bytes"], 3)})  # fmt: skip
    for variant, measured in (results.get("share") or {}).items():
        if not isinstance(measured, dict) or "error" in measured:
            continue
        held = measured.get("device_used_bytes") or measured.get("pss_bytes")
        load = Workload(prompt_tokens=64, response_tokens=8, sessions=1, dtype_bytes=2 if args.device.startswith("cuda") else 4,
                        shared_base=variant != "separate", quantize="nf4" if variant == "nf4" else "none",
                        runtime_gib=CUDA_RUNTIME_GIB if args.device.startswith("cuda") else 0)  # fmt: skip
        # between steps: the weights and the adapter state (the step's activations were handed back)
        predicted = sum(part.bytes for part in plan(shape, load).parts if part.name not in ("activations", "logits"))
        rows.append({"run": f"share {variant} (server + trainer between steps)", "predicted_bytes": predicted,
                     "measured_bytes": held, "ratio": round(predicted / held, 3) if held else None})  # fmt: skip
    long_agent = plan(shape, Workload(prompt_tokens=20000, sessions=8), device_gib=args.gpu_memory_gib)
    return {"versus_measured": rows, "agent_20k_8_sessions": long_agent.to_dict()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results: dict[str, Any] = {"benchmark": "real_shapes", "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
                               "like": args.like, "device": args.device, "stages": {}}  # fmt: skip
    results["machine"] = _machine()
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="clawrl-real-shapes-", dir=args.workdir) as scratch:
        model_dir, scratch_dir = Path(scratch) / "model", Path(scratch)
        build = [python, "-m", "clawrl", "model", "build-random", "--like", args.like, "--out", str(model_dir),
                 "--device", args.device, "--dtype", "bfloat16"]  # fmt: skip
        outcome = run_stage("build", build, args.stage_timeout_s, results, args.out)
        if outcome["returncode"] != 0:
            return 1
        results["model_bytes"] = sum(path.stat().st_size for path in model_dir.glob("*.safetensors"))
        if "serve" in args.stages:
            out = scratch_dir / "serve.json"
            run_stage("serve", [python, str(HERE / "serve_overhead.py"), "--model", str(model_dir), "--device", args.device,
                                "--requests", str(args.serve_requests), "--max-tokens", str(args.serve_max_tokens),
                                "--cpu-threads", str(args.cpu_threads), "--out", str(out)],
                      args.stage_timeout_s, results, args.out)  # fmt: skip
            results["serve"] = _read(out)
        if "train" in args.stages:
            results["train"] = {}
            for spec in args.train_prefix.split(","):
                prefix, _, variant = spec.partition(":")
                variants = set(variant.split("+")) - {""}
                out = scratch_dir / f"train-{prefix}-{'-'.join(sorted(variants)) or 'both'}.json"
                command = [python, str(HERE / "agent_shaped_training.py"), "--model", str(model_dir), "--device", args.device,
                           "--prefix", prefix, "--sessions", "2", "--turns", "4", "--response-min", str(args.response_min),
                           "--response-max", str(args.response_max), "--turn-tokens", str(args.turn_tokens),
                           "--repeats", str(args.train_repeats),
                           "--no-gradient-check", "--cpu-threads", str(args.cpu_threads), "--out", str(out)]  # fmt: skip
                if "shared" in variants:
                    command += ["--sides", "shared"]
                if "ckpt" in variants:  # checkpointed layers: prefix sharing is off, one side is enough
                    command += ["--sides", "separate", "--activation-checkpointing"]
                if "full" in variants:
                    command += ["--full"]
                if "nf4" in variants:
                    command += ["--quantize", "nf4"]
                run_stage(f"train {spec}", command, args.stage_timeout_s, results, args.out)
                results["train"][spec] = _read(out)
        if "share" in args.stages:
            out = scratch_dir / "share.json"
            run_stage("share", [python, str(HERE / "shared_weights.py"), "--model", str(model_dir), "--device", args.device,
                                "--variants", args.share_variants, "--cpu-threads", str(args.cpu_threads),
                                "--timeout-s", str(args.stage_timeout_s), "--out", str(out)],
                      args.stage_timeout_s * len(args.share_variants.split(",")), results, args.out)  # fmt: skip
            results["share"] = _read(out)
        if "swap" in args.stages:
            out = scratch_dir / "swap.json"
            run_stage("swap", [python, str(HERE / "swap_under_load.py"), "--model", str(model_dir), "--device", args.device,
                               "--seconds", str(args.swap_seconds), "--clients", "8", "--max-tokens", "16",
                               "--trainer-start-s", str(args.trainer_start_s), "--cpu-threads", str(args.cpu_threads),
                               "--out", str(out)],
                      args.stage_timeout_s + 3 * args.swap_seconds, results, args.out)  # fmt: skip
            results["swap"] = _read(out)
    results["plan"] = predictions(args, results)
    _write(results, args.out)
    print(json.dumps(results["plan"]["versus_measured"], indent=1))
    print(f"wrote {args.out}")
    return 0


def _machine() -> dict[str, Any]:
    import torch

    gpu = None
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        gpu = {"name": properties.name, "memory_bytes": properties.total_memory}
    return {"cpu_count": os.cpu_count(), "torch": torch.__version__, "gpu": gpu, "python": sys.version.split()[0]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--like", default="qwen3-0.6b", help="the architecture (clawrl model build-random --like)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dry-run", action="store_true", help="the tiny shape on this CPU, small and quick: checks the script runs")
    parser.add_argument("--stages", default="serve,train,share,swap")
    parser.add_argument("--share-variants", default="shared,separate,nf4",
                        help="shared_weights.py's variants: server + trainer with one base, a copy each, a 4-bit base")
    parser.add_argument("--serve-requests", type=int, default=16)
    parser.add_argument("--serve-max-tokens", type=int, default=32)
    parser.add_argument("--train-prefix", default="2048", help="comma-separated prefixes; `N:shared` runs one side only")
    parser.add_argument("--response-min", type=int, default=100)
    parser.add_argument("--response-max", type=int, default=300)
    parser.add_argument("--turn-tokens", type=int, default=150, help="what each turn adds besides the last answer")
    parser.add_argument("--train-repeats", type=int, default=2)
    parser.add_argument("--swap-seconds", type=float, default=20.0)
    parser.add_argument("--trainer-start-s", type=float, default=40.0)
    parser.add_argument("--gpu-memory-gib", type=float, default=None, help="for the planner's 20K-token agent case")
    parser.add_argument("--cpu-threads", type=int, default=2)
    parser.add_argument("--stage-timeout-s", type=float, default=900.0)
    parser.add_argument("--workdir", default=None, help="where the model is built (a temporary folder in it)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/real_shapes.json"))
    args = parser.parse_args(argv)
    if args.dry_run:
        args.like, args.device, args.serve_requests, args.serve_max_tokens = "qwen3-tiny", "cpu", 6, 8
        args.train_prefix, args.response_min, args.response_max, args.train_repeats = "256,256:ckpt+nf4", 20, 40, 1  # the GPU check's stages
        args.share_variants = "shared,nf4"
        args.swap_seconds, args.trainer_start_s = 2.0, 4.0  # the tiny trainer loads in about 3 s
    return args


if __name__ == "__main__":
    raise SystemExit(main())
