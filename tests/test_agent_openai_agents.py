"""The OpenAI Agents SDK (`openai-agents`, pinned in the dev extras) against a real server.

An `agents.Agent` on `OpenAIResponsesModel`, with an `AsyncOpenAI` client pointed at the server,
holds a conversation of three user messages, chained the two ways the SDK's users chain them:
`result.to_input_list()` plus the next message (the SDK keeps the history and echoes every answer),
or `previous_response_id=result.last_response_id` (the server keeps it). Either way the server
must record one session of three main turns with the engine's token ids, and the offline judge
scores each answer from the user's reply alone: the correction is -1 with its directive as the
hint, the thanks +1. Tracing is off: the SDK would upload traces to OpenAI's service.

The tiny model, untrained, writes until the token limit, and the SDK takes a response that stopped
there (`status: "incomplete"`) as a failure of the run (`ModelBehaviorError`). The model served is
therefore the tiny model fitted for a few seconds to this conversation (`poet_model_dir`), so that
its answers end on their own, and the agent decodes greedily, so that they are the same each run.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import agents
import httpx
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, RunResult
from openai import AsyncOpenAI

from clawrl.config import JudgeConfig
from clawrl.messages import user_typed
from clawrl.serve.runner import ServerThread
from clawrl.store import Store
from clawrl.types import Turn
from tests.helpers import fit, start_server, wait_for_judgment

MODEL = "clawrl-tiny"
API_KEY = "sk-agents"
INSTRUCTIONS = "You write short poems."
LINES = ["Write a two-line poem about tea.", "no, make it rhyme and keep it short", "thanks, that's perfect"]
HINT = "Make it rhyme and keep it short."  # the rule judge's hint from the correction's directive
MAX_TOKENS = 64
CLIENTS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "clients.md"
DOCUMENTED_ADDRESS = "http://localhost:30000"

# The SDK uploads a trace of every run to OpenAI's service unless told not to (with an OpenAI key it
# does not have here). Process-wide, and left so: no test should send traces anywhere.
agents.set_tracing_disabled(True)


@pytest.fixture(scope="module")
def poet_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model fitted (20 steps, seconds) to this conversation: its answers then end within a
    few dozen tokens, greedy or sampled, where the untrained model's answers run to the token limit."""
    answers = ["Steam curls from the cup, morning settles in.", "Tea in the pot, warm and hot.", "Glad you like it!"]
    history: list[dict[str, Any]] = [{"role": "system", "content": INSTRUCTIONS}]
    conversations = []
    for line, answer in zip(LINES, answers):
        history = [*history, {"role": "user", "content": line}]
        conversations.append((history, answer))
        history = [*history, {"role": "assistant", "content": answer}]
    return fit(tiny_model_dir, tmp_path_factory.mktemp("poet-model"), conversations, steps=20, tools=None)


@pytest.fixture
def server(poet_model_dir: Path, run_dir: Path) -> Iterator[ServerThread]:
    with start_server(poet_model_dir, run_dir, judge=JudgeConfig(judge_poll_s=0.05), served_model_name=MODEL,
                      api_key=API_KEY) as running:  # fmt: skip
        yield running


class Poet:
    """An agent of the SDK on the server, keeping the body of every request it sends (an httpx
    event hook: the client and the SDK are otherwise untouched). One conversation each."""

    def __init__(self, base_url: str) -> None:
        self.sent: list[dict[str, Any]] = []

        async def keep(request: httpx.Request) -> None:
            self.sent.append(json.loads(request.content))

        self.http = httpx.AsyncClient(event_hooks={"request": [keep]})
        client = AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, http_client=self.http)
        self.agent = Agent(name="Poet", instructions=INSTRUCTIONS, model=OpenAIResponsesModel(model=MODEL, openai_client=client),
                           model_settings=ModelSettings(max_tokens=MAX_TOKENS, temperature=0))  # fmt: skip

    def converse(self, lines: list[str], chaining: str) -> list[RunResult]:
        """One run per user message, the history carried as `chaining` says."""

        async def run() -> list[RunResult]:
            results: list[RunResult] = []
            for line in lines:
                if not results:
                    result = await Runner.run(self.agent, line)
                elif chaining == "input list":
                    result = await Runner.run(self.agent, [*results[-1].to_input_list(), {"role": "user", "content": line}])
                else:
                    result = await Runner.run(self.agent, line, previous_response_id=results[-1].last_response_id)
                results.append(result)
            await self.http.aclose()
            return results

        return asyncio.run(run())


def recorded(store: Store, results: list[RunResult]) -> list[Turn]:
    """The turns the runs were answered by (a response's id is its turn's id), all of one session."""
    turns = [store.turns.turn(result.last_response_id) for result in results]
    assert all(turn is not None for turn in turns)
    (session_id,) = {turn.session_id for turn in turns}
    assert [entry.turn.id for entry in store.turns.session_turns(session_id)] == [turn.id for turn in turns]
    return turns


@pytest.mark.parametrize("chaining", ["input list", "previous_response_id"])
def test_an_agents_sdk_conversation_is_one_session_judged_from_the_users_replies(server: ServerThread, run_dir: Path,
                                                                                 chaining: str) -> None:  # fmt: skip
    results = Poet(server.base_url).converse(LINES, chaining)
    store = Store.for_run_dir(run_dir)
    turns = recorded(store, results)
    assert store.turns.counts()["main_turns"] == len(LINES)
    for result, turn in zip(results, turns):
        assert turn.kind == "main" and turn.finish_reason == "stop"
        assert turn.prompt_token_ids and 0 < len(turn.response_token_ids) <= MAX_TOKENS
        assert result.final_output == turn.response_text  # what the agent returned is what was recorded
    # The recorded conversation is the same whichever way the SDK chained it.
    assert turns[2].messages == [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": LINES[0]},
        {"role": "assistant", "content": turns[0].response_text},
        {"role": "user", "content": LINES[1]},
        {"role": "assistant", "content": turns[1].response_text},
        {"role": "user", "content": LINES[2]},
    ]
    corrected, thanked = wait_for_judgment(store, turns[0].id), wait_for_judgment(store, turns[1].id)
    assert corrected.score == -1 and "rhyme" in (corrected.hint or "").lower()
    assert thanked.score == 1


