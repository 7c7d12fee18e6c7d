"""smolagents (PyPI `smolagents==1.26.0`) against a real server (issue 31).

smolagents talks to an OpenAI-compatible server through its own stack: `OpenAIServerModel` (an alias
of `OpenAIModel`) builds each body (`ApiModel._prepare_completion_kwargs`) and sends it with the
openai SDK, not streamed. Its users hold a conversation with `agent.run(task)`, then
`agent.run(reply, reset=False)`, which keeps the agent's memory. Every run is a loop of model calls
("steps") that ends when the model calls the `final_answer` tool, or, after `max_steps`, with one
more call that asks for an answer outright. The tests hold one conversation of three user messages
(a request, a correction with a directive, thanks) three ways:

* a `ToolCallingAgent` on a model that answers each run with a `final_answer` call, as a capable
  model does: the tiny model fitted (seconds) to smolagents' own requests (`final_answer_model_dir`),
  with a short system prompt of the agent's own (`prompt_templates`);
* a `ToolCallingAgent` with smolagents' default prompts on the untrained tiny model, whose random
  text is no tool call, so each run hits `max_steps=1` (a step, then the "stuck" call whose answer
  the user gets);
* a `CodeAgent` on the untrained tiny model, the same way.

What a `ToolCallingAgent` sends (`test_a_tool_calling_agents_requests_are_recorded_as_sent`):

* Every step: the agent's system prompt ("You are an expert assistant who can solve any task using
  tool calls. ...", with the tools described in it; a first request is about 1,600 of the tiny
  model's tokens), then its memory; `tools` (its tools and `final_answer`), `tool_choice:
  "required"`, `stop: ["Observation:", "Calling tools:"]`; temperature and max_tokens only when
  given to the model (`OpenAIServerModel(..., max_tokens=...)`). Contents are lists of text parts.
  No session id: sessions are inferred from the answers the requests echo.
* The user's words arrive as a user message `New task:\\n<what the user typed>`.
* A tool call comes back not as `tool_calls` but as assistant text: `Calling tools:\\n` and Python's
  repr of the call with its arguments parsed (`[{'id': 'call_..', 'type': 'function', 'function':
  {'name': 'final_answer', 'arguments': {'answer': '...'}}}]`); its result as a user message
  `Observation:\\n<result>`. Messages of one role in a row are merged, so the user's next message
  arrives as `Observation:\\n<the answer the user saw>\\nNew task:\\n<reply>`.
* An answer with no tool call in it is followed by a user message `Error:\\nError while parsing tool
  call from model output: ...\\nNow let's retry: ...`.
* After `max_steps`: a request with the system prompt "An agent tried to answer a user query but it
  got stuck ...", the memory without the agent's system prompt, and `Based on the above, please
  provide an answer to the following user task:\\n<task>`, merged into the last user message. Its
  answer is the run's result, the answer the user sees; the memory keeps `Error:\\nReached max
  steps.` in its place, so no later request echoes it.

A `CodeAgent` sends no tools, adds `</code>` to the stop strings, and puts `</code>` back at the end
of every answer it keeps in its memory (`CodeAgent._step_stream`). When the answer's code parses
(a capable model's, or an empty answer: "" is Python), the agent runs it and keeps, in the same
message, its own call `Calling tools:\n[{... 'python_interpreter', 'arguments': '<the code>'}]`
after the answer (`test_a_code_agent_whose_code_runs_...`: the tiny model fitted to answer with code).

What the server does with it: session inference reads the text echo of a call as that call
(`messages.echoed_answers`), and a CodeAgent's own call after its answer as that answer; it knows
an echo by its answer without a stop string put back at its end (`</code>`), and hands the user's reply after a stuck run to the answer they saw (the agent's
follow-up, never echoed: `sessions._past_agent_follow_up`); the judge reads what follows the last
`New task:` line, and smolagents' own "Error: ... Now let's retry" notes as a failed step, never
as the user's words (`messages.is_agent_retry_note`). So an unmodified agent holds one session
judged from what the user typed. A session the client names (`X-Session-Id` through the openai
client's `default_headers`), as docs/clients.md's smolagents section shows, works too; its script
runs here.
"""

from __future__ import annotations

