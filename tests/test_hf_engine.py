"""The `hf` engine on the locally built tiny model: streaming, sampling, batching, scoring, swaps.

Every test starts its own engine inside `asyncio.run` (a start costs ~0.1 s on the tiny model), so
tests share nothing but the model directory.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from clawrl.config import EngineConfig
from clawrl.engines import build_engine
from clawrl.engines.base import GenerationStream, LineageNotLoadedError, SamplingParams, TokenStep
from clawrl.engines.hf import EngineClosedError, HFEngine
from clawrl.engines.hf_sampling import pick_token
from clawrl.sim.models import resolve_model
from clawrl.sim.tiny import tiny_model_path
from tests.helpers import running_hf_engine, save_lora_adapter, save_perturbed_weights

GREEDY = SamplingParams(temperature=0, max_tokens=12)
MESSAGES = [
    "hi",
    "What is the capital of France?",
    "Please write a short poem about the sea and the wind, in four lines.",
    "ok",
    "Summarise the following: the cat sat on the mat, then it slept for a long time in the sun.",
    "Tell me a joke",
    "List three fruits and explain, for each one, why people like it so much.",
    "thanks!",
]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The tiny model's matrices are too small to split: extra threads only add contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_path(tmp_path_factory.mktemp("cache"), seed=0)


def prompt(engine: HFEngine, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)


async def collect(stream: GenerationStream) -> list[TokenStep]:
    return [step async for step in stream]


def tokens(steps: list[TokenStep]) -> list[int]:
    return [step.token_id for step in steps]


def logprobs(steps: list[TokenStep]) -> torch.Tensor:
    return torch.tensor([step.logprob for step in steps])


def batch_sizes(engine: HFEngine) -> list[int]:
    """Record the batch size of every forward pass of the base model."""
    sizes: list[int] = []
    engine.base_model.register_forward_pre_hook(
        lambda module, args, kwargs: sizes.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    return sizes


def test_the_tiny_model_is_resolved_and_served_under_its_name(tmp_path: Path) -> None:
    config = EngineConfig(model="tiny", cache_dir=tmp_path, device="cpu")
    engine = build_engine(config, resolve_model(config))
    assert isinstance(engine, HFEngine)
    assert engine.model_name == "tiny"
    assert engine.max_context_tokens == 32768
    assert engine.tokenizer.eos_token == "<|im_end|>"


def test_streams_tokens_as_they_are_generated(model_dir: Path) -> None:
    async def main() -> tuple[GenerationStream, list[TokenStep], list[float]]:
        async with running_hf_engine(model_dir) as engine:
            assert engine.policy_version == 0
            stream = engine.generate(prompt(engine, "hi"), SamplingParams(temperature=0, max_tokens=40))
            steps, arrivals = [], []
            async for step in stream:
                steps.append(step)
                arrivals.append(time.perf_counter())
            return stream, steps, arrivals

    stream, steps, arrivals = asyncio.run(main())
    assert len(steps) == 40
    assert [step.finish_reason for step in steps] == [None] * 39 + ["length"]
    assert stream.finish_reason == "length" and stream.policy_version == 0
    assert all(step.logprob < 0 and step.top_logprobs == [] for step in steps)
    # Streamed, not delivered at the end: the steps arrive over time.
    assert arrivals[-1] > arrivals[0]


def test_end_of_turn_token_stops_and_is_included(model_dir: Path, tmp_path: Path) -> None:
    """A token listed as eos in generation_config ends the response with finish_reason "stop"."""

    async def first_tokens(directory: Path) -> list[TokenStep]:
        async with running_hf_engine(directory) as engine:
            return await collect(engine.generate(prompt(engine, "hi"), GREEDY))

    reference = asyncio.run(first_tokens(model_dir))
    stopper = reference[2].token_id
    variant = tmp_path / "model"
    shutil.copytree(model_dir, variant)
    generation_config = json.loads((variant / "generation_config.json").read_text())
    generation_config["eos_token_id"] = [*generation_config["eos_token_id"], stopper]
    (variant / "generation_config.json").write_text(json.dumps(generation_config))

    steps = asyncio.run(first_tokens(variant))
    stop_at = tokens(reference).index(stopper)
    assert tokens(steps) == tokens(reference)[: stop_at + 1]
    assert steps[-1].finish_reason == "stop"


def test_greedy_is_deterministic_and_top_logprobs_are_sorted(model_dir: Path) -> None:
    async def main() -> tuple[list[TokenStep], list[TokenStep]]:
        async with running_hf_engine(model_dir) as engine:
            ids = prompt(engine, "What is the capital of France?")
            params = SamplingParams(temperature=0, max_tokens=12, top_logprobs=5)
            return await collect(engine.generate(ids, params)), await collect(engine.generate(ids, params))

    first, second = asyncio.run(main())
    assert tokens(first) == tokens(second)
    torch.testing.assert_close(logprobs(first), logprobs(second), rtol=0, atol=1e-5)
    for step in first:
        assert len(step.top_logprobs) == 5
        values = [value for _, value in step.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert step.top_logprobs[0] == (step.token_id, pytest.approx(step.logprob))


def test_seed_fixes_sampling_even_when_batched(model_dir: Path) -> None:
    sampling = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=16, seed=1234)

    async def main() -> tuple[list[TokenStep], ...]:
        async with running_hf_engine(model_dir) as engine:
            ids = prompt(engine, "Tell me a joke")
            alone = await collect(engine.generate(ids, sampling))
            others = [engine.generate(prompt(engine, text), SamplingParams(temperature=1.0)) for text in MESSAGES[:3]]
            batched, *_ = await asyncio.gather(
                collect(engine.generate(ids, sampling)), *(collect(stream) for stream in others)
            )
            other_seed = await collect(engine.generate(ids, SamplingParams(temperature=1.0, max_tokens=16, seed=99)))
            return alone, batched, other_seed

    alone, batched, other_seed = asyncio.run(main())
    assert tokens(alone) == tokens(batched)
    torch.testing.assert_close(logprobs(alone), logprobs(batched), rtol=0, atol=1e-4)
    assert tokens(alone) != tokens(other_seed)


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_p=0.9)],
    ids=["greedy", "seeded"],
)
def test_batched_decoding_matches_solo_decoding(model_dir: Path, sampling: SamplingParams) -> None:
    """8 prompts of different lengths and budgets; half join while the others are mid-decode."""

    def params(i: int) -> SamplingParams:
        return SamplingParams(sampling.temperature, sampling.top_p, max_tokens=10 + 3 * i, seed=i, top_logprobs=2)

    async def main() -> tuple[list[list[TokenStep]], list[list[TokenStep]], list[int]]:
        async with running_hf_engine(model_dir, max_batch_size=8) as engine:
            prompts = [prompt(engine, text) for text in MESSAGES]
            assert len({len(ids) for ids in prompts}) > 4
            solo = [await collect(engine.generate(ids, params(i))) for i, ids in enumerate(prompts)]
            sizes = batch_sizes(engine)
            early = [engine.generate(ids, params(i)) for i, ids in enumerate(prompts[:4])]
            iterators = [aiter(stream) for stream in early]
            heads = [[await anext(iterator) for _ in range(3)] for iterator in iterators]
            late = [engine.generate(ids, params(i + 4)) for i, ids in enumerate(prompts[4:])]
            tails = await asyncio.gather(*(collect(stream) for stream in early + late))
            batched = [head + tail for head, tail in zip(heads, tails[:4])] + tails[4:]
            return solo, batched, sizes

    solo, batched, sizes = asyncio.run(main())
    assert max(sizes) == 8  # all eight rows did share decode steps
    for alone, together in zip(solo, batched):
        assert tokens(alone) == tokens(together)
        torch.testing.assert_close(logprobs(alone), logprobs(together), rtol=0, atol=1e-4)
        assert [step.top_logprobs[1][0] for step in alone] == [step.top_logprobs[1][0] for step in together]


def test_a_seeded_top_p_draw_ignores_float_noise_and_stays_in_the_nucleus() -> None:
    """Another batch shape perturbs log-probs by ~1e-7; near-equal tokens then swap ranks, which must not move the draw.

    An untrained model's distribution is nearly flat: many tokens are within float noise of each other.
    """
    levels = torch.randint(0, 40, (4096,), generator=torch.Generator().manual_seed(0))
    flat = levels.float() * 0.01  # groups of exactly equal log-probs
    noisy = flat + torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 1e-6
    sampling = SamplingParams(temperature=1.0, top_p=0.9, seed=0)
    draws = [(pick_token(flat, sampling, torch.Generator().manual_seed(seed)).item(),
              pick_token(noisy, sampling, torch.Generator().manual_seed(seed)).item()) for seed in range(300)]  # fmt: skip
    assert sum(a != b for a, b in draws) <= 9  # only a draw among the tokens at the nucleus boundary may differ
    probs = torch.softmax(noisy, -1)
    sorted_probs, order = probs.sort(descending=True)
    nucleus = set(order[(sorted_probs.cumsum(-1) - sorted_probs) < 0.9].tolist())
    assert {b for _, b in draws} <= nucleus and len(nucleus) < 4096


@pytest.mark.parametrize("temperature, top_p", [(1.0, 5e-324), (1e-300, 0.9), (5e-324, 1.0)])
def test_a_vanishing_top_p_or_temperature_still_draws_a_token(temperature: float, top_p: float) -> None:
    """Found by the OpenAPI fuzz (tests/test_openapi_fuzz.py): `top_p: 5e-324` is valid (> 0) but
    rounds to 0 in float32, so the nucleus kept no token, and a tiny temperature overflowed the
    logits to -inf; both made `torch.multinomial` raise (a 500). Both now draw the most likely token."""
    logprobs = torch.log_softmax(torch.randn(512, generator=torch.Generator().manual_seed(0)), -1)
    sampling = SamplingParams(temperature=temperature, top_p=top_p, seed=0)
    assert pick_token(logprobs, sampling, torch.Generator().manual_seed(0)).item() == logprobs.argmax().item()


def test_cancel_frees_the_slot(model_dir: Path) -> None:
    async def main() -> tuple[list[TokenStep], list[TokenStep]]:
        async with running_hf_engine(model_dir, max_batch_size=1) as engine:
            endless = engine.generate(prompt(engine, "hi"), SamplingParams(temperature=0, max_tokens=100_000))
            waiting = engine.generate(prompt(engine, "ok"), SamplingParams(temperature=0, max_tokens=5))
            iterator = aiter(endless)
            head = [await anext(iterator) for _ in range(3)]
            endless.cancel()
            rest = await asyncio.wait_for(collect(endless), timeout=10)  # ends instead of hanging
            assert len(head) + len(rest) < 1000
            return head, await asyncio.wait_for(collect(waiting), timeout=10)

    head, after = asyncio.run(main())
    assert len(head) == 3
    assert len(after) == 5 and after[-1].finish_reason == "length"


def test_score_matches_generation_logprobs(model_dir: Path) -> None:
    async def main() -> tuple[list[TokenStep], Any]:
        async with running_hf_engine(model_dir) as engine:
            ids = prompt(engine, "Please write a short poem about the sea and the wind, in four lines.")
            steps = await collect(engine.generate(ids, SamplingParams(max_tokens=20, seed=7, top_logprobs=4)))
            return steps, await engine.score(ids, tokens(steps), top_k=4)

    steps, scored = asyncio.run(main())
    torch.testing.assert_close(torch.tensor(scored.logprobs), logprobs(steps), rtol=0, atol=1e-4)
    assert scored.top_token_ids == [[token for token, _ in step.top_logprobs] for step in steps]
    expected = torch.tensor([[value for _, value in step.top_logprobs] for step in steps])
    torch.testing.assert_close(torch.tensor(scored.top_logprobs), expected, rtol=0, atol=1e-4)


def test_load_version_swaps_new_requests_and_keeps_in_flight_ones(model_dir: Path, tmp_path: Path) -> None:
    lora_1 = save_lora_adapter(model_dir, tmp_path / "v1", seed=1)
    lora_2 = save_lora_adapter(model_dir, tmp_path / "v2", seed=2)
    full_3 = save_perturbed_weights(model_dir, tmp_path / "v3")
    long = SamplingParams(temperature=0, max_tokens=400)  # long enough to outlive the swap

    async def run_greedy(engine: HFEngine, ids: list[int]) -> tuple[GenerationStream, list[TokenStep]]:
        stream = engine.generate(ids, GREEDY)
        return stream, await collect(stream)

    async def main() -> dict[str, Any]:
        async with running_hf_engine(model_dir) as engine:
            ids = prompt(engine, "What is the capital of France?")
            reference = await collect(engine.generate(ids, long))
            in_flight = engine.generate(ids, long)
            iterator = aiter(in_flight)
            head = [await anext(iterator) for _ in range(2)]
            rest = asyncio.ensure_future(collect(in_flight))
            await engine.load_version(1, lora_1)
            stream_1, steps_1 = await run_greedy(engine, ids)
            assert not rest.done()  # both versions really were decoding side by side
            old = head + await rest
            results = {
                "version": engine.policy_version,
                "reference": reference,
                "old": old,
                "old_version": in_flight.policy_version,
                "new_version": stream_1.policy_version,
                "steps_1": steps_1,
                "score_0": await engine.score(ids, tokens(reference), version=0),
                "score_current": await engine.score(ids, tokens(steps_1)),
            }
            await engine.load_version(2, lora_2)
            stream_2, results["steps_2"] = await run_greedy(engine, ids)
            results["score_2"] = await engine.score(ids, tokens(results["steps_2"]), version=2)
            # Version 1 is neither current nor used by any request: it has been released.
            with pytest.raises(ValueError, match="not loaded"):
                await engine.score(ids, tokens(steps_1), version=1)
            await engine.load_version(3, full_3)
            stream_3, results["steps_3"] = await run_greedy(engine, ids)
            # Back to a LoRA version after every adapter was released: the first adapter again.
            await engine.load_version(4, lora_1)
            stream_4, results["steps_4"] = await run_greedy(engine, ids)
            results["versions"] = (stream_2.policy_version, stream_3.policy_version, stream_4.policy_version)
            return results

    r = asyncio.run(main())
    assert r["version"] == 1 and r["old_version"] == 0 and r["new_version"] == 1
    # The stream started before the swap decoded every step with version 0.
    assert tokens(r["old"]) == tokens(r["reference"])
    torch.testing.assert_close(logprobs(r["old"]), logprobs(r["reference"]), rtol=0, atol=1e-4)
    # New requests see the adapter.
    reference_head = r["reference"][: len(r["steps_1"])]
    assert not torch.allclose(logprobs(r["steps_1"]), logprobs(reference_head), atol=1e-2)
    torch.testing.assert_close(torch.tensor(r["score_0"].logprobs), logprobs(r["reference"]), rtol=0, atol=1e-4)
    torch.testing.assert_close(torch.tensor(r["score_current"].logprobs), logprobs(r["steps_1"]), rtol=0, atol=1e-4)
    # Later versions, LoRA then full weights, each differ from the one before.
    assert r["versions"] == (2, 3, 4)
    assert tokens(r["steps_4"]) == tokens(r["steps_1"])
    torch.testing.assert_close(logprobs(r["steps_4"]), logprobs(r["steps_1"]), rtol=0, atol=1e-4)
    assert not torch.allclose(logprobs(r["steps_2"]), logprobs(r["steps_1"]), atol=1e-2)
    assert not torch.allclose(logprobs(r["steps_3"]), logprobs(r["steps_2"]), atol=1e-2)
    torch.testing.assert_close(torch.tensor(r["score_2"].logprobs), logprobs(r["steps_2"]), rtol=0, atol=1e-4)


def test_rows_of_different_users_adapters_decode_in_one_forward_each_with_its_own(model_dir: Path, tmp_path: Path) -> None:
    """Per-user adapters: the base model's rows and two lineages' LoRA rows share every decode forward
    (PEFT's mixed-adapter batch), and each row's tokens and log-probs are those of its adapter alone."""
    adapters = {"alice": save_lora_adapter(model_dir, tmp_path / "a", seed=1), "bob": save_lora_adapter(model_dir, tmp_path / "b", seed=2)}
    sampling = SamplingParams(temperature=0, max_tokens=24)

    async def main() -> tuple[dict[str, list[TokenStep]], dict[str, list[TokenStep]], list[int], dict[str, int]]:
        async with running_hf_engine(model_dir, max_batch_size=8) as engine:
            for version, (lineage, path) in enumerate(adapters.items(), start=1):
                await engine.load_version(version, path, lineage)
            ids = prompt(engine, "Tell me about the sea.")
            lineages = ["shared", "alice", "bob"]
            alone = {lineage: await collect(engine.generate(ids, sampling, lineage)) for lineage in lineages}
            sizes = batch_sizes(engine)
            streams = {lineage: engine.generate(ids, sampling, lineage) for lineage in lineages}
            together = dict(zip(lineages, await asyncio.gather(*(collect(stream) for stream in streams.values()))))
            return alone, together, sizes, {lineage: stream.policy_version for lineage, stream in streams.items()}

    alone, together, sizes, versions = asyncio.run(main())
    assert versions == {"shared": 0, "alice": 1, "bob": 2}
    assert max(sizes) == 3  # the three lineages' rows in one forward
    assert len({tuple(tokens(steps)) for steps in alone.values()}) == 3  # each adapter answers differently
    for lineage in alone:
        assert tokens(together[lineage]) == tokens(alone[lineage]), lineage
        torch.testing.assert_close(logprobs(together[lineage]), logprobs(alone[lineage]), rtol=0, atol=1e-4)


def test_the_least_recently_used_lineage_is_evicted_beyond_max_loaded_adapters_never_while_in_use(model_dir: Path, tmp_path: Path) -> None:
    paths = [save_lora_adapter(model_dir, tmp_path / f"v{index}", seed=index) for index in range(1, 5)]

    async def until_evicted(engine: HFEngine, lineage: str) -> None:
        deadline = time.monotonic() + 10
        while engine.lineage_version(lineage) is not None:
            assert time.monotonic() < deadline, f"{lineage} was never evicted"
            await asyncio.sleep(0.01)

    async def main() -> None:
        async with running_hf_engine(model_dir, max_loaded_adapters=2) as engine:
            ids = prompt(engine, "Tell me a story.")
            await engine.load_version(1, paths[0], "alice")
            await engine.load_version(2, paths[1], "bob")
            running = engine.generate(ids, SamplingParams(temperature=0, max_tokens=300), "alice")  # alice: in use
            first = aiter(running)
            await anext(first)
            await collect(engine.generate(ids, GREEDY, "bob"))  # bob was asked after alice
            await engine.load_version(3, paths[2], "carol")  # three held: one must go, and alice is in use
            await until_evicted(engine, "bob")
            assert engine.lineage_version("alice") == 1 and engine.lineage_version("carol") == 3
            with pytest.raises(LineageNotLoadedError):
                engine.generate(ids, GREEDY, "bob")
            assert [step async for step in first][-1].finish_reason is not None  # alice's request ran to its end
            await engine.load_version(4, paths[3], "dave")  # alice is no longer in use and is the least recent
            await until_evicted(engine, "alice")
            assert sorted(engine.held_versions()) == [0, 3, 4] and engine.lineage_version("shared") == 0
            await engine.load_version(2, paths[1], "bob")  # an evicted lineage comes back on its next load
            assert len(await collect(engine.generate(ids, GREEDY, "bob"))) > 0

    asyncio.run(main())


def test_event_loop_stays_responsive_while_generating(model_dir: Path) -> None:
    async def main() -> tuple[list[float], float]:
        async with running_hf_engine(model_dir, max_batch_size=8) as engine:
            streams = [engine.generate(prompt(engine, text), SamplingParams(max_tokens=64)) for text in MESSAGES]
            ticks: list[float] = []
            done = asyncio.gather(*(collect(stream) for stream in streams))
            start = time.perf_counter()
            while not done.done():
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.01)
            await done
            return [b - a for a, b in zip(ticks, ticks[1:])], time.perf_counter() - start

    gaps, elapsed = asyncio.run(main())
    assert len(gaps) >= 5, f"generation took {elapsed:.2f}s; too short to observe the loop"
    assert max(gaps) < 0.2, f"the event loop stalled for {max(gaps):.3f}s"


def test_worker_error_fails_only_the_affected_stream(model_dir: Path) -> None:
    async def main() -> tuple[list[TokenStep], BaseException | None, list[TokenStep]]:
        async with running_hf_engine(model_dir, prefix_cache_gib=0) as engine:  # the poison is known by its whole prompt in one prefill
            poison = prompt(engine, "Tell me a joke")

            def explode(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
                if kwargs["input_ids"].shape[1] == len(poison):
                    raise RuntimeError("simulated out of memory")

            healthy = engine.generate(prompt(engine, "hi"), GREEDY)
            engine.base_model.register_forward_pre_hook(explode, with_kwargs=True)
            failing = engine.generate(poison, GREEDY)
            error = None
            try:
                await collect(failing)
            except RuntimeError as exc:
                error = exc
            after = await collect(engine.generate(prompt(engine, "ok"), GREEDY))
            return await collect(healthy), error, after

    healthy, error, after = asyncio.run(main())
    assert len(healthy) == len(after) == GREEDY.max_tokens
    assert error is not None and "simulated" in str(error)


def test_close_fails_streams_in_flight(model_dir: Path) -> None:
    async def main() -> None:
        engine = HFEngine(EngineConfig(device="cpu"), model_path=model_dir)
        await engine.start()
        # Greedy: this model's greedy answer to "hi" runs to the context limit (32K tokens), so
        # the stream is surely still open when close() comes; a sampled one may stop early.
        stream = engine.generate(prompt(engine, "hi"), SamplingParams(temperature=0, max_tokens=100_000))
        await anext(aiter(stream))
        await engine.close()
        with pytest.raises(EngineClosedError):
            await collect(stream)
        with pytest.raises(EngineClosedError):
            engine.generate(prompt(engine, "hi"), GREEDY)

    asyncio.run(main())


def test_rejects_invalid_requests(model_dir: Path) -> None:
    async def main() -> None:
        async with running_hf_engine(model_dir, max_context_tokens=64) as engine:
            with pytest.raises(ValueError):
                engine.generate([], GREEDY)
            with pytest.raises(ValueError):
                engine.generate([1] * 64, GREEDY)
            with pytest.raises(ValueError):
                engine.generate([10**9], GREEDY)
            with pytest.raises(ValueError):
                engine.generate([1], SamplingParams(top_p=0))
            # The context limit caps the response: 60 prompt tokens leave room for 4.
            steps = await collect(engine.generate([1] * 60, SamplingParams(temperature=0, max_tokens=100)))
            assert len(steps) == 4 and steps[-1].finish_reason == "length"

    asyncio.run(main())
