"""A conversation that its agent compacts stays one session (issue 31).

When OpenClaw's context nears its window it compacts: a memory flush (side turn), a summarizer
request (side turn: "You are a context summarization assistant", the older turns quoted as text),
then the next request carries the summary as its first user message in place of the older turns,
and keeps the recent ones verbatim: sometimes only the last answer. The messages before that echoed
answer were then never in its prompt, so inference used to start a new session there. A message
that quotes the conversation (`serve/sessions.py`: its answers or what its user typed, start of the
text, headings and spacing aside) now counts as coming from it, and a side request that echoes
nothing joins the recent session it quotes.

The store-level tests use a made-up agent (nothing OpenClaw-specific); the replay sends what
OpenClaw really sent around two recorded compactions (tests/data/openclaw_compaction.json) to a
real server, with the server's own answers put where OpenClaw echoed and quoted the recorded ones.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from clawrl.messages import content_text, user_typed
from clawrl.serve.sessions import resolve_session
from clawrl.store import Store
from tests.helpers import record, start_server, user

MODEL = "tiny"
RECORDED = json.loads((Path(__file__).parent / "data" / "openclaw_compaction.json").read_text())
SYSTEM = {"role": "system", "content": "You are a coding agent."}
ANSWERS = [
    "Here is the note: the team meets on Friday at ten in room B.",
    "Shorter: Friday, ten o'clock, room B, please be on time.",
    "Lyon in a day: Fourviere in the morning, lunch at a bouchon, the old town after.",
]
QUESTIONS = ["Write a note to my team about Friday.", "no, please keep it to one sentence", "now plan a day in Lyon"]


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def three_turns(store: Store) -> list[dict[str, Any]]:
    """Records a three-turn conversation (session s1, turns t1-t3) as serving would; returns its history."""
    history: list[dict[str, Any]] = []
    for index, (question, answer) in enumerate(zip(QUESTIONS, ANSWERS, strict=True), 1):
        history.append(user(question))
        record(store, f"t{index}", "s1", [SYSTEM, *history], answer)
        history.append(assistant(answer))
    return history


def summary(*quoted: str) -> dict[str, Any]:
    lines = "\n".join(f"- {text}" for text in quoted)
    return user(f"Summary of the conversation so far:\n## Progress\n{lines}\n## Next\nContinue.")


# --------------------------------------------------------------------------- inference on a store


def test_a_summary_that_quotes_the_conversation_stands_in_for_the_turns_it_replaced(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    three_turns(store)
    follow_up = user("and what about dinner?")
    compacted = [SYSTEM, summary(QUESTIONS[0], ANSWERS[0], ANSWERS[1][:30] + "..."), assistant(ANSWERS[2]), follow_up]
    identity = resolve_session(store, None, compacted, "main")
    assert (identity.session_id, identity.id_source, identity.continues_turn_id) == ("s1", "inferred", "t3")
    assert identity.next_state == [follow_up]
    # Headings demoted, lines re-wrapped: still a quote.
    rewrapped = user("### Earlier\n" + ANSWERS[0].replace(" the team ", "\nthe   team\n"))
    assert resolve_session(store, None, [SYSTEM, rewrapped, assistant(ANSWERS[2]), follow_up], "main").continues_turn_id == "t3"


def test_a_message_that_quotes_nothing_of_the_conversation_is_still_no_continuation(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    three_turns(store)
    for unrelated in (summary("The user asked about something else entirely."), summary("ok", "thanks")):  # too short to tell
        request = [SYSTEM, unrelated, assistant(ANSWERS[2]), user("and what about dinner?")]
        assert resolve_session(store, None, request, "main").id_source == "new"


def test_a_summarizer_that_echoes_nothing_joins_the_session_it_quotes(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    history = three_turns(store)
    record(store, "t-other", "s2", [SYSTEM, user("What is the capital of Peru, and why?")], "Lima, since colonial times.")
    quoted = "\n".join(f"[{m['role'].title()}]: {m['content']}" for m in history)
    summarizer = [{"role": "system", "content": "Summarize this conversation."}, user(f"<conversation>\n{quoted}\n</conversation>")]
    identity = resolve_session(store, None, summarizer, "side")
    assert (identity.session_id, identity.id_source, identity.continues_turn_id, identity.next_state) == ("s1", "inferred", None, None)
    # Only a side request is placed by what it quotes: a new conversation that pastes an answer is new.
    pasted = [SYSTEM, user(f"Translate this into French: {ANSWERS[2]}")]
    assert resolve_session(store, None, pasted, "main").id_source == "new"
    assert resolve_session(store, None, [SYSTEM, user("Summarize: nothing we said.")], "side").id_source == "new"


# --------------------------------------------------------------------------- OpenClaw's compactions, replayed

TYPED = {
    "kept_last_answer": ["Write a short note to my team about Friday.", "no, please keep it to one sentence",
                         "thanks, now plan a day in Lyon", "and what about dinner?", "perfect, thanks"],
    "kept_turns": ["Write a short note to my team about Friday.", "no, please keep it to one sentence",
                   "thanks, now plan a day in Lyon", "and what about dinner?"],
}  # fmt: skip
PLACEHOLDER = re.compile(r"\{\{(answer|quote|nested) (\d+)\}\}")


def openclaw_quote(answer: str) -> str:
    """An answer as OpenClaw's summary keeps a recent turn verbatim: stripped, cut to 600 characters."""
    text = answer.strip()
    return text[:600] + "..." if len(text) > 600 else text


