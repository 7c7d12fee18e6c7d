"""What the OpenAI-compatible server costs on top of the engine, and what it sustains.

1. **Overhead.** The same requests (same prompts, greedy, fixed `max_tokens`, non-streaming) are
   answered twice, one at a time: through the HTTP server, and by calling the engine in-process
   (render the prompt, consume `engine.generate` fully). Both use ONE engine instance, the one the
   server runs, so the model, its threads and its batch are identical; the difference is what
   the server adds per request: HTTP and JSON, validation, session resolution, incremental
   detokenization and the durable store write that precedes every answer. The two modes alternate
   request by request so that drift (CPU frequency, other load) hits both equally.
2. **Throughput.** 1, 8 and 32 concurrent clients send requests back to back through the server;
   requests/s and generated tokens/s are measured over the wall time of each level.

    python benchmarks/serve_overhead.py --requests 100 --max-tokens 32

The HTTP client runs in a process of its own by default (`--client process`), as every real client
does (an agent in Node, an SDK in another program): in the server's process its Python work would
take the server's GIL, and the figure would charge the server for the client. `--client thread`
runs it on this process's event loop instead, which is how the figures before issue 29's
twenty-second session were taken; the two are side by side in docs/benchmarks.md.

With `--null-engine` the engine costs nothing: it answers every prompt at once with the same
`--max-tokens` ordinary tokens (the tiny model's tokenizer renders and detokenizes as usual). The
in-process mode is then little more than rendering the prompt, and what the server takes is its
own cost alone, without the engine's run-to-run noise: on a shared machine, where the engine's own
time drifts by tens of milliseconds between runs, it is the figure that tells two builds apart.

Prints a markdown table and writes the figures as JSON (`--out`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
from machine import machine  # benchmarks/machine.py, beside this script

from clawrl.config import EngineConfig, ServeConfig
from clawrl.engines import build_engine
from clawrl.engines.base import Engine, GenerationStream, SamplingParams, TokenStep
from clawrl.model.chat import render_prompt
from clawrl.serve.runner import ServerThread, free_port
from clawrl.sim.tiny import build_tiny_model
from clawrl.store import Store

SERVED_NAME = "bench"
NULL_ANSWER = "The city has a river, an old bridge and a market square that fills every morning."
CONCURRENCY_LEVELS = (1, 8, 32)
WARMUP_REQUESTS = 5


@dataclass
class LatencySummary:
    requests: int
    median_ms: float
    p99_ms: float
    mean_ms: float
    completion_tokens: int  # summed over the requests


@dataclass
class ThroughputLevel:
    concurrency: int
    requests: int
    wall_s: float
    requests_per_s: float
    tokens_per_s: float
    median_latency_ms: float
    p99_latency_ms: float


class NullEngine(Engine):
    """An engine that costs nothing (`--null-engine`): every request gets the same ordinary tokens at
    once, each step through the stream's queue as an engine delivers it."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoTokenizer

        self.model_name = str(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.max_context_tokens = 4096
        self._answer = self.tokenizer.encode(NULL_ANSWER * 8, add_special_tokens=False)

    @property
    def policy_version(self) -> int:
        return 0

    def lineage_version(self, lineage: str) -> int | None:
        return 0  # every lineage is answered by the one fixed answer

    def held_versions(self) -> list[int]:
        return [0]

    def generate(self, prompt_token_ids: list[int], sampling: SamplingParams, lineage: str = "shared") -> GenerationStream:
        stream = GenerationStream(0)
        count = min(sampling.max_tokens, len(self._answer))
        for index, token_id in enumerate(self._answer[:count]):
            stream.push(TokenStep(token_id, -0.5, finish_reason="length" if index == count - 1 else None))
        stream.finish()
        return stream

    async def score(self, *_args: Any, **_kwargs: Any) -> Any:
        raise NotImplementedError

    async def load_version(self, *_args: Any, **_kwargs: Any) -> None:
        raise NotImplementedError


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile: a value that was really observed (no interpolation)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def summarize(latencies_s: list[float], tokens: int) -> LatencySummary:
    ms = [latency * 1000 for latency in latencies_s]
    return LatencySummary(len(ms), statistics.median(ms), percentile(ms, 0.99), statistics.fmean(ms), tokens)


def prompts(count: int) -> list[list[dict[str, str]]]:
    """Distinct one-message conversations, so no request can reuse another's session."""
    return [[{"role": "user", "content": f"Request {i}: tell me about the {i}th city on your list."}] for i in range(count)]


def chat_body(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {"model": SERVED_NAME, "messages": messages, "max_tokens": max_tokens, "temperature": 0}


async def in_process(engine: Engine, messages: list[dict[str, str]], max_tokens: int) -> tuple[float, int]:
    """One request without the server: render, generate, consume every token.

    Taken whole (`hold_until_done`), as the server takes a non-streamed answer with no stop string:
    the engine's fastest way, so that what the server adds is not hidden by a slower baseline.
    """
    started = time.perf_counter()
    prompt_ids = render_prompt(engine.tokenizer, messages, None)
    tokens = 0
    stream = engine.generate(prompt_ids, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    stream.hold_until_done()
    async for _step in stream:
        tokens += 1
    return time.perf_counter() - started, tokens


class ClientProcess:
    """The HTTP client in a child process (`--client process`): this process sends it one command a
    line (a request to time, or a throughput level to run) and reads its figures back."""

    def __init__(self, root: str) -> None:
        command = [sys.executable, __file__, "--client-for", root]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, command: dict[str, Any]) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(30)


def client_main(root: str) -> int:
    """The child's side of `ClientProcess`: one answer line per command line, until stdin closes."""
    limits = httpx.Limits(max_connections=max(CONCURRENCY_LEVELS) + 4, max_keepalive_connections=max(CONCURRENCY_LEVELS) + 4)

    async def serve_commands() -> None:
        async with httpx.AsyncClient(base_url=root, timeout=300, limits=limits) as client:
            for line in sys.stdin:
                command = json.loads(line)
                if "messages" in command:
                    answer: Any = await over_http(client, command["messages"], command["max_tokens"])
                else:
                    conversations = prompts(command["conversations"])
                    answer = asdict(await measure_throughput(client, conversations, command["concurrency"],
                                                             command["total"], command["max_tokens"]))  # fmt: skip
                print(json.dumps(answer), flush=True)

    asyncio.run(serve_commands())
    return 0


async def over_http(client: httpx.AsyncClient, messages: list[dict[str, str]], max_tokens: int) -> tuple[float, int]:
    """The same request through the server, as an OpenAI client sends it (non-streaming)."""
    started = time.perf_counter()
    response = await client.post("/v1/chat/completions", json=chat_body(messages, max_tokens))
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed, response.json()["usage"]["completion_tokens"]


async def through_server(client: httpx.AsyncClient | ClientProcess, messages: list[dict[str, str]], max_tokens: int) -> tuple[float, int]:
    """One request through the server, by the client in this process or the one in its own.

    The child's answer is awaited by blocking this loop, on which nothing else runs meanwhile: the
    in-process mode is measured strictly one request at a time."""
    if isinstance(client, ClientProcess):
        elapsed, generated = client.ask({"messages": messages, "max_tokens": max_tokens})
        return elapsed, generated
    return await over_http(client, messages, max_tokens)


async def measure_overhead(
    engine: Engine, client: httpx.AsyncClient | ClientProcess, conversations: list[list[dict[str, str]]], max_tokens: int
) -> dict[str, Any]:
    for messages in conversations[:WARMUP_REQUESTS]:  # first calls pay for lazy initialisation
        await in_process(engine, messages, max_tokens)
        await through_server(client, messages, max_tokens)
    direct: list[float] = []
    served: list[float] = []
    direct_tokens = served_tokens = mismatched = 0
    for index, messages in enumerate(conversations):
        # alternate which mode goes first, so neither always runs right after the other
        if index % 2 == 0:
            direct_s, direct_n = await in_process(engine, messages, max_tokens)
            served_s, served_n = await through_server(client, messages, max_tokens)
        else:
            served_s, served_n = await through_server(client, messages, max_tokens)
            direct_s, direct_n = await in_process(engine, messages, max_tokens)
        direct.append(direct_s)
        served.append(served_s)
        direct_tokens += direct_n
        served_tokens += served_n
        mismatched += direct_n != served_n  # greedy: both modes should generate the same tokens
    paired = [(s - d) * 1000 for s, d in zip(served, direct)]
    direct_summary, served_summary = summarize(direct, direct_tokens), summarize(served, served_tokens)
    return {
        "in_process": asdict(direct_summary),
        "http": asdict(served_summary),
        "overhead_median_ms": served_summary.median_ms - direct_summary.median_ms,
        "overhead_p99_ms": served_summary.p99_ms - direct_summary.p99_ms,
        # per request (same prompt, back to back): the overhead a client actually pays
        "overhead_paired_median_ms": statistics.median(paired),
        "overhead_paired_p99_ms": percentile(paired, 0.99),
        "token_count_mismatches": mismatched,
    }


async def measure_throughput(
    client: httpx.AsyncClient, conversations: list[list[dict[str, str]]], concurrency: int, total: int, max_tokens: int
) -> ThroughputLevel:
    """`concurrency` clients take requests from one queue until `total` have been answered."""
    queue: asyncio.Queue[list[dict[str, str]]] = asyncio.Queue()
    for index in range(total):
        queue.put_nowait(conversations[index % len(conversations)])
    latencies: list[float] = []
    tokens = 0

    async def client_loop() -> None:
        nonlocal tokens
        while True:
            try:
                messages = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            elapsed, generated = await over_http(client, messages, max_tokens)
            latencies.append(elapsed)
            tokens += generated

    started = time.perf_counter()
    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return ThroughputLevel(
        concurrency=concurrency,
        requests=total,
        wall_s=wall,
        requests_per_s=total / wall,
        tokens_per_s=tokens / wall,
        median_latency_ms=statistics.median(latencies) * 1000,
        p99_latency_ms=percentile(latencies, 0.99) * 1000,
    )


async def run(engine: Engine, root: str, args: argparse.Namespace) -> dict[str, Any]:
    conversations = prompts(args.requests)
    if args.client == "process":
        client = ClientProcess(root)
        try:
            overhead = await measure_overhead(engine, client, conversations, args.max_tokens)
            levels = []
            for concurrency in CONCURRENCY_LEVELS:
                total = max(args.requests, concurrency * 4)
                for requests in (concurrency, total):  # a warm-up level first, as below
                    levels.append(client.ask({"conversations": len(conversations), "concurrency": concurrency,
                                              "total": requests, "max_tokens": args.max_tokens}))  # fmt: skip
        finally:
            client.close()
        return {"overhead": overhead, "throughput": levels[1::2]}
    limits = httpx.Limits(max_connections=max(CONCURRENCY_LEVELS) + 4, max_keepalive_connections=max(CONCURRENCY_LEVELS) + 4)
    async with httpx.AsyncClient(base_url=root, timeout=300, limits=limits) as http:
        overhead = await measure_overhead(engine, http, conversations, args.max_tokens)
        measured = []
        for concurrency in CONCURRENCY_LEVELS:
            # every client sends several requests, so ramp-up and the tail are a small part of the wall time
            total = max(args.requests, concurrency * 4)
            await measure_throughput(http, conversations, concurrency, concurrency, args.max_tokens)  # warm-up
            measured.append(await measure_throughput(http, conversations, concurrency, total, args.max_tokens))
    return {"overhead": overhead, "throughput": [asdict(level) for level in measured]}


def markdown(results: dict[str, Any]) -> str:
    overhead = results["overhead"]
    direct, served = overhead["in_process"], overhead["http"]
    lines = [
        f"Client: {results['args']['client']}. Engine: " + ("none (`--null-engine`): the server's own cost alone" if results["args"]["null_engine"] else results["args"]["model"]),
        "",
        (
            f"Latency, one request at a time ({served['requests']} requests, greedy, "
            f"max_tokens={results['args']['max_tokens']}, non-streaming):"
        ),
        "",
        "| path | median (ms) | p99 (ms) | mean (ms) | tokens generated |",
        "|---|---:|---:|---:|---:|",
        f"| engine in-process | {direct['median_ms']:.1f} | {direct['p99_ms']:.1f} | {direct['mean_ms']:.1f} | {direct['completion_tokens']} |",
        f"| HTTP server | {served['median_ms']:.1f} | {served['p99_ms']:.1f} | {served['mean_ms']:.1f} | {served['completion_tokens']} |",
        (
            f"| difference | {overhead['overhead_median_ms']:.1f} | {overhead['overhead_p99_ms']:.1f} | "
            f"{served['mean_ms'] - direct['mean_ms']:.1f} | |"
        ),
        (
            "| **server overhead per request** (HTTP minus in-process, same prompt) | "
            f"**{overhead['overhead_paired_median_ms']:.1f}** | **{overhead['overhead_paired_p99_ms']:.1f}** | | |"
        ),
        "",
        "Throughput through the server (greedy, non-streaming, clients send back to back):",
        "",
        "| concurrent clients | requests | wall (s) | requests/s | generated tokens/s | median latency (ms) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for level in results["throughput"]:
        lines.append(
            f"| {level['concurrency']} | {level['requests']} | {level['wall_s']:.2f} | {level['requests_per_s']:.1f} | "
            f"{level['tokens_per_s']:.0f} | {level['median_latency_ms']:.0f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100, help="requests per latency mode and per throughput level")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens generated per request (greedy)")
    parser.add_argument(
        "--model", default="tiny", help="'tiny' (built locally into a temp dir) or a Hugging Face model directory"
    )
    parser.add_argument("--device", default="cpu", help="engine device: cpu, cuda or auto")
    parser.add_argument("--cpu-threads", type=int, default=1, help="torch threads on the CPU (1 is fastest for the tiny model)")
    parser.add_argument("--null-engine", action="store_true", help="an engine that costs nothing: the server's own cost alone")
    parser.add_argument("--client", choices=("process", "thread"), default="process",
                        help="the HTTP client in a process of its own (as real clients are) or on this process's loop")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/serve_overhead.json"), help="JSON results")
    args = parser.parse_args(argv)
    if args.requests < WARMUP_REQUESTS or args.max_tokens < 1:
        parser.error(f"--requests must be >= {WARMUP_REQUESTS} and --max-tokens >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-") as scratch:
        model_dir = build_tiny_model(Path(scratch) / "model", seed=0) if args.model == "tiny" else Path(args.model)
        if args.null_engine:
            engine: Engine = NullEngine(model_dir)
        else:
            engine = build_engine(EngineConfig(model=str(model_dir), device=args.device, cpu_threads=args.cpu_threads))
        store = Store.for_run_dir(Path(scratch) / "run")
        config = ServeConfig(port=free_port(), served_model_name=SERVED_NAME)
        started = time.perf_counter()
        # The server starts the engine; the in-process measurements then share it from this thread's loop.
        with ServerThread(engine, store, config) as server:
            results = asyncio.run(run(engine, server.base_url.removesuffix("/v1"), args))
        store.close()
    if torch.cuda.is_available() and args.device != "cpu":
        # the serving process's whole peak: weights, keys and values, the engine's workspaces
        results["cuda_peak_bytes"] = torch.cuda.max_memory_allocated()
    results = {
        "benchmark": "serve_overhead",
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "args": {
            "requests": args.requests,
            "max_tokens": args.max_tokens,
            "model": args.model,
            "device": args.device,
            "cpu_threads": args.cpu_threads,
            "null_engine": args.null_engine,
            "client": args.client,
        },
        "machine": machine(),
        "elapsed_s": time.perf_counter() - started,
        **results,
    }
    print(markdown(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--client-for"]:
        raise SystemExit(client_main(sys.argv[2]))
    raise SystemExit(main())
