"""Training on agent-shaped traffic: one update step with and without shared-prefix training, same batch.

A real agent re-sends a huge prompt every turn: the OpenClaw agent's recorded requests are about
23,500 prompt tokens (system prompt and tool schemas) for 100-250 response tokens, and a
session's consecutive turns share almost all of it. This benchmark synthesises sessions of that
shape on the tiny model's architecture (random token ids: the cost of a step does not depend on
what the tokens say): each session has its own `--prefix` tokens (with `--one-agent`, all
sessions the same ones, as one agent's sessions do) and `--history` tokens of earlier conversation,
then every turn adds `--turn-tokens` of conversation to the one before and answers with 100-300
response tokens (`--response-min/max`). One batch holds every turn of every session; by default
one micro-batch holds one session's turns (`--micro-batch-size` = turns per session), as the
trainer's ordering makes it. With `--one-agent --history N --micro-batch-size <all turns>`, the
micro-batch's prompts form a tree three deep: the agent's prompt, each session's history, each turn.

Both sides run `clawrl.train.update.update_step` on copies of the same LoRA model, one optimizer
step each, alternating; `shared` passes `share_prefix=True` (every prefix that a micro-batch's
prompts share computed once, its keys and values shared by the rows below it), `separate` does
not (every turn with its whole prompt, as upstream trains). Reported: response tokens per second (median over `--repeats`
steps after a warm-up), the peak memory a step added (`machine.PeakMemory`), and the largest
difference between the two sides' parameter updates under plain SGD (lr 1: minus the gradient),
relative to the largest update: the two must train on the same gradient.

    .venv/bin/python benchmarks/agent_shaped_training.py               # 20K-token prefixes (minutes)
    .venv/bin/python benchmarks/agent_shaped_training.py --quick --json
    .venv/bin/python benchmarks/agent_shaped_training.py --one-agent --history 4000 --micro-batch-size 8

On a GPU: the same command with `--device cuda` (peak memory is then the CUDA allocator's).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model

from clawrl.config import LossConfig
from clawrl.model.weights import load_causal_lm
from clawrl.sim.tiny import build_tiny_model
from clawrl.train.policy import enable_activation_checkpointing
from clawrl.train.update import update_step
from clawrl.types import Sample, TrainingExample, Turn, TurnSampling
from machine import PeakMemory, machine  # benchmarks/machine.py, beside this script


def sessions(args: argparse.Namespace, vocab: int) -> list[TrainingExample]:
    """Every turn of `args.sessions` synthetic sessions: a long shared prefix, a growing conversation."""
    rng = random.Random(args.seed)
    agent_prompt = [rng.randrange(3, vocab) for _ in range(args.prefix)]
    examples = []
    for session in range(args.sessions):
        prefix = agent_prompt if args.one_agent else [rng.randrange(3, vocab) for _ in range(args.prefix)]
        prompt = prefix + [rng.randrange(3, vocab) for _ in range(args.history)]
        for index in range(args.turns):
            prompt = prompt + [rng.randrange(3, vocab) for _ in range(args.turn_tokens)]
            response = [rng.randrange(3, vocab) for _ in range(rng.randint(args.response_min, args.response_max))]
            turn = Turn(
                id=f"s{session}-t{index}", session_id=f"s{session}", kind="main", model="bench", policy_version=0,
                messages=[], tools=None, sampling=TurnSampling(), prompt_token_ids=list(prompt), response_token_ids=response,
                response_logprobs=[-8.0] * len(response), response_text="", tool_calls=None, finish_reason="stop",
            )  # fmt: skip
            reward = 1.0 if rng.random() < 0.5 else -1.0
            examples.append(TrainingExample(turn, Sample(turn.id, "ready", "rl", reward, behaviour_version=0)))
            prompt = prompt + response  # the next turn's request carries this answer
    return examples


def trainable_model(model_dir: Path, device: str, dtype: str, checkpointing: bool = False, full: bool = False,
                    quantize: str = "none") -> torch.nn.Module:  # fmt: skip
    """The model a step trains: a rank-16 LoRA adapter on every linear layer, or with `full` every weight;
    with `quantize="nf4"` beside a 4-bit base."""
    torch.manual_seed(0)
    model = load_causal_lm(model_dir, getattr(torch, dtype), torch.device(device), quantize)
    if checkpointing:
        enable_activation_checkpointing(model)
    if full:
        return model
    config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0, init_lora_weights=False)
    return get_peft_model(model, config)


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: list[TrainingExample], args: argparse.Namespace,
         share: bool) -> tuple[float, float]:  # fmt: skip
    """One update step: (seconds, peak MiB added); (inf, inf) when the GPU ran out of memory."""
    started = time.perf_counter()
    try:
        with PeakMemory(args.device) as memory:
            update_step(model, optimizer, batch, LossConfig(method="rl"), micro_batch_size=args.micro_batch_size or args.turns,
                        grad_clip=1.0, share_prefix=share)  # fmt: skip
    except torch.OutOfMemoryError:
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return math.inf, math.inf
    return time.perf_counter() - started, memory.peak_mib


def gradient_difference(model: torch.nn.Module, batch: list[TrainingExample], args: argparse.Namespace) -> float:
    """max |Δ_shared − Δ_separate| / max |Δ_separate| over the trainable weights, one SGD step (lr 1) each."""
    deltas = []
    for share in (True, False):
        copied = copy.deepcopy(model)
        weights = {name: parameter for name, parameter in copied.named_parameters() if parameter.requires_grad}
        before = {name: parameter.detach().clone() for name, parameter in weights.items()}
        update_step(copied, torch.optim.SGD(weights.values(), lr=1.0), batch, LossConfig(method="rl"),
                    micro_batch_size=args.micro_batch_size or args.turns, grad_clip=float("inf"), share_prefix=share)  # fmt: skip
        deltas.append({name: weights[name].detach() - before[name] for name in weights})
    shared, separate = deltas
    largest = max(delta.abs().max().item() for delta in separate.values())
    return max((shared[name] - separate[name]).abs().max().item() for name in separate) / largest


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="clawrl-agent-shaped-") as scratch:
        model_dir = Path(scratch) / "tiny"
        if args.model == "tiny":
            build_tiny_model(model_dir, seed=0)
        base = trainable_model(model_dir if args.model == "tiny" else Path(args.model), args.device, args.dtype,
                               args.activation_checkpointing, args.full, args.quantize)  # fmt: skip
    batch = sessions(args, base.config.vocab_size)
    max_grad_rel_diff = gradient_difference(base, batch, args) if args.gradient_check else None
    names = [name for name in ("shared", "separate") if name in args.sides.split(",")]
    # one model per side, so that each side's optimizer state is its own: a copy for the first, the
    # loaded one for the last (two copies of the weights in memory, not three)
    sides = {name: copy.deepcopy(base) for name in names[:-1]} | {names[-1]: base}
    lr = 1e-5 if args.full else 1e-4
    optimizers = {name: torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr) for name, model in sides.items()}
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    peaks: dict[str, list[float]] = {name: [] for name in sides}
    for repetition in range(args.repeats + 1):  # the first is a warm-up (it allocates the optimizer state)
        order = names if repetition % 2 == 0 else names[::-1]
        for name in order:
            took, peak = step(sides[name], optimizers[name], batch, args, share=name == "shared")
            if repetition:
                seconds[name].append(took)
                peaks[name].append(peak)
    response_tokens = sum(len(example.turn.response_token_ids) for example in batch)
    # a side that ran out of GPU memory reports 0 tokens/s and an infinite peak (JSON: null)
    tokens_per_s = {name: response_tokens / statistics.median(values) for name, values in seconds.items()}
    peak_mib = {name: max(values) for name, values in peaks.items()}
    both = len(names) == 2 and all(math.isfinite(value) for value in peak_mib.values())
    return {
        "benchmark": "agent_shaped_training",
        "command": "python " + " ".join(sys.argv),
        "args": vars(args),
        "machine": machine(),
        "samples": len(batch),
        "prompt_tokens": sum(len(example.turn.prompt_token_ids) for example in batch),
        "response_tokens": response_tokens,
        "tokens_per_s": tokens_per_s,
        "peak_mib": peak_mib,
        "speedup": tokens_per_s["shared"] / tokens_per_s["separate"] if both else None,
        "peak_memory_ratio": peak_mib["shared"] / max(peak_mib["separate"], 1e-9) if both else None,
        "out_of_memory": sorted(name for name, value in peak_mib.items() if not math.isfinite(value)),
        "max_grad_rel_diff": max_grad_rel_diff,
        "step_seconds": seconds,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small shape (2K-token prefixes) that runs in well under a minute")
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--turns", type=int, default=4, help="turns per session")
    parser.add_argument("--prefix", type=int, default=20000, help="each session's own prompt prefix (system prompt, tools)")
    parser.add_argument("--one-agent", action="store_true",
                        help="every session starts with the same prefix (one agent's system prompt and tools), not its own")
    parser.add_argument("--history", type=int, default=0, help="tokens of each session's earlier conversation before its turns")
    parser.add_argument("--turn-tokens", type=int, default=150, help="tokens each turn's request adds besides the last answer")
    parser.add_argument("--response-min", type=int, default=100)
    parser.add_argument("--response-max", type=int, default=300)
    parser.add_argument("--micro-batch-size", type=int, default=None, help="default: --turns (one session per micro-batch)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per side (after one warm-up)")
    parser.add_argument("--model", default="tiny", help="'tiny' (built into a temp dir) or a model directory "
                        "(`clawrl model build-random --like qwen3-0.6b`)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None, help="default: float32 on a CPU, bfloat16 on CUDA")
    parser.add_argument("--sides", default="shared,separate", help="which sides to run: shared, separate or both")
    parser.add_argument("--full", action="store_true", help="train every weight instead of a LoRA adapter (lr 1e-5)")
    parser.add_argument("--quantize", choices=("none", "nf4"), default="none", help="the LoRA adapter beside a 4-bit base")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="recompute each layer in the backward pass (prefix sharing is then off: both sides run alike)")
    parser.add_argument("--gradient-check", action=argparse.BooleanOptionalAction, default=True,
                        help="compare the two sides' updates (two more steps on copies of the model)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cpu-threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/agent_shaped_training.json"))
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.quick:
        args.prefix, args.turns, args.response_min, args.response_max, args.repeats = 2000, 3, 100, 150, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.cpu_threads)
    result = run(args)
    result["peak_mib"] = {name: value if math.isfinite(value) else None for name, value in result["peak_mib"].items()}
    result["step_seconds"] = {name: [v if math.isfinite(v) else None for v in values] for name, values in result["step_seconds"].items()}
    result["args"] = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['samples']} turns, {result['prompt_tokens']} prompt and {result['response_tokens']} response tokens per step\n")
    print("| side | response tokens/s | peak memory added (MiB) |\n|---|---:|---:|")
    for name, peak in result["peak_mib"].items():
        shown = "out of memory" if peak is None else f"{peak:.0f}"
        print(f"| {name} | {result['tokens_per_s'][name]:.0f} | {shown} |")
    for name in ("speedup", "peak_memory_ratio", "max_grad_rel_diff"):
        print(f"{name}: {result[name]:.3g}" if result[name] is not None else f"{name}: -")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
