"""One contract, every engine: `hf` in process, `vllm` (vLLM's CPU build, started by clawrl from
.venv-vllm) and `openai` pointed at that same vLLM server (issue 14).

Log-probs are checked against an independent reference: the model (and its LoRA adapters) run by
plain transformers/PEFT, `log_softmax` of the raw logits. The vLLM engines skip where vLLM is not
installed (`make test` installs it; under CI, `CLAWRL_REQUIRE_VLLM=1`, they fail instead).

The engines live for the whole module on one event loop in a thread (a vLLM server takes ~30 s to
load); each test submits its coroutine to that loop.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections.abc import Awaitable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from clawrl.config import EngineConfig
from clawrl.engines import build_engine
from clawrl.engines.base import Engine, GenerationStream, SamplingParams, TokenStep
from clawrl.engines.remote import RemoteEngine, RemoteEngineError
from clawrl.engines.vllm import VLLMEngine
from clawrl.sim.tiny import tiny_model_path
from tests.helpers import require_vllm, save_lora_adapter, save_perturbed_weights

T = TypeVar("T")
KINDS = ("hf", "vllm", "openai")
CONTEXT = 2048
ATOL = 2e-3  # float32 on both sides; vLLM's CPU kernels sum in another order than torch's
SHARED_PREFIX = "Here is the whole history of the project so far, read it with care before you answer. " * 6
QUESTIONS = ["What is the capital of France?", "Tell me a joke", "List three fruits.", "ok", "Summarise it."]


class LoopThread:
    """An event loop running in a thread for the module's lifetime."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Awaitable[T], timeout: float = 300) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)  # type: ignore[arg-type]
        return future.result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_path(tmp_path_factory.mktemp("cache"), seed=0)


