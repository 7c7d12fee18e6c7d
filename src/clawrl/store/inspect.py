"""Read-only views of the store for people and tools: session summaries, turn details, JSONL export.

Export rows have the same keys and value types on every line (messages normalised, tool schemas
as a JSON string), so `datasets.load_dataset("json", ...)` can infer one schema for the file. One
user's export (`clawrl users export`, `GET /v1/me/data`) is the same lines, of their sessions only,
followed by their memory notes, one line each with the single key `memory_note` (skip those lines to
load the turns as a dataset).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clawrl.messages import content_text
from clawrl.store.repository import Store
from clawrl.types import Judgment, Message, NextState, Session, TurnContext


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds")


def flat_message(message: Message) -> dict[str, Any]:
    """A message with a fixed set of keys and string content."""
    return {
        "role": message["role"],
        "content": content_text(message.get("content")),
        "tool_calls": [
            {"id": call.get("id"), "name": call["function"]["name"], "arguments": _arguments_text(call["function"].get("arguments"))}
            for call in message.get("tool_calls") or []
        ],
        "tool_call_id": message.get("tool_call_id"),
    }


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {})


def next_state_view(next_state: NextState | None) -> dict[str, Any] | None:
    """The next state as one role and text (the role of what came first), plus the messages."""
    if next_state is None or not next_state.messages:
        return None
    messages = [flat_message(m) for m in next_state.messages]
    return {
        "role": messages[0]["role"],
        "content": "\n".join(m["content"] for m in messages if m["content"]),
        "messages": messages,
    }


def session_summary(session: Session) -> dict[str, Any]:
    return {
        "id": session.id,
        "id_source": session.id_source,
        "user": session.user_id,
        "train": session.train,
        "turns": session.num_turns,
        "done": session.done,
        "done_reason": session.done_reason,
        "created_at": _iso(session.created_at),
        "updated_at": _iso(session.updated_at),
    }


def judgment_view(judgment: Judgment | None) -> dict[str, Any] | None:
    if judgment is None:
        return None
    return {"score": judgment.score, "votes": judgment.votes, "hint": judgment.hint, "source": judgment.source}


def turn_view(context: TurnContext, judgment: Judgment | None = None) -> dict[str, Any]:
    turn, next_state, feedback = context.turn, context.next_state, context.feedback
    return {
        "id": turn.id,
        "index": turn.index,
        "kind": turn.kind,
        "trainable": turn.trainable,
        "opt_out": turn.opt_out,
        "created_at": _iso(turn.created_at),
        "policy_version": turn.policy_version,
        "finish_reason": turn.finish_reason,
        "response_text": turn.response_text,
        "tool_calls": turn.tool_calls,
        "prompt_token_ids": turn.prompt_token_ids,
        "response_token_ids": turn.response_token_ids,
        "response_logprobs": turn.response_logprobs,
        "next_state": next_state_view(next_state),
        "judgment": judgment_view(judgment),
        "feedback": [{"score": f.score, "text": f.text, "created_at": _iso(f.created_at)} for f in feedback],
    }


def session_detail(store: Store, session_id: str) -> dict[str, Any] | None:
    session = store.turns.session(session_id)
    if session is None:
        return None
    entries = store.turns.session_turns(session_id)
    judgments = store.judging.judgments_for([entry.turn.id for entry in entries])
    turns = [turn_view(entry, judgments.get(entry.turn.id)) for entry in entries]
    return {**session_summary(session), "turns": turns}


def export_jsonl(store: Store, out: Path, user_id: str | None = None) -> int:
    """Write one line per main turn (of `user_id`'s sessions, or of everyone's), in arrival order;
    returns the number of lines. A file it creates is its owner's alone (0600), as the store's is:
    it holds the same conversations, in clear even where the store is encrypted; one that exists
    keeps its mode."""
    out.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with os.fdopen(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as handle:
        for line in export_lines(store, user_id):
            handle.write(line)
            count += 1
    return count


def export_lines(store: Store, user_id: str | None = None) -> Iterator[str]:
    """The lines of `export_jsonl`, each a JSON object and a newline, read from the store as they are taken."""
    for turn, next_state in store.turns.iter_main_turns(user_id=user_id):
        view = next_state_view(next_state)
        row = {
            "turn_id": turn.id,
            "session_id": turn.session_id,
            "index": turn.index,
            "policy_version": turn.policy_version,
            "created_at": _iso(turn.created_at),
            "model": turn.model,
            "messages": [flat_message(m) for m in turn.messages],
            "tools_json": json.dumps(turn.tools) if turn.tools else None,
            "prompt_token_ids": turn.prompt_token_ids,
            "response_token_ids": turn.response_token_ids,
            "response_logprobs": turn.response_logprobs,
            "response_text": turn.response_text,
            "finish_reason": turn.finish_reason,
            "next_state_role": view["role"] if view else None,
            "next_state": view["messages"] if view else [],
            "opt_out": turn.opt_out,  # why it is never trained on (null: it may be): a dataset made of it honours that
            "memory_note_ids": turn.memory_note_ids,  # the notes rendered into prompt_token_ids (--memory on)
        }
        yield json.dumps(row, ensure_ascii=False) + "\n"
    if user_id is not None:
        yield from note_lines(store, user_id)


def note_lines(store: Store, user_id: str) -> Iterator[str]:
    """A user's memory notes as the last lines of their export, one `{"memory_note": {...}}` each: a user's
    export is all of their records, and the notes are theirs (everyone's export, a dataset of turns, has none)."""
    for note in store.memory.notes(user_id):
        view = {"id": note.id, "text": note.text, "source": note.source, "turn_id": note.turn_id,
                "created_at": _iso(note.created_at), "updated_at": _iso(note.updated_at),
                "retired_at": _iso(note.retired_at) if note.retired_at is not None else None}  # fmt: skip
        yield json.dumps({"memory_note": view}, ensure_ascii=False) + "\n"
