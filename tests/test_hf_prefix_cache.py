"""The hf engine's prefix cache (issue 14): an agent's later turn prefills only what is new, answers
exactly as without the cache, never takes a prefix computed under another policy version, and
stays within its memory budget."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from clawrl.engines.base import SamplingParams, TokenStep
from clawrl.engines.hf import HFEngine
from clawrl.model.chat import render_prompt
from clawrl.sim.tiny import tiny_model_path
from tests.helpers import running_hf_engine, save_lora_adapter

SYSTEM = "You are a careful assistant inside a workspace. Read files before you edit them; run the tests after. " * 80
GREEDY = SamplingParams(temperature=0, max_tokens=12, top_logprobs=3)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_path(tmp_path_factory.mktemp("cache"), seed=0)


async def answer(engine: HFEngine, ids: list[int]) -> list[TokenStep]:
    return [step async for step in engine.generate(ids, GREEDY)]


def session_prompts(engine: HFEngine) -> list[list[int]]:
    """Three turns of one agent session, each re-sending the whole history."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "list the files"}]
    prompts = [render_prompt(engine.tokenizer, messages, None)]
    test_log = "".join(f"tests/test_{index}.py::test_case_{index} PASSED [{index}%]\n" for index in range(50))
    for reply, follow_up in [("README.md and main.py", "read main.py"), ("It prints hello.", "the test log:\n" + test_log)]:
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": follow_up}]
        prompts.append(render_prompt(engine.tokenizer, messages, None))
    return prompts


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((index for index, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def assert_same_answer(cached: list[TokenStep], plain: list[TokenStep]) -> None:
    assert [step.token_id for step in cached] == [step.token_id for step in plain]
    torch.testing.assert_close(torch.tensor([s.logprob for s in cached]), torch.tensor([s.logprob for s in plain]), rtol=0, atol=1e-5)
    for with_cache, without in zip(cached, plain, strict=True):
        assert [token for token, _ in with_cache.top_logprobs] == [token for token, _ in without.top_logprobs]


def test_later_turns_reuse_the_cached_history_and_answer_as_without_it(model_dir: Path) -> None:
    async def run() -> tuple[list[list[TokenStep]], list[list[TokenStep]], list[dict[str, int]], list[list[int]], dict[str, int]]:
        async with running_hf_engine(model_dir) as cached, running_hf_engine(model_dir, prefix_cache_gib=0) as plain:
            prompts = session_prompts(cached)
            with_cache, without, stats = [], [], []
            for ids in prompts:
                with_cache.append(await answer(cached, ids))
                without.append(await answer(plain, ids))
                stats.append(cached.prefix_cache_stats)
            return with_cache, without, stats, prompts, plain.prefix_cache_stats

    with_cache, without, stats, prompts, plain_stats = asyncio.run(run())
    for cached_answer, plain_answer in zip(with_cache, without, strict=True):
        assert_same_answer(cached_answer, plain_answer)
    assert stats[0]["hits"] == 0 and stats[0]["entries"] == 1
    # each later turn took from the cache all that it shares with the previous turn's prompt (all of
    # that prompt); the session keeps one entry
    shared = [common_prefix(prompts[0], prompts[1]), common_prefix(prompts[1], prompts[2])]
    assert len(prompts[2]) - shared[1] > 1024  # the last turn's new part (a test log) is prefilled in several chunks
    assert shared[0] >= len(prompts[0]) - 1 and shared[1] >= len(prompts[1]) - 1
    assert stats[1]["reused_tokens"] == shared[0] and stats[2]["reused_tokens"] - stats[1]["reused_tokens"] == shared[1]
    assert stats[2]["hits"] == 2 and stats[2]["entries"] == 1
    assert plain_stats["hits"] == 0 and plain_stats["entries"] == 0


def test_a_cached_prefix_never_crosses_policy_versions(model_dir: Path, tmp_path: Path) -> None:
    adapter = save_lora_adapter(model_dir, tmp_path / "v1", seed=1)

    async def run() -> dict[str, Any]:
        async with running_hf_engine(model_dir) as cached, running_hf_engine(model_dir, prefix_cache_gib=0) as plain:
            ids = session_prompts(cached)[0]
            seen: dict[str, Any] = {"v0": await answer(cached, ids)}
            await cached.load_version(1, adapter)
            await plain.load_version(1, adapter)
            seen["v1_first"], seen["stats_v1_first"] = await answer(cached, ids), cached.prefix_cache_stats
            seen["v1_again"], seen["stats_v1_again"] = await answer(cached, ids), cached.prefix_cache_stats
            seen["v1_plain"] = await answer(plain, ids)
            await cached.load_version(0, model_dir)  # version 1 is released, and its entries with it
            seen["v0_again"], seen["stats_back"] = await answer(cached, ids), cached.prefix_cache_stats
            return seen

    seen = asyncio.run(run())
    # the first request on version 1 found only version 0's entry, and did not take it
    assert seen["stats_v1_first"]["hits"] == 0 and seen["stats_v1_first"]["entries"] == 2
    assert_same_answer(seen["v1_first"], seen["v1_plain"])
    assert seen["stats_v1_again"]["hits"] == 1  # version 1's own entry
    assert_same_answer(seen["v1_again"], seen["v1_plain"])
    assert seen["stats_back"]["hits"] == 2 and seen["stats_back"]["entries"] == 1
    assert_same_answer(seen["v0_again"], seen["v0"])
    assert [s.token_id for s in seen["v1_plain"]] != [s.token_id for s in seen["v0"]]  # the adapter does change the answer


def test_the_cache_stays_within_its_budget(model_dir: Path) -> None:
    async def run() -> tuple[int, list[dict[str, int]]]:
        async with running_hf_engine(model_dir) as probe:
            await answer(probe, session_prompts(probe)[0])
            one_prompt = probe.prefix_cache_stats["bytes"]
        budget = int(2.5 * one_prompt)
        async with running_hf_engine(model_dir, prefix_cache_gib=budget / 2**30) as engine:
            stats = []
            for index in range(6):  # prompts of about the same length that no other one extends
                messages = [{"role": "user", "content": f"{index} " + SYSTEM}]
                await answer(engine, render_prompt(engine.tokenizer, messages, None))
                stats.append(engine.prefix_cache_stats)
        return budget, stats

    budget, stats = asyncio.run(run())
    assert all(0 < entry["bytes"] <= budget and entry["entries"] <= 2 for entry in stats), stats
    assert stats[-1]["entries"] == 2  # the two most recent are kept