@pytest.fixture(scope="module")
def adapters(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("versions")
    return {"a": save_lora_adapter(model_dir, root / "a", seed=1), "b": save_lora_adapter(model_dir, root / "b", seed=2)}


class Reference:
    """Raw log-probs of the tiny model and its adapters, by plain transformers and PEFT."""

    def __init__(self, model_dir: Path, adapters: dict[str, Path]) -> None:
        self.models = {None: AutoModelForCausalLM.from_pretrained(model_dir).eval()}
        for name, path in adapters.items():
            self.models[name] = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), path).eval()

    @torch.no_grad()
    def logprobs(self, adapter: str | None, prompt: list[int], response: list[int]) -> torch.Tensor:
        """[len(response), vocab] raw log-probs at each response position."""
        ids = torch.tensor([prompt + response])
        logits = self.models[adapter](input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        return torch.log_softmax(logits, dim=-1)

    def of_tokens(self, adapter: str | None, prompt: list[int], response: list[int]) -> torch.Tensor:
        table = self.logprobs(adapter, prompt, response)
        return table[torch.arange(len(response)), torch.tensor(response)]


@pytest.fixture(scope="module")
def reference(model_dir: Path, adapters: dict[str, Path]) -> Reference:
    return Reference(model_dir, adapters)


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    runner = LoopThread()
    yield runner
    runner.stop()


@pytest.fixture(scope="module")
def vllm_engine(model_dir: Path, loop: LoopThread) -> Iterator[VLLMEngine]:
    require_vllm()
    # clawrl's default of 4 LoRA slots; the module loads more adapters than that
    config = EngineConfig(model="tiny", engine="vllm", device="cpu", max_context_tokens=CONTEXT, max_batch_size=32,
                          vllm_start_timeout_s=240)  # fmt: skip
    engine = VLLMEngine(config, model_path=model_dir)
    loop.run(engine.start(), timeout=600)
    yield engine
    loop.run(engine.close())


@pytest.fixture(scope="module")
def engines(loop: LoopThread) -> Iterator[dict[str, Engine]]:
    """The engines started so far, by kind (each started on first use)."""
    started: dict[str, Engine] = {}
    yield started
    for kind, engine in started.items():
        if kind != "vllm":  # the vllm fixture closes its own
            loop.run(engine.close())


@pytest.fixture(params=KINDS)
def engine(request: pytest.FixtureRequest, engines: dict[str, Engine], model_dir: Path, loop: LoopThread) -> Engine:
    kind = request.param
    if kind not in engines:
        if kind == "hf":
            engines[kind] = build_engine(EngineConfig(device="cpu", max_context_tokens=CONTEXT), model_path=str(model_dir))
        elif kind == "vllm":
            engines[kind] = request.getfixturevalue("vllm_engine")
        else:
            server = request.getfixturevalue("vllm_engine").servers[0]
            config = EngineConfig(model="tiny", engine="openai", engine_url=server.base_url, max_context_tokens=CONTEXT)
            engines[kind] = build_engine(config, model_path=str(model_dir))
        loop.run(engines[kind].start())
    engine = engines[kind]
    loop.run(engine.load_version(0, model_dir))  # every test starts on the base model
    return engine


def prompt_ids(engine: Engine, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return list(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))


async def collect(stream: GenerationStream) -> list[TokenStep]:
    return [step async for step in stream]


async def generate_all(engine: Engine, ids: list[int], sampling: SamplingParams) -> list[TokenStep]:
    """A whole generation (started on the loop: a stream belongs to the loop it was made on)."""
    return await collect(engine.generate(ids, sampling))


def token_ids(steps: list[TokenStep]) -> list[int]:
    return [step.token_id for step in steps]


# --------------------------------------------------------------------------- the contract


def test_token_ids_and_raw_logprobs_equal_the_reference(engine: Engine, loop: LoopThread, reference: Reference) -> None:
    """Temperature and top-p shape the sampling, never the reported log-probs: those are the raw
    model distribution, as the trainer recomputes it."""
    ids = prompt_ids(engine, "What is the capital of France?")
    sampling = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=24, seed=5, top_logprobs=3)
    steps = loop.run(generate_all(engine, ids, sampling))
    response = token_ids(steps)
    assert len(response) == 24 and steps[-1].finish_reason == "length"
    table = reference.logprobs(None, ids, response)
    torch.testing.assert_close(torch.tensor([s.logprob for s in steps]), table[torch.arange(24), torch.tensor(response)], rtol=0, atol=ATOL)
    for position, step in enumerate(steps):
        values, indices = table[position].topk(3)
        assert [token for token, _ in step.top_logprobs] == indices.tolist()
        torch.testing.assert_close(torch.tensor([v for _, v in step.top_logprobs]), values, rtol=0, atol=ATOL)


def test_score_is_teacher_forcing_with_top_k(engine: Engine, loop: LoopThread, reference: Reference) -> None:
    ids = prompt_ids(engine, "Tell me a joke")
    response = engine.tokenizer.encode("Why did the cat sit on the mat? To keep warm.")
    scored = loop.run(engine.score(ids, response, top_k=4))
    table = reference.logprobs(None, ids, response)
    torch.testing.assert_close(torch.tensor(scored.logprobs), table[torch.arange(len(response)), torch.tensor(response)], rtol=0, atol=ATOL)
    values, indices = table.topk(4, dim=-1)
    assert scored.top_token_ids == indices.tolist()
    torch.testing.assert_close(torch.tensor(scored.top_logprobs), values, rtol=0, atol=ATOL)


def test_a_seed_fixes_the_sample(engine: Engine, loop: LoopThread) -> None:
    ids = prompt_ids(engine, "List three fruits.")

    def sample(seed: int) -> list[int]:
        return token_ids(loop.run(generate_all(engine, ids, SamplingParams(max_tokens=16, seed=seed))))

    first, again, other = sample(11), sample(11), sample(12)
    assert first == again and first != other


