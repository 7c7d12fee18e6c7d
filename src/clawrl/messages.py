"""Chat messages as the loops compare and extend them: text, identity, and the teacher prompt.

Ground floor, like `types.py`: serving matches a client's echoed answer to a recorded turn by
these identities, the store and the dashboard read message text through `content_text`, and the
judge, the trainer and the tiny model's pre-training corpus all build the hinted teacher prompt
with `teacher_messages`, so the three agree on its exact format.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import re
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


# Deeper tool-call arguments stay a string: chat templates and hashing recurse through the value
# (a request's own JSON is held to the same depth when it is read, jsonbody.py)
MAX_ARGUMENTS_DEPTH = 64


def canonical_arguments(arguments: Any) -> Any:
    """Tool-call arguments as a JSON value: clients re-serialise the string we sent them.

    A string that is not JSON, or is JSON nested more than MAX_ARGUMENTS_DEPTH levels deep, stays
    the string: "[[[...]]]" a few hundred levels deep overflowed the template's recursion, a
    thousand levels the parser's (a 500 either way). So does one holding an integer over Python's
    4,300-digit conversion limit, which json.loads refuses with a plain ValueError (issue 26).
    """
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):  # ValueError: JSONDecodeError, or an integer too long to convert
            return arguments
        return arguments if _deeper_than(value, MAX_ARGUMENTS_DEPTH) else value
    return arguments


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether JSON `value` nests objects and arrays more than `limit` levels deep (no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


# --- what the user typed (DESIGN §5) -------------------------------------------------------------

# Agents wrap what the user typed before they send it. OpenClaw puts a timestamp in front
# ("[Mon 2026-11-23 15:45 UTC] thanks, perfect"), adds a "Runtime: agent=... | ..." line to a
# session's first message and sends an internal context block; other agents add reminder or
# memory sections. Rules that read the user's words must not read those.
_TIMESTAMP_PREFIX = re.compile(
    r"^\s*\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d{4}-\d{2}-\d{2} \d{1,2}:\d{2}(?::\d{2})?(?: [A-Z][A-Za-z+\-:0-9]{0,9})?\]\s*"
)
_WRAPPER_BLOCKS = re.compile(
    r"<<<BEGIN_(?P<marker>[A-Z0-9_]+)>>>.*?<<<END_(?P=marker)>>>"  # OpenClaw's internal context
    # reminder and memory sections (Claude Code's reminders; Codex's working directory, shell, date, sandbox)
    r"|<(?P<tag>system-reminder|memory|context|environment_context)>.*?</(?P=tag)>"
    # Codex's project instructions: "# AGENTS.md instructions for DIR" and the file in <INSTRUCTIONS>
    r"|^# AGENTS\.md instructions\b[^\n]*\n+<INSTRUCTIONS>.*?</INSTRUCTIONS>"
    # OpenClaw's line under a session's first message: "Runtime: agent=main | session=... | shell=bash"
    r"|^Runtime: agent=[^\n]*\|[^\n]*$",
    re.DOTALL | re.MULTILINE,
)


# smolagents sends the user's words as "New task:\n<words>" at the end of a user message, after what
# its agent put there (the last tool's "Observation:\n...", an "Error:\n..."): the words are what
# follows the last such line.
_SMOLAGENTS_TASK = re.compile(r"(?:\A|\n)New task:\n(?P<words>(?:(?!\nNew task:\n).)*)\Z", re.DOTALL)


# What an agent sends in the user's place when an answer showed the user nothing (the model
# stopped at once, or wrote only reasoning or only tool calls): OpenClaw asks again with "The
# previous attempt did not produce a user-visible answer. Continue from ..." (three variants). It
# says the answer failed; its words are the agent's instructions, not the user's, so no judge may
# read them as a correction to learn from.
_AGENT_RETRY_NOTE = re.compile(
    r"^The previous (?:attempt|assistant turn)\b[^\n]{0,120}?\bdid not produce a user-visible answer\b", re.IGNORECASE
)
# smolagents, after a step that failed (no tool call parsed, no code block, a tool that raised) or a run
# that reached max_steps, puts in the user's place "Error:\n<what failed>\nNow let's retry: take care
# not to repeat previous errors! ...", and after max_steps asks for an answer outright ("Based on the
# above, please provide an answer to the following user task:\n<the task again>"). A message that
# opens so and holds no "New task:" line (that would be the user's next words) is the agent's.
_SMOLAGENTS_STEP_ERROR = re.compile(r"\AError:\n.*^Now let's retry: take care not to repeat previous errors!", re.DOTALL | re.MULTILINE)


def is_agent_retry_note(text: str) -> bool:
    """Is `text` (as `user_typed` leaves it) an agent's note that the previous answer failed: it showed
    the user nothing (OpenClaw), or the agent could not use it (smolagents' "Error: ... Now let's retry")?"""
    text = text.strip()
    return bool(_AGENT_RETRY_NOTE.match(text) or _SMOLAGENTS_STEP_ERROR.match(text))


def user_typed(message: Message, previous: Message | None = None) -> str:
    """The text the user authored in `message`, without the wrapping their agent added.

    Known wrappings (a timestamp prefix, context, reminder and memory blocks, smolagents' "New
    task:" framing) are removed; for
    shapes not known here, lines that `previous` (the session's previous user message) carries
    identically are left out as boilerplate, unless that would leave nothing: a message repeated
    word for word is a restatement, which judges must see.
    """
    text = _unwrapped(content_text(message.get("content")))
    if previous is None:
        return text
    boilerplate = {line.strip() for line in _unwrapped(content_text(previous.get("content"))).splitlines() if line.strip()}
    kept = [line for line in text.splitlines() if line.strip() not in boilerplate]
    own = "\n".join(kept).strip()
    return own or text


def _unwrapped(text: str) -> str:
    text = _TIMESTAMP_PREFIX.sub("", _WRAPPER_BLOCKS.sub("", text), count=1).strip()
    task = _SMOLAGENTS_TASK.search(text)
    return task.group("words").strip() if task else text


# --- identity: how a later request is matched to the turn it continues -------------------------


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _calls_key(tool_calls: list[dict[str, Any]] | None) -> list[list[Any]]:
    return [
        [call["function"]["name"], canonical_arguments(call["function"].get("arguments", "{}"))]
        for call in tool_calls or []
    ]


# smolagents echoes a tool call it parsed not as `tool_calls` but as the assistant's text: "Calling
# tools:\n" and Python's repr of the calls, their arguments parsed (`[{'id': 'call_..', 'type':
# 'function', 'function': {'name': 'final_answer', 'arguments': {'answer': '...'}}}]`). It merges
# messages of one role, so the answer's own text comes first when it had any, on lines before.
_SMOLAGENTS_CALLS_PREFIX = "Calling tools:\n["
# smolagents' CodeAgent runs the code of an answer itself and keeps that as its own call of this tool
# after the answer's text (with "" as the code of an empty answer): the server answered text only.
_CODE_AGENT_TOOL = "python_interpreter"
# Python's parser holds the GIL and costs about a microsecond per node: a request's echo of "[1,1,1,...]"
# a megabyte long stalled serving for a second. A call's repr is read only when it is at most this long
# and holds at most this many of the characters that open or separate nodes (a few milliseconds' work;
# an answer in prose has a comma every 50 characters or so, so one of about 64K characters still fits).
_CALLS_MAX_CHARS, _CALLS_MAX_STRUCTURE = 65_536, 2_048
_STRUCTURE = ",:[{("


def echoed_answers(content: str, tool_calls: list[dict[str, Any]] | None) -> list[tuple[str, list[dict[str, Any]] | None]]:
    """The answers an assistant message may echo, as (text, tool calls), the likeliest first.

    The message as given, except for one that ends with calls written as text in a known agent's way
    (smolagents' "Calling tools:"): that is the text before them with those calls (a ToolCallingAgent's
    answer), or, for a CodeAgent's own `python_interpreter` call, the text alone (the server answered
    it without calls), so that either is found by the fingerprint of the answer the server gave."""
    start = None if tool_calls else _written_calls_start(content)
    calls = None if start is None else _written_calls(content[start:])
    if start is None or calls is None:
        return [(content, tool_calls)]
    text = content[:start].removesuffix("\n")
    code_agents = len(calls) == 1 and calls[0]["function"]["name"] == _CODE_AGENT_TOOL and isinstance(calls[0]["function"].get("arguments"), str)
    return [(text, None), (text, calls)] if code_agents else [(text, calls)]


def _written_calls_start(content: str) -> int | None:
    """Where the calls written as text at the end of a message begin: its start or a line's."""
    if content.startswith(_SMOLAGENTS_CALLS_PREFIX):
        return 0
    line = content.rfind("\n" + _SMOLAGENTS_CALLS_PREFIX)
    return None if line < 0 else line + 1


def _written_calls(text: str) -> list[dict[str, Any]] | None:
    """Calls written as smolagents writes them ("Calling tools:\n[...]"), or None for other text."""
    if len(text) > _CALLS_MAX_CHARS or sum(map(text.count, _STRUCTURE)) > _CALLS_MAX_STRUCTURE:
        return None
    try:
        calls = ast.literal_eval(text[len(_SMOLAGENTS_CALLS_PREFIX) - 1 :])
        json.dumps(calls)  # a literal of JSON values only (no set, bytes or complex number): fingerprints are JSON
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # text that is no such literal
        return None
    valid = isinstance(calls, list) and calls and all(
        isinstance(call, dict) and isinstance(call.get("function"), dict) and isinstance(call["function"].get("name"), str)
        for call in calls
    )  # fmt: skip
    return calls if valid else None


def answer_fingerprint(content: str, tool_calls: list[dict[str, Any]] | None) -> str | None:
    """Identity of an answer as a client echoes it back: stripped text plus tool calls (ids ignored)."""
    if not content.strip() and not tool_calls:
        return None
    return _digest({"content": content.strip(), "tool_calls": _calls_key(tool_calls)})


def recorded_fingerprint(content: str, tool_calls: list[dict[str, Any]] | None, conversation: list[str]) -> str:
    """What a turn's answer is found by: its `answer_fingerprint`; for an empty answer (the model
    stopped at once), which has no text to be known by, the conversation it answered
    (`conversation_hashes` of the messages before it)."""
    return answer_fingerprint(content, tool_calls) or _digest({"empty_answer_after": conversation})


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


# --- quotes: a message that repeats earlier messages as text (a compaction summary) --------------

# A quoted text must be at least this long (as `quote_text` leaves it) to say which conversation
# it comes from ("ok", "thanks" say nothing), and only its start is looked for: summaries cut long
# messages short (OpenClaw keeps 600 characters of each recent turn, then "...").
QUOTE_MIN_CHARS = 16
QUOTE_HEAD_CHARS = 200
_HEADING_MARKS = re.compile(r"^[ \t]*#{1,6}[ \t]+", re.MULTILINE)


def quote_text(text: str) -> str:
    """`text` as quotes are compared: Markdown heading marks dropped (a summary that embeds another
    demotes its headings) and every run of whitespace one space."""
    return " ".join(_HEADING_MARKS.sub("", text).split())


def quotable_head(text: str) -> str | None:
    """What a quote of `text` must contain: the start of its `quote_text`; None for a text too short to tell."""
    normalized = quote_text(text)
    return normalized[:QUOTE_HEAD_CHARS] if len(normalized) >= QUOTE_MIN_CHARS else None


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