import importlib.resources
import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import yaml
from smolagents import CodeAgent, LogLevel, MultiStepAgent, OpenAIServerModel, ToolCallingAgent
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.config import JudgeConfig
from clawrl.judge.rule import judge_by_rules
from clawrl.messages import content_text, echoed_answers, is_agent_retry_note, user_typed
from clawrl.model.chat import render_prompt
from clawrl.store import Store
from clawrl.types import Judgment, Message, TurnContext
from tests.helpers import start_server, wait_for_judgment

MODEL, API_KEY, SESSION = "smol-tiny", "sk-smol", "tea-chat"
LINES = ["Write a two-line poem about tea.", "no, make it rhyme and keep it short", "thanks, that's perfect"]
# What the fitted model answers every run of the conversation with, as a `final_answer` call: the
# same answer each time, which the tiny model learns reliably in seconds (one answer per run it
# mixes up now and then); the judge reads the user's replies, not the answers.
ANSWER = "Steam curls from the cup,\nquiet leaves unfold."
FIT_STEPS, FIT_LEARNING_RATE = 60, 5e-3
# The fitted model's agent has a short system prompt of its own (`prompt_templates`, as users write
# them): smolagents' default is about 1,550 of the tiny model's tokens, after which the tiny model
# does not learn in seconds to answer each run reliably. The default is what the other agents send.
SHORT_SYSTEM = (
    "You write short poems. Answer each task with one call of a tool:"
    "{%- for tool in tools.values() %}\n- {{ tool.to_tool_calling_prompt() }}{%- endfor %}"
)
ANSWER_TOKENS = 96  # a final_answer call is about 40 of the tiny model's tokens
RANDOM_TOKENS = 16

CLIENTS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "clients.md"
DOCUMENTED_ADDRESS = "http://localhost:30000"

# smolagents' own words (prompts/toolcalling_agent.yaml, memory.py, agents.py)
TOOL_SYSTEM = "You are an expert assistant who can solve any task using tool calls."
STUCK_SYSTEM = (
    "An agent tried to answer a user query but it got stuck and failed to do so. You are tasked with "
    "providing an answer instead. Here is the agent's memory:"
)
PARSE_ERROR = "Error:\nError while parsing tool call from model output: "
RETRY = (
    "Now let's retry: take care not to repeat previous errors! If you have retried several times, "
    "try a completely different approach.\n"
)
MAX_STEPS_ERROR = "Error:\nReached max steps.\n" + RETRY
FINAL_ASK = "Based on the above, please provide an answer to the following user task:\n"
# No hint may carry these: they are smolagents' words, never the user's.
AGENT_WORDS = ("New task", "Observation", "Error", "retry", "max steps", "Based on the above", "user task", "Calling tools")


# --------------------------------------------------------------------------- talking through smolagents


class Wire:
    """An httpx client for the openai SDK inside smolagents that keeps every chat completion body as
    sent (the SDK's own serialisation) and the turn id the server answered it with."""

    def __init__(self, transport: httpx.BaseTransport | None = None) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.turn_ids: list[str] = []
        self.http = httpx.Client(transport=transport, timeout=120, event_hooks={"request": [self._sent], "response": [self._answered]})

    def _sent(self, request: httpx.Request) -> None:
        assert request.url.path.endswith("/chat/completions"), request.url
        assert request.headers["authorization"] == f"Bearer {API_KEY}"
        self.bodies.append(json.loads(request.content))

    def _answered(self, response: httpx.Response) -> None:
        assert response.status_code == 200, response.read()
        self.turn_ids.append(response.headers.get("x-clawrl-turn", ""))


def agent_model(base_url: str, wire: Wire, session: str | None = None, **options: Any) -> OpenAIServerModel:
    """smolagents' model for an OpenAI-compatible server, as its documentation sets it up; with
    `session`, the openai client sends it as `X-Session-Id` on every request (`default_headers`)."""
    client = {"http_client": wire.http} | ({"default_headers": {"X-Session-Id": session}} if session else {})
    return OpenAIServerModel(model_id=MODEL, api_base=base_url, api_key=API_KEY, client_kwargs=client, **options)


def default_agent(model: OpenAIServerModel) -> ToolCallingAgent:
    """A ToolCallingAgent with smolagents' own prompts; one step a run."""
    return ToolCallingAgent(tools=[], model=model, max_steps=1, verbosity_level=LogLevel.OFF)


def converse(agent: MultiStepAgent) -> list[Any]:
    """The user's conversation: the request, then each reply in the same conversation (`reset=False`
    keeps the agent's memory). Returns what each run answered: what the user saw."""
    return [agent.run(line, reset=index == 0) for index, line in enumerate(LINES)]