def rendered(body: dict[str, Any], answers: dict[int, str]) -> dict[str, Any]:
    """A recorded body with the server's own answers where OpenClaw echoed and quoted the recorded ones."""

    def fill(text: str) -> str:
        def one(match: re.Match[str]) -> str:
            how, answer = match[1], answers[int(match[2])]
            if how == "answer":
                return answer
            return openclaw_quote(answer) if how == "quote" else re.sub(r"^##(?=[ \t]+\S)", "###", answer, flags=re.MULTILINE)

        return PLACEHOLDER.sub(one, text)

    body = copy.deepcopy(body)
    for message in body["messages"]:
        if isinstance(message["content"], str):
            message["content"] = fill(message["content"])
        else:
            for part in message["content"]:
                part["text"] = fill(part["text"])
    return body


def replay(http: httpx.Client, requests: list[dict[str, Any]]) -> list[httpx.Response]:
    answers: dict[int, str] = {}
    responses = []
    for index, request in enumerate(requests, 1):
        body = {key: value for key, value in rendered(request["body"], answers).items() if key != "stream_options"}
        response = http.post("/chat/completions", json=body | {"stream": False, "seed": index})  # recorded streamed
        assert response.status_code == 200, response.text
        answers[index] = response.json()["choices"][0]["message"]["content"] or ""
        responses.append(response)
    return responses


@pytest.mark.parametrize("name", ["kept_last_answer", "kept_turns"])
def test_openclaws_compactions_replayed_stay_one_session(tiny_model_dir: Path, run_dir: Path, name: str) -> None:
    """Each recorded conversation is one session across its compactions: every main turn continues
    the one before it with the user's next message, the flushes and summaries are its side turns."""
    requests = RECORDED[name]
    with (
        start_server(tiny_model_dir, run_dir, served_model_name=MODEL) as server,
        httpx.Client(base_url=server.base_url, timeout=120) as http,
    ):
        responses = replay(http, requests)
    kinds = [response.headers["x-clawrl-turn-kind"] for response in responses]
    assert kinds == ["main" if request["request"] == "main" else "side" for request in requests]
    assert len({response.headers["x-clawrl-session"] for response in responses}) == 1, [r.headers["x-clawrl-session"] for r in responses]

    store = Store.for_run_dir(run_dir)
    turns = store.turns.session_turns(responses[0].headers["x-clawrl-session"])
    assert [entry.turn.id for entry in turns] == [response.headers["x-clawrl-turn"] for response in responses]
    mains = [entry for entry in turns if entry.turn.kind == "main"]
    for earlier, later in zip(mains, mains[1:]):
        # The next state is what the next main request added after the echoed answer: the user's
        # timestamped message and OpenClaw's context block, also right after a compaction.
        assert earlier.next_state is not None and earlier.next_state.source_turn_id == later.turn.id
        assert earlier.next_state.messages == later.turn.messages[-2:]
        assert "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>" in content_text(later.turn.messages[-1]["content"])
    assert mains[-1].next_state is None
    assert all(entry.next_state is None for entry in turns if entry.turn.kind == "side")
    # The main turns in the order the user spoke, each asking what the user typed then.
    assert [user_typed(entry.turn.messages[-2]) for entry in mains] == TYPED[name]