def test_what_the_sdk_sends_is_recorded_and_the_judge_reads_only_what_the_user_typed(server: ServerThread, run_dir: Path) -> None:
    """The SDK's requests as they go over the wire, and the turns they become."""
    poet = Poet(server.base_url)
    results = poet.converse(LINES[:2], "input list")
    first, second = recorded(Store.for_run_dir(run_dir), results)
    # The agent's instructions in `instructions`, the user's words as typed, nothing else of the
    # SDK's: no `store` (so the server records), no session header or field, no tools.
    settings = {"model": MODEL, "instructions": INSTRUCTIONS, "include": [], "tools": [], "max_output_tokens": MAX_TOKENS,
                "temperature": 0.0}  # fmt: skip
    assert poet.sent[0] == {**settings, "input": [{"role": "user", "content": LINES[0]}]}
    # The second request echoes the first answer as the output item it came as, then the reply.
    echoed = {"id": "msg_" + first.id.removeprefix("resp_"), "type": "message", "role": "assistant", "status": "completed",
              "content": [{"type": "output_text", "text": first.response_text, "annotations": []}]}  # fmt: skip
    assert poet.sent[1] == {**settings, "input": [{"role": "user", "content": LINES[0]}, echoed, {"role": "user", "content": LINES[1]}]}
    # Recorded as chat messages: the instructions are the system message, the echo the answer's text.
    assert first.messages == [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": LINES[0]}]
    answer, reply = {"role": "assistant", "content": first.response_text}, {"role": "user", "content": LINES[1]}
    assert second.messages == [*first.messages, answer, reply]
    assert first.tools is None and (first.sampling.temperature, first.sampling.max_tokens) == (0.0, MAX_TOKENS)

    # The first answer's next state is the user's reply alone, and the judge's hint is its directive.
    store = Store.for_run_dir(run_dir)
    context = store.judging.turn_context(first.id)
    assert context.next_messages == [{"role": "user", "content": LINES[1]}]
    assert [user_typed(message) for message in context.next_messages] == [LINES[1]]
    verdict = wait_for_judgment(store, first.id)
    assert (verdict.score, verdict.hint, [candidate.hint for candidate in verdict.hint_candidates]) == (-1, HINT, [HINT])


def documented_script() -> str:
    """The Python block under docs/clients.md's `## OpenAI Agents SDK`."""
    section = CLIENTS_PAGE.read_text().split("\n## OpenAI Agents SDK\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_documented_script_runs_as_written(poet_model_dir: Path, run_dir: Path) -> None:
    """docs/clients.md's Agents SDK section, against the server the page starts (sampled answers:
    the script sets no temperature)."""
    with start_server(poet_model_dir, run_dir, served_model_name="my-agent", api_key="sk-local") as server:
        code = documented_script()
        assert DOCUMENTED_ADDRESS in code
        address = server.base_url.removesuffix("/v1")
        result = subprocess.run([sys.executable, "-c", code.replace(DOCUMENTED_ADDRESS, address)], capture_output=True, text=True,
                                timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    response_ids = [line.split(" ", 1)[0] for line in result.stdout.splitlines() if line.startswith("resp_")]
    assert len(response_ids) == 3
    store = Store.for_run_dir(run_dir)
    turns = [store.turns.turn(response_id) for response_id in response_ids]
    assert len({turn.session_id for turn in turns}) == 1  # input list, then previous_response_id: one session
    assert store.judging.turn_context(response_ids[0]).next_messages == [{"role": "user", "content": LINES[1]}]


def test_an_agent_with_an_output_type_gets_an_instance_of_it(server: ServerThread, run_dir: Path) -> None:
    """The SDK's structured outputs: an `output_type` becomes a strict `json_schema` text format, which
    the server decodes under a grammar, so even the tiny model's answer parses into the type. (Its
    fields are bounded, and the budget is roomy: under greedy decoding this tiny model writes a free
    string until the token limit, and a line break with the most indentation the grammar allows
    between every two tokens.)"""
    from typing import Literal

    from pydantic import BaseModel, Field

    class Poem(BaseModel):
        topic: Literal["tea", "rain", "morning"]
        lines: int = Field(ge=1, le=8)

    sent: list[dict[str, Any]] = []

    async def keep(request: httpx.Request) -> None:
        sent.append(json.loads(request.content))

    async def run() -> RunResult:
        async with httpx.AsyncClient(event_hooks={"request": [keep]}) as http:
            client = AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0, http_client=http)
            agent = Agent(name="Poet", instructions=INSTRUCTIONS, output_type=Poem,
                          model=OpenAIResponsesModel(model=MODEL, openai_client=client),
                          model_settings=ModelSettings(max_tokens=256, temperature=0))  # fmt: skip
            return await Runner.run(agent, LINES[0])

    result = asyncio.run(run())
    assert isinstance(result.final_output, Poem)
    (body,) = sent
    assert body["text"]["format"]["type"] == "json_schema" and body["text"]["format"]["strict"] is True
    turn = Store.for_run_dir(run_dir).turns.turn(result.last_response_id)
    assert turn is not None and turn.sampling.grammar is not None
    assert Poem.model_validate_json(turn.response_text) == result.final_output