def short_prompt_agent(model: OpenAIServerModel) -> ToolCallingAgent:
    """A ToolCallingAgent with SHORT_SYSTEM as its system prompt and smolagents' other templates."""
    templates = yaml.safe_load(importlib.resources.files("smolagents.prompts").joinpath("toolcalling_agent.yaml").read_text())
    templates["system_prompt"] = SHORT_SYSTEM
    return ToolCallingAgent(tools=[], model=model, prompt_templates=templates, max_steps=1, verbosity_level=LogLevel.OFF)


def final_answer_call(answer: str) -> str:
    """A `final_answer` call as the tiny model's chat template writes tool calls."""
    return "<tool_call>\n" + json.dumps({"name": "final_answer", "arguments": {"answer": answer}}) + "\n</tool_call>"


def scripted_endpoint(answered: list[str]) -> httpx.MockTransport:
    """A stand-in for the server that answers every request with a `final_answer` call of ANSWER, in
    the server's own shape (content null, a `call_` id); `answered` gets the calls' ids."""

    def answer(request: httpx.Request) -> httpx.Response:
        call = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": "final_answer", "arguments": json.dumps({"answer": ANSWER})},
        }
        answered.append(call["id"])
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return httpx.Response(200, json={
            "id": f"chatcmpl-{len(answered)}", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })  # fmt: skip

    return httpx.MockTransport(answer)


@dataclass
class Talk:
    """A conversation held through smolagents against a real server, as recorded."""

    outputs: list[Any]  # what each run answered (what the user saw)
    bodies: list[dict[str, Any]]  # every request body smolagents sent, in order
    turns: list[TurnContext]  # the turn each request was recorded as, in the same order
    judgments: dict[str, Judgment | None]  # by turn id, once the judge has judged every turn with a next state


def hold(
    model_dir: Path,
    run_dir: Path,
    make_agent: Callable[[OpenAIServerModel], MultiStepAgent],
    session: str | None = None,
    **model_options: Any,
) -> Talk:
    """Hold the conversation through the agent `make_agent(model)` builds, against a real server with
    the judge running; wait until every turn with a next state is judged."""
    with start_server(model_dir, run_dir, judge=JudgeConfig(judge_poll_s=0.05), served_model_name=MODEL, api_key=API_KEY) as server:
        wire = Wire()
        with wire.http:
            outputs = converse(make_agent(agent_model(server.base_url, wire, session, **model_options)))
        store = Store.for_run_dir(run_dir)
        turns = [store.judging.turn_context(turn_id) for turn_id in wire.turn_ids]
        for entry in turns:
            if entry.next_state is not None:
                wait_for_judgment(store, entry.turn.id)
        turns = [store.judging.turn_context(turn_id) for turn_id in wire.turn_ids]
        return Talk(outputs, wire.bodies, turns, {entry.turn.id: store.judging.judgment(entry.turn.id) for entry in turns})


def typed(messages: list[Message]) -> list[str]:
    """What the user typed in each user message that carries any, as the judge reads it."""
    words = [user_typed(message) for message in messages if message["role"] == "user"]
    return [text for text in words if text]


def part(text: str) -> list[dict[str, str]]:
    """Content as smolagents sends it: a list of one text part."""
    return [{"type": "text", "text": text}]


def added_after(entry: TurnContext, later: TurnContext) -> list[Message]:
    """What `later`'s request adds after `entry`'s echoed answer (smolagents' memory only grows)."""
    request = entry.turn.messages
    system = [message for message in later.turn.messages if message["role"] == "system"]
    history = later.turn.messages[len(system):]
    own = request[len([m for m in request if m["role"] == "system"]):]
    assert history[: len(own)] == own, "the later request does not carry this turn's conversation"
    return history[len(own) + 1 :]


def clean_hint(hint: str | None) -> bool:
    """A hint of the user's words only: none of smolagents' and not the answer the user was shown."""
    return hint is not None and not any(word.lower() in hint.lower() for word in (*AGENT_WORDS, ANSWER.split("\n")[0]))


# --------------------------------------------------------------------------- a model that answers with final_answer


