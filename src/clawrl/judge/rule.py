"""The `rule` judge backend: deterministic keyword rules over the next state (DESIGN §5).

It needs no model, so the CPU demo and the tests can judge turns offline. The rules follow the
PRM rubric: an error in a tool result, or a user who corrects, rejects or repeats, is -1; a user
who thanks, approves or moves on, or a tool that succeeds, is +1; anything else is 0. Negative
signals win over positive ones, because "thanks, but that's wrong" is a correction.

A new question with no negative signal counts as moving on (+1): the user would not leave a
wrong answer behind to ask something else. The rules cannot tell a pointed question ("why is it
so long?") from a new one; that is what the model-backed judges are for.

The hints are the user's directive clauses ("don't ...", "without ...", "use ..."), one candidate
per directive: the parts of the reply that say how the response should have been. As with the
language-model judges' several hint samples, overlap-guided selection (`judge/selection.py`)
then picks the one the teacher can best use.

The rules read only what the user typed (`messages.user_typed`): a timestamp, a context block or
a memory section that the user's agent wrapped around "thanks, perfect" must neither hide the
thanks nor make the reply look like a restatement of the request it shares the wrapping with.
"""

from __future__ import annotations

import json
import re
from typing import Any

from clawrl.judge.parsing import MIN_HINT_CHARS
from clawrl.messages import content_text, user_typed
from clawrl.types import Message

RESTATEMENT_JACCARD = 0.6
MAX_HINTS = 4  # candidates per turn: each costs the selector two scoring passes