def test_the_end_of_turn_token_stops_and_is_included(
    engine: Engine, loop: LoopThread, model_dir: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A token the model's generation config lists as eos ends the response, finish_reason "stop"."""
    ids = prompt_ids(engine, "hi")
    greedy = SamplingParams(temperature=0, max_tokens=12)
    plain = token_ids(loop.run(generate_all(engine, ids, greedy)))
    stopper = plain[3]
    variant = tmp_path / "model"
    shutil.copytree(model_dir, variant)
    generation_config = json.loads((variant / "generation_config.json").read_text())
    generation_config["eos_token_id"] = [*generation_config["eos_token_id"], stopper]
    (variant / "generation_config.json").write_text(json.dumps(generation_config))
    if isinstance(engine, RemoteEngine):  # the same server; the eos list is the client's (stop_token_ids)
        config = EngineConfig(engine="openai", engine_url=engine.base_url, max_context_tokens=CONTEXT)
        stopping: Engine = RemoteEngine(config, model_path=variant)
    else:
        stopping = build_engine(EngineConfig(device="cpu", max_context_tokens=CONTEXT), model_path=str(variant))

    async def run() -> list[TokenStep]:
        await stopping.start()
        try:
            return await collect(stopping.generate(ids, greedy))
        finally:
            await stopping.close()

    steps = loop.run(run())
    assert token_ids(steps) == plain[: plain.index(stopper) + 1]
    assert steps[-1].finish_reason == "stop"


def test_tokens_stream_as_they_are_generated(engine: Engine, loop: LoopThread) -> None:
    """Tokens arrive in separate bursts over the generation, the first well before the last. A low
    bar on the bursts, because vLLM's front end sends several tokens per chunk when it falls behind
    its engine (13 chunks for 600 tokens seen on two busy cores, 3 on a machine also training a
    model). Once in CI the front end got no CPU until the engine had finished and sent all 600 in
    three bursts at the end, so the test gives the engine three tries: an engine that answers at the
    end sends its first token with its last every time, and fails all three."""
    ids = prompt_ids(engine, "Summarise it.")

    async def arrivals() -> tuple[float, list[float]]:
        started = time.monotonic()
        return started, [time.monotonic() async for _ in engine.generate(ids, SamplingParams(max_tokens=600, seed=1))]

    tries = []
    for _ in range(3):
        started, times = loop.run(arrivals())
        assert len(times) == 600
        pauses = sum(later - earlier > 0.001 for earlier, later in zip(times, times[1:]))
        first_share = (times[0] - started) / (times[-1] - started)
        tries.append((pauses, round(first_share, 3)))
        if pauses >= 2 and first_share < 0.5:
            return
    pytest.fail(f"every try arrived at once at the end: (pauses, share of the time before the first token) = {tries}")


def test_cancel_hangs_up_and_frees_the_engine(engine: Engine, loop: LoopThread) -> None:
    ids = prompt_ids(engine, "Tell me a joke")

    async def run() -> tuple[int, float, list[TokenStep]]:
        stream = engine.generate(ids, SamplingParams(max_tokens=1500, seed=3))
        received = 0
        started = time.monotonic()
        try:
            async for _ in stream:
                received += 1
                if received == 3:
                    stream.cancel()
        except Exception:  # noqa: BLE001 - an engine may end a cancelled stream with an error
            pass
        ended = time.monotonic() - started
        after = await collect(engine.generate(ids, SamplingParams(max_tokens=4, seed=3)))
        return received, ended, after

    received, ended, after = loop.run(run())
    assert received < 1500 and ended < 30 and len(after) == 4
    if isinstance(engine, RemoteEngine):
        assert running_requests(engine) == 0


def running_requests(engine: RemoteEngine) -> float:
    """vLLM's own count of requests it is decoding (it aborts a request whose client hung up)."""
    url = engine.base_url.removesuffix("/v1")
    deadline = time.monotonic() + 10
    while True:
        lines = httpx.get(f"{url}/metrics").text.splitlines()
        running = sum(float(line.split()[-1]) for line in lines if line.startswith("vllm:num_requests_running"))
        if running == 0 or time.monotonic() > deadline:
            return running
        time.sleep(0.2)


Answer = tuple[int, list[int], list[TokenStep]]  # (policy version, prompt ids, the steps served)


def off_version_tokens(answers: list[Answer], loaded: dict[int, str | None], reference: Reference) -> list[tuple[Any, ...]]:
    """Every served token whose log-prob is not its own version's (`loaded`: version -> adapter),
    with the version whose log-prob it is closest to."""
    mismatched = []
    for number, (version, ids, steps) in enumerate(answers):
        expected = reference.of_tokens(loaded[version], ids, token_ids(steps))
        names = {name for other, name in loaded.items() if name != loaded[version]}
        others = {name: reference.of_tokens(name, ids, token_ids(steps)) for name in names}
        served = torch.tensor([s.logprob for s in steps])
        for position in torch.nonzero((served - expected).abs() > ATOL).flatten().tolist():
            closest = min(others, key=lambda name: abs(float(others[name][position] - served[position])))
            mismatched.append((number, version, position, round(float(served[position] - expected[position]), 4), f"closest to {closest or 'base'}"))
    return mismatched


def test_vllm_lora_slots_never_lend_weights_to_other_requests(
    vllm_engine: VLLMEngine, loop: LoopThread, adapters: dict[str, Path], reference: Reference
) -> None:
    """vLLM's LoRA slots, filled and recycled while requests are in flight (docs/engines.md, "LoRA
    slots"). Phase 1: base-model requests are decoding while a LoRA version per usable slot is
    loaded and given requests of its own, so every slot is in use beside them, and the judge's
    teacher scores under the base meanwhile. Phase 2: twice as many versions as slots, one after
    another. Every answer's and score's log-probs are its own version's, and vLLM ends up holding
    no retired adapter. (Before clawrl pinned a zero adapter in vLLM's last slot, base-model tokens
    batched with LoRA ones came out with the delta of the adapter in that slot; before it removed
    retired adapters from the engine, the slots filled with them.)"""
    slots = vllm_engine.config.max_loras
    loaded: dict[int, str | None] = {0: None} | {number: "ab"[number % 2] for number in range(1, 2 * slots + 2)}
    prompts = [prompt_ids(vllm_engine, SHARED_PREFIX + question) for question in QUESTIONS]
    response = vllm_engine.tokenizer.encode("Why did the cat sit on the mat? To keep warm.")
    answers: list[Answer] = []
    seen: dict[str, Any] = {"resident": []}

    def start(ids: list[int], max_tokens: int, seed: int, stop: asyncio.Event | None = None) -> tuple[list[TokenStep], asyncio.Future[None]]:
        """A request, its steps recorded as they come; it hangs up once `stop` is set (the steps so far count)."""
        stream = vllm_engine.generate(ids, SamplingParams(max_tokens=max_tokens, seed=seed))
        steps: list[TokenStep] = []
        answers.append((stream.policy_version, ids, steps))

        async def consume() -> None:
            async for step in stream:
                steps.append(step)
                if stop is not None and stop.is_set():
                    stream.cancel()
                    break

        return steps, asyncio.ensure_future(consume())

    async def unpinned() -> set[int]:
        return await vllm_engine.resident_lora_ids() - vllm_engine.pinned_lora_ids

    async def run() -> None:
        await vllm_engine.load_version(0, Path("."))
        stop = asyncio.Event()
        # long requests, ended by `stop`, so that they are still decoding once every slot is in use
        base = [start(prompts[index], 1500, index, stop) for index in range(4)]
        tasks = [task for _, task in base]
        version_tasks: dict[int, list[asyncio.Future[None]]] = {}
        for version in range(1, slots + 1):
            await vllm_engine.load_version(version, adapters[loaded[version]])  # type: ignore[index]
            version_tasks[version] = [start(prompts[index], 1500, 100 * version + index, stop)[1] for index in range(2)]
            tasks += version_tasks[version]
        # and two more base-model requests now, beside every slot in use: on a slow machine the first
        # four can all reach max_tokens while the versions load (CI once saw none left decoding)
        late = [start(prompts[index], 1500, 50 + index, stop) for index in range(2)]
        base += late
        tasks += [task for _, task in late]
        seen["full"] = await unpinned()
        base_running = [(steps, len(steps), task) for steps, task in base if not task.done()]
        seen["scored"] = await vllm_engine.score(prompts[0], response, version=0)
        # 64 more tokens of every base-model request still running (one may have ended on its own)
        while any(len(steps) < count + 64 and not task.done() for steps, count, task in base_running):
            await asyncio.sleep(0.05)
        seen["base_tokens_after"] = [len(steps) - count for steps, count, _ in base_running]
        # a version whose requests all ended on their own (a sampled end of text) may be retired by
        # now; one with a request still decoding, and the current one, must still hold their slots
        seen["in_use_after"] = sum(version == slots or any(not task.done() for task in version_tasks[version])
                                   for version in version_tasks)  # fmt: skip
        seen["full_after"] = await unpinned()
        stop.set()
        await asyncio.gather(*tasks)
        for version in range(slots + 1, 2 * slots + 2):
            await vllm_engine.load_version(version, adapters[loaded[version]])  # type: ignore[index]
            await asyncio.gather(*(start(prompts[index], 24, 100 * version + index)[1] for index in range(2)))
            seen["resident"].append(await unpinned())
        await vllm_engine.load_version(0, Path("."))
        for _ in range(100):  # the last adapter is removed in the background
            if not await unpinned():
                break
            await asyncio.sleep(0.1)
        seen["end"] = await unpinned()

    loop.run(run(), timeout=900)
    # the condition under test did happen: every usable slot held a version in use while the
    # base-model requests were still decoding
    assert len(seen["full"]) == slots, seen
    assert seen["full_after"] <= seen["full"] and len(seen["full_after"]) >= seen["in_use_after"], seen
    assert sum(seen["base_tokens_after"]) >= 64, seen
    assert {version for version, _, _ in answers} == set(loaded)
    mismatched = off_version_tokens(answers, loaded, reference)
    assert mismatched == [], f"{len(mismatched)} of {sum(len(s) for _, _, s in answers)} tokens in {len(answers)} answers: {mismatched[:12]}"
    torch.testing.assert_close(torch.tensor(seen["scored"].logprobs), reference.of_tokens(None, prompts[0], response), rtol=0, atol=ATOL)
    # retired adapters leave the engine: the current one, and the previous while it is removed
    assert all(len(ids) <= 2 for ids in seen["resident"]) and seen["end"] == set(), seen


def test_sixteen_clients_through_lora_swaps_each_answer_on_one_version(
    engine: Engine, loop: LoopThread, adapters: dict[str, Path], reference: Reference
) -> None:
    """Versions 1 (adapter a), 2 (b) and 3 (a again) are swapped in while 16 clients keep asking
    questions that share a long prefix (so vLLM's prefix cache is in play): no request fails, and
    every answer's log-probs are those of the one version it was admitted on."""
    loaded = {0: None, 1: "a", 2: "b", 3: "a"}
    prompts = [prompt_ids(engine, SHARED_PREFIX + question) for question in QUESTIONS]
    answers: list[tuple[int, list[int], list[TokenStep]]] = []
    failures: list[BaseException] = []

    async def client(index: int, stop: asyncio.Event) -> None:
        turn = 0
        while not stop.is_set():
            ids = prompts[(index + turn) % len(prompts)]
            turn += 1
            try:
                stream = engine.generate(ids, SamplingParams(max_tokens=12, seed=index * 100 + turn))
                steps = await collect(stream)
                answers.append((stream.policy_version, ids, steps))
            except Exception as error:  # noqa: BLE001 - counted, and the test fails on any
                failures.append(error)

    async def run() -> None:
        stop = asyncio.Event()
        clients = [asyncio.ensure_future(client(index, stop)) for index in range(16)]
        for version, name in ((0, None), (1, "a"), (2, "b"), (3, "a")):
            if name is not None:
                await engine.load_version(version, adapters[name])
            for _ in range(600):  # until a few answers have come back on this version
                if sum(answered == version for answered, _, _ in answers) >= 4 or failures:
                    break
                await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*clients)

    loop.run(run())
    assert failures == []
    assert {version for version, _, _ in answers} == {0, 1, 2, 3}
    mismatched = off_version_tokens(answers, loaded, reference)
    assert mismatched == [], f"{len(mismatched)} of {sum(len(s) for _, _, s in answers)} tokens in {len(answers)} answers: {mismatched[:12]}"


