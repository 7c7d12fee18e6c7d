"""The same model through the `hf` and `vllm` engines, side by side (issue 14).

Three measurements, each calling the engines' own API in this process (`engine.generate`: the
prompt as token ids, tokens streamed back), so that both are timed the same way; `vllm` pays its
HTTP hop to vLLM's server on loopback, as it does when clawrl serves with it.

1. **Throughput and latency**: 1, 8 and 32 clients send distinct one-message prompts back to back
   (greedy, `--max-tokens`); generated tokens/s over the wall time, and p50/p99 of the request
   latency (submit to last token).
2. **Time to first token of an agent's later turns.** An OpenClaw-like session: the request that
   OpenClaw sent to clawrl (tests/data/openclaw_requests.json, 12 tool schemas) with its system
   prompt brought back to its recorded length of about 40 KB (the part the recording left out is
   filled with the recorded prompt's own text, repeated), then `--turns` turns, each re-sending
   everything before it plus the previous answer and a new user message, as agents do. Each
   session starts its system prompt with a fresh nonce, so nothing is cached across sessions: turn
   1 is a cold prefill, and a later turn can reuse the previous turn's prompt only through prefix
   caching. Engines: `hf` with its prefix cache (on by default, `--prefix-cache-gib`) and without
   (`--prefix-cache-gib 0`), `vllm` (vLLM's automatic prefix caching, on by default) and `vllm` on
   a second server started with `--no-enable-prefix-caching`.
3. **A full-weight version swap on `vllm`**: `--swap-clients` clients keep asking while
   `load_version` brings in full weights, which starts a second vLLM server; reported: how long
   until new requests are served by the new weights, the latency of requests before, during and
   after, and failures.

The machine may be shared: measurements of the engines are interleaved (each level and each
session runs on every engine in turn, in one order and then the reverse), so that other load hits
them alike, and `os.getloadavg()` is recorded around every section.

    python benchmarks/engines.py                 # about 8 minutes on 2 cores
    python benchmarks/engines.py --quick         # fewer requests and turns (about 4 minutes)

Prints markdown tables and writes the figures as JSON (`--out`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from machine import machine  # benchmarks/machine.py, beside this script

from clawrl.config import EngineConfig
from clawrl.engines import build_engine
from clawrl.engines.base import Engine, SamplingParams
from clawrl.model.chat import render_prompt
from clawrl.sim.tiny import build_tiny_model

CONCURRENCY_LEVELS = (1, 8, 32)
CONTEXT = 32768
RECORDED = Path(__file__).resolve().parents[1] / "tests" / "data" / "openclaw_requests.json"
SYSTEM_PROMPT_CHARS = 40_000  # OpenClaw's system prompt as recorded: 564 characters kept, 39,428 left out
LEFT_OUT_MARKER = "[... "
NEXT_STEPS = [
    "ok, now list the files in the workspace and tell me which ones changed today",
    "read the README and summarise the setup steps in three lines",
    "run the tests and tell me which ones fail",
    "fix the first failure, then run the tests again",
    "write a short commit message for that fix",
    "what is left to do before the release?",
]


def percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of sorted values: one that was really observed."""
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


# --------------------------------------------------------------------------- engines


def engine_configs(model_dir: Path, cpu_threads: int) -> dict[str, EngineConfig]:
    common = {"model": str(model_dir), "device": "cpu", "max_context_tokens": CONTEXT, "max_batch_size": 32}
    return {
        "hf": EngineConfig(engine="hf", cpu_threads=cpu_threads, **common),
        "hf, no prefix caching": EngineConfig(engine="hf", cpu_threads=cpu_threads, prefix_cache_gib=0, **common),
        "vllm": EngineConfig(engine="vllm", cpu_threads=cpu_threads, **common),
        "vllm, no prefix caching": EngineConfig(engine="vllm", cpu_threads=cpu_threads, vllm_args="--no-enable-prefix-caching", **common),
    }


def chat_ids(engine: Engine, text: str) -> list[int]:
    return render_prompt(engine.tokenizer, [{"role": "user", "content": text}], None)


async def timed_generation(engine: Engine, ids: list[int], max_tokens: int) -> tuple[float, float, list[int]]:
    """(time to first token, total time, generated ids) of one greedy generation."""
    started = time.perf_counter()
    first = None
    tokens = []
    async for step in engine.generate(ids, SamplingParams(temperature=0, max_tokens=max_tokens)):
        if first is None:
            first = time.perf_counter() - started
        tokens.append(step.token_id)
    return first or 0.0, time.perf_counter() - started, tokens