_TOOL_ERROR = re.compile(
    r"Traceback \(most recent call last\)|\b\w*(?:error|exception):|\bfatal:|command not found"
    r"|no such file or directory|permission denied|segmentation fault|non-?zero exit",
    re.IGNORECASE,
)
_EXIT_CODE = re.compile(
    r"\b(?:exit(?:ed)?(?:\s+with)?[\s_]?(?:code|status)|return[\s_]?code|returncode)[\"']?\s*[:=]?\s*(-?\d+)",
    re.IGNORECASE,
)
_NEGATIVE = re.compile(
    r"^\s*(?:no|nope|nah)\b(?!\s+(?:problem|worries|thanks))|\bwrong\b|\bincorrect\b|\bre-?write\b|\bre-?do\b"
    r"|\btry again\b|\bthat(?:'s| is|s) not\b|\bnot what i\b|\bi meant\b|\bi said\b|\bnot quite\b"
    r"|\bai-?like\b|\bsounds like (?:an )?ai\b|\b(?:doesn't|does not|didn't|did not) work\b|\bnot working\b"
    r"|\bstill (?:broken|failing|wrong)\b|\byou (?:forgot|missed)\b|\bfix it\b",
    re.IGNORECASE,
)
_POSITIVE = re.compile(
    r"\bthanks?\b|\bthank you\b|\bthx\b|\bperfect\b|\bgreat\b|\bawesome\b|\bexcellent\b|\bnice\b"
    r"|\b(?:that|it) works\b|\bworks now\b|\blooks good\b|\blgtm\b|\bexactly\b|\bdone\b|\bgot it\b"
    r"|\blove it\b|^\s*(?:ok|okay|now|next|also|moving on)\b",
    re.IGNORECASE,
)
_DIRECTIVE = re.compile(
    r"\b(?:don't|do not|never|avoid|stop|without|use|please|you should|rewrite it|make it|keep it|i meant)\b",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")
_WORD = re.compile(r"[a-z0-9']+")


def judge_by_rules(request_messages: list[Message], next_state_messages: list[Message]) -> tuple[int, list[str]]:
    """(score, hint candidates) of the response to `request_messages` that `next_state_messages` followed.

    Both sides are read as the user typed them (`user_typed`): the lines an agent repeats in every
    user message are boilerplate, so the request's last user message and the reply leave out the
    lines they share (and the request, when there is no reply, those it shares with the user
    message before it). A directive inside praise ("thanks! please also add tests") is a new
    request, not a correction, so a +1 carries no hints.
    """
    # Messages with no typed words (an agent's context block sent as a message of its own) are
    # neither the request nor the reply's neighbour.
    asked = [message for message in request_messages if message["role"] == "user" and user_typed(message)]
    replies = [message for message in next_state_messages if message["role"] == "user" and user_typed(message)]
    request = asked[-1] if asked else None
    previous_text = None
    if request is not None:
        neighbour = replies[0] if replies else (asked[-2] if len(asked) > 1 else None)
        previous_text = user_typed(request, neighbour)
    reply = [
        {"role": "user", "content": user_typed(message, request)} if message["role"] == "user" else message
        for message in next_state_messages
    ]
    score = rule_score(reply, previous_user_text=previous_text)
    return score, (rule_hints(reply) if score <= 0 else [])


def rule_score(next_state_messages: list[dict[str, Any]], previous_user_text: str | None = None) -> int:
    """+1, -1 or 0 for the response that `next_state_messages` followed.

    `previous_user_text` is the request the response answered; without it a restatement
    cannot be recognised and is judged on its words alone.
    """
    tool_results = [_text(m) for m in next_state_messages if m["role"] == "tool"]
    if any(_is_tool_error(result) for result in tool_results):
        return -1
    user_text = _user_text(next_state_messages)
    if user_text:
        return _user_score(user_text, previous_user_text)
    return 1 if tool_results else 0


def rule_hints(next_state_messages: list[dict[str, Any]]) -> list[str]:
    """The user's directive clauses, one hint candidate each (more than 10 characters, no repeats).

    In each sentence the directive runs from its first trigger word to the sentence's end, so
    "too AI-like, rewrite it without the bold" gives "Rewrite it without the bold." and a list
    ("don't use bold, italics or lists") stays whole.
    """
    clauses = [_directive(sentence) for sentence in _SENTENCE_END.split(_user_text(next_state_messages))]
    usable = [clause for clause in clauses if clause and len(clause) >= MIN_HINT_CHARS]
    return list(dict.fromkeys(usable))[:MAX_HINTS]


def _user_score(text: str, previous_user_text: str | None) -> int:
    if _NEGATIVE.search(text) or (previous_user_text and _is_restatement(text, previous_user_text)):
        return -1
    if _POSITIVE.search(text) or "?" in text:
        return 1
    return 0


def _is_restatement(text: str, previous: str) -> bool:
    """High word overlap with the previous request: the user is asking for the same thing again."""
    words, previous_words = _words(text), _words(previous)
    union = words | previous_words
    return bool(union) and len(words & previous_words) / len(union) >= RESTATEMENT_JACCARD


def _is_tool_error(result: str) -> bool:
    if _TOOL_ERROR.search(result) or any(int(code) != 0 for code in _EXIT_CODE.findall(result)):
        return True
    return _is_json_failure(result)


def _is_json_failure(result: str) -> bool:
    """A structured result that reports failure: `{"error": ...}`, `{"ok": false}`, `{"status": "error"}`."""
    try:
        value = json.loads(result)
    except json.JSONDecodeError:
        return False
    if not isinstance(value, dict):
        return False
    return (
        bool(value.get("error") or value.get("errors"))
        or value.get("ok") is False
        or value.get("success") is False
        or str(value.get("status", "")).lower() in {"error", "failed", "failure"}
    )


def _directive(sentence: str) -> str | None:
    match = _DIRECTIVE.search(sentence)
    if match is None:
        return None
    clause = sentence[match.start() :].strip().rstrip(".!?;,")
    return clause[0].upper() + clause[1:] + "." if clause else None


def _user_text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(_text(m) for m in messages if m["role"] == "user").strip()


def _text(message: dict[str, Any]) -> str:
    """Content as one string, with typographic apostrophes made plain so "don’t" matches "don't"."""
    return content_text(message.get("content")).replace("\u2019", "'")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))