def fit_answers(model_dir: Path, out_dir: Path, bodies: list[dict[str, Any]], call_ids: list[str], steps: int, answer_text: str) -> Path:
    """Overfit the tiny model so that each request body is answered with `answer_text` (as the chat
    template writes it) under greedy decoding. As tests/helpers.py `fit`, but each step gives the calls that
    the requests echo new ids (the server's are random), and the learning rate decays to nothing
    (a constant one leaves the model unsure of a token or two)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    answer = tokenizer.encode(answer_text + "<|im_end|>", add_special_tokens=False)

    def prompt(body: dict[str, Any]) -> list[int]:
        text = json.dumps(body["messages"])
        for call_id in call_ids:
            text = text.replace(call_id, f"call_{uuid.uuid4().hex[:24]}")
        return render_prompt(tokenizer, json.loads(text), body.get("tools"))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the test server's engine; two threads on a busy machine take many times as long
    try:
        torch.manual_seed(0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=FIT_LEARNING_RATE)
        updates = steps * len(bodies)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 1 - update / updates)
        model.train()
        for _ in range(steps):
            for body in bodies:
                # the answer's logits alone: the whole vocabulary's at every prompt position cost more than the model
                logits = model(input_ids=torch.tensor([prompt(body) + answer]), logits_to_keep=len(answer) + 1).logits[0, :-1]
                torch.nn.functional.cross_entropy(logits, torch.tensor(answer)).backward()
                optimizer.step()
                optimizer.zero_grad()
                schedule.step()
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def final_answer_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model fitted (seconds of real training) to answer smolagents' three requests of the
    conversation with a `final_answer` call of ANSWER, as a capable model would. The requests are
    smolagents' own: taken on the wire from the same conversation against a stand-in endpoint that
    gives those answers."""
    call_ids: list[str] = []
    wire = Wire(scripted_endpoint(call_ids))
    with wire.http:
        assert converse(short_prompt_agent(agent_model("http://stand-in/v1", wire))) == [ANSWER] * len(LINES)
    return fit_answers(tiny_model_dir, tmp_path_factory.mktemp("smolagents-model"), wire.bodies, call_ids, FIT_STEPS, final_answer_call(ANSWER))


@pytest.fixture(scope="module")
def final_answer_talk(final_answer_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Talk:
    """A ToolCallingAgent whose model ends every run with a final_answer call (greedy, so it does)."""
    run_dir = tmp_path_factory.mktemp("smolagents-final") / "run"
    return hold(final_answer_model_dir, run_dir, short_prompt_agent, temperature=0, max_tokens=ANSWER_TOKENS)


def test_a_tool_calling_agents_requests_are_recorded_as_sent(final_answer_talk: Talk) -> None:
    talk = final_answer_talk
    assert talk.outputs == [ANSWER] * len(LINES)  # each run ended with the model's final_answer call
    assert len(talk.bodies) == len(talk.turns) == len(LINES)  # one model call per run
    for index, (body, entry) in enumerate(zip(talk.bodies, talk.turns, strict=True)):
        turn = entry.turn
        # The body: the agent's tools, a call required, its stop strings; what the model was given.
        assert sorted(body) == ["max_tokens", "messages", "model", "stop", "temperature", "tool_choice", "tools"]
        assert body["tool_choice"] == "required" and body["stop"] == ["Observation:", "Calling tools:"]
        assert [tool["function"]["name"] for tool in body["tools"]] == ["final_answer"]
        # Recorded as sent: every message, the tools, the sampling.
        assert turn.kind == "main"
        assert turn.messages == body["messages"] and turn.tools == body["tools"]
        assert (turn.sampling.stop, turn.sampling.max_tokens, turn.sampling.temperature) == (body["stop"], ANSWER_TOKENS, 0.0)
        # The agent's system prompt, then the user's words as "New task:\n...".
        system, task, *rest = turn.messages
        assert system["role"] == "system" and content_text(system["content"]).startswith("You write short poems.")
        assert "\n- final_answer: Provides a final answer to the given problem." in content_text(system["content"])
        assert task == {"role": "user", "content": part(f"New task:\n{LINES[0]}")}
        # Each earlier run: its call as text, then its observation and the user's next message merged.
        echoed: list[Message] = []
        for earlier in range(index):
            call = talk.turns[earlier].turn.tool_calls[0]  # type: ignore[index]
            as_memory = [{"id": call["id"], "type": "function", "function": {"name": "final_answer", "arguments": {"answer": ANSWER}}}]
            echoed += [
                {"role": "assistant", "content": part("Calling tools:\n" + str(as_memory))},
                {"role": "user", "content": part(f"Observation:\n{ANSWER}\nNew task:\n{LINES[earlier + 1]}")},
            ]
        assert rest == echoed
        # The answer: a final_answer call, parsed into tool_calls (and content null on the wire).
        assert turn.finish_reason == "tool_calls" and not turn.response_text
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in turn.tool_calls or []] == [
            ("final_answer", {"answer": ANSWER})
        ]