def interleaved(names: list[str], rounds: int) -> list[str]:
    """Every engine once per round, the order reversed every other round (A B, B A, ...)."""
    order = []
    for round_index in range(rounds):
        order += names if round_index % 2 == 0 else list(reversed(names))
    return order


# --------------------------------------------------------------------------- 1. throughput


async def throughput_run(engine: Engine, clients: int, requests: int, max_tokens: int, offset: int) -> dict[str, Any]:
    """`clients` clients sharing `requests` requests, back to back."""
    latencies: list[float] = []
    tokens = 0
    next_index = iter(range(requests))

    async def client() -> None:
        nonlocal tokens
        for index in next_index:
            ids = chat_ids(engine, f"Client question number {offset + index}: how are you today, and what is new?")
            _, total, generated = await timed_generation(engine, ids, max_tokens)
            latencies.append(total)
            tokens += len(generated)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return {"wall_s": time.perf_counter() - started, "latencies_s": latencies, "tokens": tokens}


async def throughput(engines: dict[str, Engine], args: argparse.Namespace) -> dict[str, Any]:
    levels = []
    for clients in CONCURRENCY_LEVELS:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
        load_before = load_average()
        for turn, name in enumerate(interleaved(list(engines), 2)):
            runs[name].append(await throughput_run(engines[name], clients, args.requests // 2, args.max_tokens, turn * 10_000))
        for name, parts in runs.items():
            ms = sorted(latency * 1000 for part in parts for latency in part["latencies_s"])
            tokens = sum(part["tokens"] for part in parts)
            wall = sum(part["wall_s"] for part in parts)
            levels.append({
                "engine": name, "clients": clients, "requests": len(ms), "tokens": tokens, "wall_s": wall,
                "tokens_per_s": tokens / wall, "p50_ms": statistics.median(ms), "p99_ms": percentile(ms, 0.99),
                "load_average_before": load_before, "load_average_after": load_average(),
            })  # fmt: skip
    return {"max_tokens": args.max_tokens, "requests_per_level": args.requests, "levels": levels}


# --------------------------------------------------------------------------- 2. agent turns


def agent_request() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The recorded OpenClaw request's first messages (system and user) and its 12 tool schemas,
    the system prompt brought back to its recorded length."""
    recorded = json.loads(RECORDED.read_text())["main"]
    system = recorded["messages"][0]["content"]
    kept = system[: system.index(LEFT_OUT_MARKER)] if LEFT_OUT_MARKER in system else system
    source = kept + json.dumps(recorded["tools"])
    filler = (source * (SYSTEM_PROMPT_CHARS // len(source) + 1))[: SYSTEM_PROMPT_CHARS - len(kept)]
    first_user = next(message for message in recorded["messages"] if message["role"] == "user")
    return [{"role": "system", "content": kept + filler}, first_user], recorded["tools"]


async def agent_session(engine: Engine, turns: int, answer_tokens: int) -> list[dict[str, Any]]:
    """One session; per turn its prompt length and time to first token."""
    messages, tools = agent_request()
    messages[0] = {"role": "system", "content": f"session {uuid.uuid4().hex}\n" + messages[0]["content"]}
    results = []
    for turn in range(turns):
        ids = render_prompt(engine.tokenizer, messages, tools)
        first, total, generated = await timed_generation(engine, ids, answer_tokens)
        results.append({"turn": turn + 1, "prompt_tokens": len(ids), "ttft_s": first, "total_s": total})
        answer = engine.tokenizer.decode(generated, skip_special_tokens=True)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": NEXT_STEPS[turn % len(NEXT_STEPS)]}]
    return results


async def agent_turns(engines: dict[str, Engine], args: argparse.Namespace) -> dict[str, Any]:
    sessions: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in engines}
    load_before = load_average()
    for name in interleaved(list(engines), args.sessions):
        sessions[name].append(await agent_session(engines[name], args.turns, args.answer_tokens))
    rows = []
    for name, runs in sessions.items():
        later = sorted(turn["ttft_s"] * 1000 for run in runs for turn in run[1:])
        rows.append({
            "engine": name, "sessions": len(runs),
            "first_turn_prompt_tokens": runs[0][0]["prompt_tokens"], "last_turn_prompt_tokens": runs[0][-1]["prompt_tokens"],
            "first_turn_ttft_ms": statistics.median(run[0]["ttft_s"] * 1000 for run in runs),
            "later_turns_ttft_p50_ms": statistics.median(later), "later_turns_ttft_max_ms": later[-1],
            "turns": runs,
        })  # fmt: skip
    return {"turns_per_session": args.turns, "answer_tokens": args.answer_tokens, "rows": rows,
            "load_average_before": load_before, "load_average_after": load_average()}  # fmt: skip


# --------------------------------------------------------------------------- 3. full-weight swap


def perturbed_weights(model_dir: Path, out: Path) -> Path:
    """A full-weight version: the model with small noise on every weight."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


async def full_weight_swap(engine: Engine, new_weights: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Clients keep asking while `load_version` swaps in full weights (a second vLLM server)."""
    records: list[dict[str, Any]] = []
    failures: list[str] = []
    stop = asyncio.Event()
    origin = time.perf_counter()

    async def client(index: int) -> None:
        request = 0
        while not stop.is_set():
            request += 1
            ids = chat_ids(engine, f"Swap client {index}, question {request}: what should I cook tonight?")
            started = time.perf_counter()
            try:
                stream = engine.generate(ids, SamplingParams(temperature=0, max_tokens=args.max_tokens))
                tokens = [step async for step in stream]
            except Exception as error:  # noqa: BLE001 - counted and reported
                failures.append(repr(error))
                continue
            records.append({"start_s": started - origin, "end_s": time.perf_counter() - origin,
                            "version": stream.policy_version, "tokens": len(tokens)})  # fmt: skip

    load_before = load_average()
    clients = [asyncio.ensure_future(client(index)) for index in range(args.swap_clients)]
    await asyncio.sleep(args.swap_baseline_s)
    called = time.perf_counter() - origin
    await engine.load_version(1, new_weights)
    ready = time.perf_counter() - origin
    for _ in range(600):  # the first answers on the new server, then as long as the baseline
        if sum(record["version"] == 1 for record in records) >= args.swap_clients:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(args.swap_baseline_s)
    stop.set()
    await asyncio.gather(*clients)

    def window(selected: list[dict[str, Any]]) -> dict[str, Any]:
        ms = sorted((record["end_s"] - record["start_s"]) * 1000 for record in selected)
        return {"requests": len(ms), "p50_ms": statistics.median(ms) if ms else None,
                "p99_ms": percentile(ms, 0.99) if ms else None, "max_ms": ms[-1] if ms else None}  # fmt: skip

    first_new = min((record["end_s"] for record in records if record["version"] == 1), default=None)
    return {
        "load_version_s": ready - called,
        "first_answer_on_new_weights_after_s": None if first_new is None else first_new - called,
        "before": window([record for record in records if record["end_s"] < called]),
        "during": window([record for record in records if record["start_s"] >= called and record["end_s"] <= ready]),
        "overlapping_the_swap": window([record for record in records if record["end_s"] >= called and record["start_s"] <= ready]),
        "after": window([record for record in records if record["start_s"] > ready]),
        "versions_answered_during": sorted({record["version"] for record in records if called <= record["start_s"] <= ready}),
        "failures": len(failures),
        "failure_samples": failures[:5],
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }


# --------------------------------------------------------------------------- the run


async def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    model_dir = build_tiny_model(scratch / "model", seed=0) if args.model == "tiny" else Path(args.model)
    configs = engine_configs(model_dir, args.cpu_threads)
    names = [name for name in configs if name.split(",")[0] in args.engines]
    engines: dict[str, Engine] = {}
    results: dict[str, Any] = {"model": args.model, "engines": names}
    try:
        for name in names:
            started = time.perf_counter()
            engines[name] = build_engine(configs[name], model_path=str(model_dir))
            await engines[name].start()
            results.setdefault("start_s", {})[name] = time.perf_counter() - started
            for index in range(3):  # warm-up: first-call costs out of the figures
                await timed_generation(engines[name], chat_ids(engines[name], f"warm-up {index}"), args.max_tokens)
        with_cache = {name: engine for name, engine in engines.items() if "no prefix caching" not in name}
        results["throughput"] = await throughput(with_cache, args)
        results["agent_turns"] = await agent_turns(engines, args)
        if "vllm" in engines and not args.no_swap:
            new_weights = perturbed_weights(model_dir, scratch / "full-v1")
            results["full_weight_swap"] = await full_weight_swap(engines["vllm"], new_weights, args)
    finally:
        for engine in engines.values():
            await engine.close()
    return results


def markdown(results: dict[str, Any]) -> str:
    lines = [f"load average (1, 5, 15 min) at start {results['machine']['load_average_start']}, at end {results['machine']['load_average_end']}", ""]
    level = results["throughput"]
    lines += [
        f"Throughput: greedy, max_tokens={level['max_tokens']}, {level['requests_per_level']} requests per level and engine:",
        "",
        "| engine | clients | requests | tokens/s | p50 latency (ms) | p99 latency (ms) | load avg before |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in sorted(level["levels"], key=lambda row: (row["clients"], row["engine"])):
        lines.append(f"| {row['engine']} | {row['clients']} | {row['requests']} | {row['tokens_per_s']:.0f} | {row['p50_ms']:.0f} | "
                     f"{row['p99_ms']:.0f} | {row['load_average_before'][0]} |")  # fmt: skip
    agent = results["agent_turns"]
    lines += [
        "",
        f"Agent sessions ({agent['turns_per_session']} turns, answers of {agent['answer_tokens']} tokens): time to first token",
        "",
        "| engine | sessions | prompt tokens (turn 1 → last) | turn 1 TTFT (ms) | later turns TTFT p50 (ms) | later turns max (ms) |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for row in agent["rows"]:
        lines.append(f"| {row['engine']} | {row['sessions']} | {row['first_turn_prompt_tokens']} → {row['last_turn_prompt_tokens']} | "
                     f"{row['first_turn_ttft_ms']:.0f} | {row['later_turns_ttft_p50_ms']:.0f} | {row['later_turns_ttft_max_ms']:.0f} |")  # fmt: skip
    swap = results.get("full_weight_swap")
    if swap:
        lines += [
            "",
            f"Full-weight swap on vllm: load_version took {swap['load_version_s']:.1f} s (a second server); first answer on the "
            f"new weights {swap['first_answer_on_new_weights_after_s'] or float('nan'):.1f} s after the call; "
            f"{swap['failures']} failed requests.",
            "",
            "| requests | count | p50 (ms) | p99 (ms) | max (ms) |",
            "|---|---:|---:|---:|---:|",
        ]
        for key in ("before", "during", "after"):
            window = swap[key]
            if window["requests"]:
                lines.append(f"| {key} the swap | {window['requests']} | {window['p50_ms']:.0f} | {window['p99_ms']:.0f} | {window['max_ms']:.0f} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    quick = "--quick" in (sys.argv[1:] if argv is None else argv)  # smaller defaults; explicit values still win
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests, sessions and turns: a smoke run")
    parser.add_argument("--engines", default="hf,vllm", help="comma-separated: hf, vllm")
    parser.add_argument("--model", default="tiny", help="'tiny' (built locally into a temp dir) or a Hugging Face model directory")
    parser.add_argument("--requests", type=int, default=32 if quick else 128, help="requests per concurrency level and engine")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per throughput and swap request")
    parser.add_argument("--sessions", type=int, default=2, help="agent sessions per engine")
    parser.add_argument("--turns", type=int, default=3 if quick else 6, help="turns per agent session")
    parser.add_argument("--answer-tokens", type=int, default=16, help="tokens the agent's answers are cut to")
    parser.add_argument("--swap-clients", type=int, default=8, help="clients asking during the full-weight swap")
    parser.add_argument("--swap-baseline-s", type=float, default=4.0 if quick else 10.0, help="seconds of load before and after the swap")
    parser.add_argument("--no-swap", action="store_true", help="leave out the full-weight swap")
    parser.add_argument("--cpu-threads", type=int, default=1, help="compute threads of each engine: torch's for hf, OpenMP's for "
                        "vLLM's CPU worker (1 is fastest for the tiny model)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/engines.json"), help="JSON results")
    args = parser.parse_args(argv)
    args.engines = [name.strip() for name in args.engines.split(",") if name.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.cpu_threads)
    started = time.perf_counter()
    load_start = load_average()
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-") as scratch:
        results = asyncio.run(run(args, Path(scratch)))
    results = {
        "benchmark": "engines",
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "args": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "machine": machine(load_average_start=load_start, load_average_end=load_average()),
        "elapsed_s": time.perf_counter() - started,
        **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