def test_bad_input_is_refused_clearly(engine: Engine, loop: LoopThread, tmp_path: Path, model_dir: Path) -> None:
    ids = prompt_ids(engine, "hi")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([*ids, 10**6], SamplingParams())
    with pytest.raises(ValueError, match="prompt must have"):
        engine.generate([1] * CONTEXT, SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(ids, SamplingParams(top_p=0))
    if isinstance(engine, RemoteEngine) and not isinstance(engine, VLLMEngine):
        with pytest.raises(RemoteEngineError, match="cannot swap in full weights"):
            loop.run(engine.load_version(7, save_perturbed_weights(model_dir, tmp_path / "full")))


def test_vllm_swaps_full_weights_with_a_second_server(vllm_engine: VLLMEngine, loop: LoopThread, model_dir: Path, tmp_path: Path) -> None:
    """A full-weight version loads in a second vLLM server while the first goes on serving."""
    full = save_perturbed_weights(model_dir, tmp_path / "full")
    perturbed = AutoModelForCausalLM.from_pretrained(full).eval()
    ids = prompt_ids(vllm_engine, "What is the capital of France?")

    async def run() -> dict[str, Any]:
        await vllm_engine.load_version(0, model_dir)
        in_flight = vllm_engine.generate(ids, SamplingParams(max_tokens=400, seed=1))
        loading = asyncio.ensure_future(vllm_engine.load_version(5, full))
        during = []
        while not loading.done():  # the old server keeps answering while the new one loads
            during.append(await collect(vllm_engine.generate(ids, SamplingParams(max_tokens=4, seed=2))))
        await loading
        servers_during_swap = len(vllm_engine.servers)
        after = vllm_engine.generate(ids, SamplingParams(max_tokens=8, seed=3))
        result = {"old": (in_flight.policy_version, await collect(in_flight)), "new": (after.policy_version, await collect(after))}
        await vllm_engine.load_version(0, model_dir)  # back to the base; version 5's server stops
        for _ in range(300):
            if len(vllm_engine.servers) == 1:
                break
            await asyncio.sleep(0.1)
        result.update(during=during, servers_during_swap=servers_during_swap, servers_after=len(vllm_engine.servers))
        return result

    result = loop.run(run(), timeout=600)
    assert result["during"] and all(len(steps) == 4 for steps in result["during"])
    assert result["old"][0] == 0 and len(result["old"][1]) == 400
    version, steps = result["new"]
    with torch.no_grad():
        logits = perturbed(input_ids=torch.tensor([ids + token_ids(steps)])).logits[0, len(ids) - 1 : -1]
    expected = torch.log_softmax(logits.float(), -1)[torch.arange(len(steps)), torch.tensor(token_ids(steps))]
    assert version == 5
    torch.testing.assert_close(torch.tensor([s.logprob for s in steps]), expected, rtol=0, atol=ATOL)
    assert result["servers_during_swap"] == 2 and result["servers_after"] == 1