def test_a_tool_calling_agents_conversation_is_one_session_judged_from_what_the_user_typed(final_answer_talk: Talk) -> None:
    talk = final_answer_talk
    first, second, third = talk.turns
    assert first.turn.session_id == second.turn.session_id == third.turn.session_id
    # Each answer's next state is what the next run's request adds after the echoed call: the user's words, wrapped.
    assert [entry.next_state.source_turn_id if entry.next_state else None for entry in talk.turns] == [second.turn.id, third.turn.id, None]
    assert [typed(entry.next_messages) for entry in talk.turns] == [[LINES[1]], [LINES[2]], []]
    assert typed(third.turn.messages) == LINES  # the conversation's user turns are what the user typed
    correction, thanks = talk.judgments[first.turn.id], talk.judgments[second.turn.id]
    assert correction is not None and correction.score == -1 and "rhyme" in (correction.hint or "") and clean_hint(correction.hint)
    assert thanks is not None and (thanks.score, thanks.hint) == (1, None)


def test_the_judge_reads_only_what_the_user_typed_after_a_final_answer(final_answer_talk: Talk) -> None:
    """The judge half alone, on the recorded requests: each run's answer judged by what the next run's
    request adds after it, as session inference should give it (see the test above)."""
    first, second, third = final_answer_talk.turns
    correction, thanks = added_after(first, second), added_after(second, third)
    assert typed(correction) == [LINES[1]] and typed(thanks) == [LINES[2]]
    score, hints = judge_by_rules(first.turn.messages, correction)
    assert score == -1 and hints and all("rhyme" in hint and clean_hint(hint) for hint in hints)
    assert judge_by_rules(second.turn.messages, thanks) == (1, [])


# --------------------------------------------------------------------------- random text: every run hits max_steps


