"""Chat messages as the loops compare and extend them: text, identity, and the teacher prompt.

Ground floor, like `types.py`: serving matches a client's echoed answer to a recorded turn by
these identities, the store and the dashboard read message text through `content_text`, and the
judge, the trainer and the tiny model's pre-training corpus all build the hinted teacher prompt
with `teacher_messages`, so the three agree on its exact format.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from clawrl.types import Message

HINT_MARKER = "[Hint]"


def content_text(content: str | Sequence[Any] | None) -> str:
    """A message's content as one string: text parts joined by newlines, other parts dropped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [part.get("text", "") if isinstance(part, dict) else getattr(part, "text", "") for part in content]
    return "\n".join(part for part in parts if part)


def canonical_arguments(arguments: Any) -> Any:
    """Tool-call arguments as a JSON value: clients re-serialise the string we sent them."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


# --- identity: how a later request is matched to the turn it continues -------------------------


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _calls_key(tool_calls: list[dict[str, Any]] | None) -> list[list[Any]]:
    return [
        [call["function"]["name"], canonical_arguments(call["function"].get("arguments", "{}"))]
        for call in tool_calls or []
    ]


def answer_fingerprint(content: str, tool_calls: list[dict[str, Any]] | None) -> str | None:
    """Identity of an answer as a client echoes it back: stripped text plus tool calls (ids ignored)."""
    if not content.strip() and not tool_calls:
        return None
    return _digest({"content": content.strip(), "tool_calls": _calls_key(tool_calls)})


def message_hash(message: Message) -> str:
    """Identity of one message, tolerant of the re-serialisation clients do."""
    return _digest(
        {
            "role": message["role"],
            "content": content_text(message.get("content")).strip(),
            "tool_calls": _calls_key(message.get("tool_calls")),
            "tool_call_id": message.get("tool_call_id"),
        }
    )[:16]


def conversation_hashes(messages: list[Message]) -> list[str]:
    """What a turn stores so that later requests can be checked against its conversation."""
    return [message_hash(m) for m in messages if m["role"] not in ("system", "developer")]


# --- the teacher prompt (DESIGN §5, §6) ----------------------------------------------------------


def hint_suffix(hint: str) -> str:
    """What is appended to the last user message: a blank line, the marker, the hint."""
    return f"\n\n{HINT_MARKER} {hint.strip()}"


def teacher_messages(messages: list[Message], hint: str) -> list[Message]:
    """A copy of `messages` whose last user message ends with the hint: the OPD teacher's prompt.

    Content given as a list of parts is flattened to its text first, so the hint lands after all
    of it. Without a user message (a conversation of tool results only) the hint becomes a new user
    message at the end, so the teacher still sees it right before the answer.
    """
    hinted = copy.deepcopy(messages)
    for message in reversed(hinted):
        if message.get("role") == "user":
            message["content"] = content_text(message.get("content")) + hint_suffix(hint)
            return hinted
    hinted.append({"role": "user", "content": hint_suffix(hint).lstrip()})
    return hinted
