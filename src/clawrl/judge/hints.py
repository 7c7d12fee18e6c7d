"""The teacher prompt: the student's messages with a hindsight hint attached (DESIGN §5, §6).

One function, shared by the hint judge (overlap-guided selection scores candidate hints under
this prompt), the trainer (OPD teacher log-probs are forced-decoding log-probs under this prompt)
and the tiny model's pre-training corpus (which teaches the model to follow a hint written this
way). All three must agree on the exact format, or the teacher would be a different prompt from
the one the judge chose the hint for.
"""

from __future__ import annotations

import copy
from typing import Any

from clawrl.engines.chat import content_text

HINT_MARKER = "[Hint]"


def hint_suffix(hint: str) -> str:
    """What is appended to the last user message: a blank line, the marker, the hint."""
    return f"\n\n{HINT_MARKER} {hint.strip()}"


def teacher_messages(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """A copy of `messages` whose last user message ends with the hint.

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