@pytest.fixture(scope="module")
def stuck_talk(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Talk:
    """A ToolCallingAgent on the untrained tiny model: its step is held to a call of final_answer (the
    agent sends `tool_choice: "required"`), but its random answer runs past max_tokens before the call
    closes, so no call parses and every run is a step that fails, then the call for an answer after
    max_steps=1. It samples, as smolagents asks
    by default (greedy, the untrained model writes newlines; with a fixed seed, the same text whatever
    the prompt, so that two answers would be one)."""
    return hold(tiny_model_dir, tmp_path_factory.mktemp("smolagents-stuck") / "run", default_agent, max_tokens=RANDOM_TOKENS)


def test_a_stuck_run_is_a_step_and_a_call_for_the_answer_in_one_session(stuck_talk: Talk) -> None:
    talk = stuck_talk
    assert len(talk.turns) == 2 * len(LINES)
    steps, stuck = talk.turns[0::2], talk.turns[1::2]
    assert len({entry.turn.session_id for entry in talk.turns}) == 1  # each request echoes the step before it
    assert all(entry.turn.kind == "main" for entry in talk.turns)
    for index, (step, answer) in enumerate(zip(steps, stuck, strict=True)):
        # What smolagents sends by default: no temperature; a call required of a step, nothing of the last call.
        assert sorted(talk.bodies[2 * index]) == ["max_tokens", "messages", "model", "stop", "tool_choice", "tools"]
        assert sorted(talk.bodies[2 * index + 1]) == ["max_tokens", "messages", "model"]
        # The step: the agent's prompt and tools; random text, so no tool call.
        system = content_text(step.turn.messages[0]["content"])
        assert system.startswith(TOOL_SYSTEM) and "- final_answer: Provides a final answer to the given problem." in system
        assert [tool["function"]["name"] for tool in step.turn.tools or []] == ["final_answer"]
        assert step.turn.sampling.stop == ["Observation:", "Calling tools:"] and not step.turn.tool_calls
        assert content_text(step.turn.messages[-1]["content"]).endswith(f"New task:\n{LINES[index]}")
        # The call for the answer: its own system prompt, the memory (the step's answer echoed), the
        # parse error and the request for an answer merged into one user message; no tools.
        messages = answer.turn.messages
        assert messages[0] == {"role": "system", "content": part(STUCK_SYSTEM)} and not answer.turn.tools
        assert messages[1:-2] == step.turn.messages[1:]
        assert messages[-2] == {"role": "assistant", "content": part(step.turn.response_text.strip())}
        last = content_text(messages[-1]["content"])
        assert last.startswith(PARSE_ERROR) and last.endswith(RETRY + "\n" + FINAL_ASK + LINES[index])
        # It continues the step: the step's next state is the error and the request for an answer.
        assert step.next_state is not None and step.next_state.source_turn_id == answer.turn.id
        assert step.next_messages == messages[-1:]
        # Its answer is the run's result, what the user saw; the next run's request does not carry it,
        # but "Reached max steps." after the step's error, then the user's next message.
        assert talk.outputs[index] == answer.turn.response_text
        for later in talk.turns[2 * index + 2 :]:
            echoed = [content_text(m.get("content")).strip() for m in later.turn.messages if m["role"] == "assistant"]
            assert answer.turn.response_text.strip() not in echoed
    for index, step in enumerate(steps[1:], start=1):
        assert content_text(step.turn.messages[-1]["content"]).startswith(PARSE_ERROR)
        assert MAX_STEPS_ERROR + "\nNew task:\n" + LINES[index] in content_text(step.turn.messages[-1]["content"])


def test_a_stuck_conversation_is_judged_from_what_the_user_typed(stuck_talk: Talk) -> None:
    talk = stuck_talk
    steps, stuck = talk.turns[0::2], talk.turns[1::2]
    # The answers the user saw continue into the next run's request (the next step, which echoes the
    # step before them): its new message, the user's next one, is their next state.
    assert [entry.next_state.source_turn_id if entry.next_state else None for entry in stuck] == [steps[1].turn.id, steps[2].turn.id, None]
    assert [typed(entry.next_messages) for entry in stuck] == [[LINES[1]], [LINES[2]], []]
    # The conversation's user turns are what the user typed (and, at most, smolagents' notes that an answer failed).
    assert [text for text in typed(stuck[-1].turn.messages) if not is_agent_retry_note(text)] == LINES
    correction, thanks = talk.judgments[stuck[0].turn.id], talk.judgments[stuck[1].turn.id]
    assert correction is not None and correction.score == -1 and "rhyme" in (correction.hint or "") and clean_hint(correction.hint)
    assert thanks is not None and (thanks.score, thanks.hint) == (1, None)
    # A step that wrote no tool call failed by smolagents' own account: -1, and nothing the user said to hint with.
    for step in steps:
        verdict = talk.judgments[step.turn.id]
        assert verdict is not None and (verdict.score, verdict.hint) == (-1, None)


def test_the_judge_reads_only_what_the_user_typed_in_a_stuck_conversation(stuck_talk: Talk) -> None:
    """The judge half alone, on the recorded requests: the step by smolagents' error, the answer the user
    saw by what the next run's request adds after the step's echo (as session inference should give it)."""
    steps, stuck = stuck_talk.turns[0::2], stuck_talk.turns[1::2]
    for step in steps:
        assert judge_by_rules(step.turn.messages, step.next_messages) == (-1, [])
    correction, thanks = added_after(steps[0], steps[1]), added_after(steps[1], steps[2])
    assert typed(correction) == [LINES[1]] and typed(thanks) == [LINES[2]]
    score, hints = judge_by_rules(stuck[0].turn.messages, correction)
    assert score == -1 and hints and all("rhyme" in hint and clean_hint(hint) for hint in hints)
    assert judge_by_rules(stuck[1].turn.messages, thanks) == (1, [])


# --------------------------------------------------------------------------- the session named by a header


@pytest.fixture(scope="module")
def named_talks(final_answer_model_dir: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Talk]:
    """Both ToolCallingAgent conversations again, each request naming the session (`X-Session-Id`)."""
    root = tmp_path_factory.mktemp("smolagents-named")
    return {
        "final answer": hold(final_answer_model_dir, root / "final", short_prompt_agent, SESSION, temperature=0, max_tokens=ANSWER_TOKENS),
        "stuck": hold(tiny_model_dir, root / "stuck", default_agent, SESSION, max_tokens=RANDOM_TOKENS),
    }


@pytest.mark.parametrize("conversation", ["final answer", "stuck"])
def test_with_the_session_named_each_answer_the_user_saw_gets_the_users_reply(named_talks: dict[str, Talk], conversation: str) -> None:
    """A session named by the client (the openai client's `default_headers`) needs no echo, so each
    answer the user saw, even one smolagents never echoes, has for its next state what follows the
    last assistant message of the next request: the user's next message, wrapped, which the judge
    reads as the user typed it."""
    talk = named_talks[conversation]
    assert {entry.turn.session_id for entry in talk.turns} == {SESSION}
    ids = [entry.turn.id for entry in talk.turns]
    shown = talk.turns if conversation == "final answer" else talk.turns[1::2]  # what each run answered the user with
    for entry, line in zip(shown, LINES[1:]):
        assert entry.next_state is not None and entry.next_state.source_turn_id == ids[ids.index(entry.turn.id) + 1]
        (reply,) = entry.next_messages
        assert reply["role"] == "user" and content_text(reply["content"]).endswith(f"New task:\n{line}")
    assert shown[-1].next_state is None
    correction, thanks = (talk.judgments[entry.turn.id] for entry in shown[:2])
    assert correction is not None and correction.score == -1 and "rhyme" in (correction.hint or "") and clean_hint(correction.hint)
    assert thanks is not None and (thanks.score, thanks.hint) == (1, None)


# --------------------------------------------------------------------------- docs/clients.md


def documented_script() -> str:
    """The Python block under docs/clients.md's `## smolagents`."""
    section = CLIENTS_PAGE.read_text().split("\n## smolagents\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_documented_script_holds_the_conversation_in_its_session(tiny_model_dir: Path, run_dir: Path) -> None:
    """docs/clients.md's smolagents section, against the server the page starts, one step a run
    (smolagents' default is 20). Its ToolCallingAgent sends `tool_choice: "required"`, so every step is a
    tool call (decoded under a grammar): `final_answer` ends the run there; any other tool leaves it at
    max_steps, and smolagents then asks for an answer in one more turn."""
    code = documented_script()
    assert all(f'"{line}"' in code for line in LINES)
    with start_server(tiny_model_dir, run_dir, served_model_name="my-agent", api_key="sk-local") as server:
        ours = [(DOCUMENTED_ADDRESS, server.base_url.removesuffix("/v1")), ("model=model)", "model=model, max_steps=1)")]
        for documented, here in ours:
            assert documented in code, f"docs/clients.md's smolagents script no longer has {documented!r}"
            code = code.replace(documented, here)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-4000:]
        store = Store.for_run_dir(run_dir)
        assert [session.id for session in store.turns.list_sessions()] == [SESSION]
        turns = store.turns.session_turns(SESSION)
    assert {entry.turn.kind for entry in turns} == {"main"} and len(LINES) <= len(turns) <= 2 * len(LINES)
    # each forced step that ended within its budget is a call (the tiny model may write a 512-token
    # argument string and be cut at the length: a grammar forces the form, not the end)
    forced = [entry.turn for entry in turns if entry.turn.sampling.grammar and entry.turn.finish_reason != "length"]
    assert forced and all(turn.tool_calls for turn in forced)
    # the answers the user saw, each followed by the user's next message
    followed = [content_text(reply["content"]) for entry in turns for reply in entry.next_messages]
    for line in LINES[1:]:
        assert any(text.endswith(f"New task:\n{line}") for text in followed), line


# --------------------------------------------------------------------------- CodeAgent


@pytest.fixture(scope="module")
def code_talk(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Talk:
    """A CodeAgent on the untrained tiny model: no code block in its text, so every run hits max_steps=1 too."""

    def agent(model: OpenAIServerModel) -> CodeAgent:
        return CodeAgent(tools=[], model=model, max_steps=1, verbosity_level=LogLevel.OFF)

    return hold(tiny_model_dir, tmp_path_factory.mktemp("smolagents-code") / "run", agent, max_tokens=RANDOM_TOKENS)


def test_a_code_agent_echoes_its_answers_with_the_closing_code_tag(code_talk: Talk) -> None:
    talk = code_talk
    assert len(talk.turns) == 2 * len(LINES)  # a step and the call for an answer per run, as above
    for body, step, answer in zip(talk.bodies[0::2], talk.turns[0::2], talk.turns[1::2], strict=True):
        assert sorted(body) == ["max_tokens", "messages", "model", "stop"]  # no tools: it writes code
        assert step.turn.sampling.stop == ["Observation:", "Calling tools:", "</code>"] and step.turn.tools is None
        # The call for the answer echoes the step's answer as the agent's memory keeps it: with
        # "</code>" at the end, which the server left out (a stop string) or never generated; an
        # empty answer (the model stopped at once) stays empty, is code, and is kept as the agent's
        # own call of `python_interpreter` with "" (seen in CI).
        echoed = [content_text(m["content"]) for m in answer.turn.messages if m["role"] == "assistant"][-1]
        kept = (step.turn.response_text + "</code>").strip() if step.turn.response_text else ""
        assert echoed_answers(echoed, None)[0] == (kept, None)


def test_a_code_agents_conversation_is_one_session(code_talk: Talk) -> None:
    assert len({entry.turn.session_id for entry in code_talk.turns}) == 1


# --------------------------------------------------------------------------- a CodeAgent whose code runs

# What the fitted model answers every CodeAgent step with: code that ends the run with ANSWER. The
# agent's stop string "</code>" cuts a real model's answer there, so the server's answer ends before it.
CODE_ANSWER = "Thought: a short poem.\n<code>\nfinal_answer(" + json.dumps(ANSWER) + ")\n"
SHORT_CODE_SYSTEM = "You write short poems. Answer each task with Python code between <code> and </code> that calls final_answer."


def short_prompt_code_agent(model: OpenAIServerModel) -> CodeAgent:
    """A CodeAgent with SHORT_CODE_SYSTEM as its system prompt and smolagents' other templates."""
    templates = yaml.safe_load(importlib.resources.files("smolagents.prompts").joinpath("code_agent.yaml").read_text())
    templates["system_prompt"] = SHORT_CODE_SYSTEM
    return CodeAgent(tools=[], model=model, prompt_templates=templates, max_steps=1, verbosity_level=LogLevel.OFF)


def scripted_code_endpoint() -> httpx.MockTransport:
    """A stand-in for the server that answers every request with CODE_ANSWER, in the server's shape."""

    def answer(request: httpx.Request) -> httpx.Response:
        message = {"role": "assistant", "content": CODE_ANSWER}
        return httpx.Response(200, json={
            "id": "chatcmpl-code", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })  # fmt: skip

    return httpx.MockTransport(answer)


@pytest.fixture(scope="module")
def code_answer_talk(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Talk:
    """A CodeAgent whose model writes code that runs, as a capable model does: the tiny model fitted to
    answer smolagents' own three requests (taken on the wire against the stand-in) with CODE_ANSWER."""
    wire = Wire(scripted_code_endpoint())
    with wire.http:
        assert converse(short_prompt_code_agent(agent_model("http://stand-in/v1", wire))) == [ANSWER] * len(LINES)
    model_dir = fit_answers(tiny_model_dir, tmp_path_factory.mktemp("smolagents-code-model"), wire.bodies, [], FIT_STEPS, CODE_ANSWER)
    run_dir = tmp_path_factory.mktemp("smolagents-code-answer") / "run"
    return hold(model_dir, run_dir, short_prompt_code_agent, temperature=0, max_tokens=ANSWER_TOKENS)


def test_a_code_agent_whose_code_runs_holds_one_session_judged_from_what_the_user_typed(code_answer_talk: Talk) -> None:
    """Each run's code ends it with ANSWER. The agent keeps the answer with "</code>" put back and,
    in the same message, its own call of `python_interpreter` with the code it ran; the next run's
    request echoes that, and its next state is the user's reply after the code's output."""
    talk = code_answer_talk
    assert talk.outputs == [ANSWER] * len(LINES) and len(talk.turns) == len(LINES)
    first, second, third = talk.turns
    assert all(entry.turn.response_text == CODE_ANSWER and not entry.turn.tool_calls for entry in talk.turns)
    echo = [message for message in second.turn.messages if message["role"] == "assistant"][-1]
    code = json.dumps(ANSWER).join(("final_answer(", ")"))
    as_memory = [{"id": "call_1", "type": "function", "function": {"name": "python_interpreter", "arguments": code}}]
    assert content_text(echo["content"]) == (CODE_ANSWER + "</code>").strip() + "\nCalling tools:\n" + str(as_memory)
    assert first.turn.session_id == second.turn.session_id == third.turn.session_id
    assert [entry.next_state.source_turn_id if entry.next_state else None for entry in talk.turns] == [second.turn.id, third.turn.id, None]
    assert [typed(entry.next_messages) for entry in talk.turns] == [[LINES[1]], [LINES[2]], []]
    correction, thanks = talk.judgments[first.turn.id], talk.judgments[second.turn.id]
    assert correction is not None and correction.score == -1 and "rhyme" in (correction.hint or "") and clean_hint(correction.hint)
    assert thanks is not None and (thanks.score, thanks.hint) == (1, None)
