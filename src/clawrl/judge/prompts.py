"""Our own prompts for the two judges (DESIGN §5): the PRM (evaluative) and the hint judge (directive).

Both judges see the same case: the assistant's response, tool calls included, and the next state
(what came right after it: the user's reply or the tools' results), each message with its role.
The role matters: a user saying "error" is a complaint, a tool saying it is a failed call.
Parts of the case are wrapped in tags so that markdown or quotes inside them cannot be confused
with the instructions.

User messages are shown whole, as the agent sent them, because the wrapping an agent adds (a
timestamp, a context block, a memory section) can matter to the judge; where the wrapping is
there, a `<typed_by_user>` section repeats what the user typed (`messages.user_typed`), so the
judge reads the reaction from the user's own words, not from lines the agent repeats every turn.
"""

from __future__ import annotations

import json
from typing import Any

from clawrl.judge.parsing import HINT_END, HINT_START
from clawrl.messages import content_text, user_typed
from clawrl.types import Message

_WRAPPING_NOTE = """\
A user message may carry text that the user's agent software added around what the user typed: \
a timestamp, context blocks, memory or reminder sections, lines repeated in every message. When \
a user message has a <typed_by_user> section, that section is exactly what the user typed: judge \
the user's reaction by it and read the rest only as background."""

PRM_SYSTEM = f"""\
You review one step of a conversation between a user and an AI assistant. You are shown the \
assistant's response and the next state: whatever came right after it, either the user's next \
message or the output of the tools the assistant called. Use the next state as evidence of how \
well the response worked.

Score the response:
-1 if the next state shows it fell short: the user corrects it, asks for a redo or a change, \
repeats or rephrases the request they had already made, or is unhappy with it; or a tool call \
failed or the environment reported an error.
+1 if the next state shows it worked: the user thanks the assistant, approves, or moves on to \
something new; or a tool call returned a successful result.
0 if the next state says nothing either way.

{_WRAPPING_NOTE}

Explain your reasoning in a few sentences, then end with the score alone in a box on the last \
line: \\boxed{{1}}, \\boxed{{-1}} or \\boxed{{0}}."""

HINT_SYSTEM = f"""\
You help an AI assistant learn from hindsight. You are shown one of its responses and the next \
state: whatever came right after it, either the user's next message or the output of the tools \
it called. Decide whether the next state tells how the response should have been different: a \
correction, a stated preference, a missing requirement, an error that points at the fix.

If it does, write \\boxed{{1}} and then a hint: one to three short, concrete sentences telling \
the assistant what to do, written as advice it could have been given before it answered (for \
example: "Answer in plain prose, without headings or bullet points."). Put the hint between \
{HINT_START} and {HINT_END}.

If it does not (the user is satisfied, moves on, or gives no direction), write only \\boxed{{-1}}.

{_WRAPPING_NOTE}"""


def prm_messages(
    response_text: str,
    tool_calls: list[dict[str, Any]] | None,
    next_state_messages: list[Message],
    request_messages: list[Message] | None = None,
) -> list[dict[str, Any]]:
    """Chat messages asking the PRM for reasoning and a boxed score in {1, -1, 0}.

    `request_messages` (the turn's own messages) tell which lines of the user's reply are the
    agent's boilerplate: those the request's last user message carries too.
    """
    return _judge_messages(PRM_SYSTEM, response_text, tool_calls, next_state_messages, request_messages)


def hint_messages(
    response_text: str,
    tool_calls: list[dict[str, Any]] | None,
    next_state_messages: list[Message],
    request_messages: list[Message] | None = None,
) -> list[dict[str, Any]]:
    """Chat messages asking the hint judge for \\boxed{1} and a delimited hint, or \\boxed{-1}."""
    return _judge_messages(HINT_SYSTEM, response_text, tool_calls, next_state_messages, request_messages)


def _judge_messages(
    system: str,
    response_text: str,
    tool_calls: list[dict[str, Any]] | None,
    next_state_messages: list[Message],
    request_messages: list[Message] | None,
) -> list[dict[str, Any]]:
    next_state = render_next_state(next_state_messages, request_messages)
    case = f"{render_response(response_text, tool_calls)}\n\n{next_state}"
    return [{"role": "system", "content": system}, {"role": "user", "content": case}]


def render_response(response_text: str, tool_calls: list[dict[str, Any]] | None) -> str:
    """The assistant's response as the judge reads it: its text, then one line per tool call."""
    parts = [response_text.strip() or "(no text)"]
    parts += [f"[tool call] {_render_call(call)}" for call in tool_calls or []]
    body = "\n".join(parts)
    return f"<assistant_response>\n{body}\n</assistant_response>"


def render_next_state(messages: list[Message], request_messages: list[Message] | None = None) -> str:
    """The next state as the judge reads it: each message under its role (and tool call id)."""
    previous_user = next((m for m in reversed(request_messages or []) if m["role"] == "user"), None)
    rendered = []
    for message in messages:
        rendered.append(_render_message(message, previous_user))
        if message["role"] == "user":
            previous_user = message
    body = "\n".join(rendered) or "(nothing)"
    return f"<next_state>\n{body}\n</next_state>"


def _render_message(message: Message, previous_user: Message | None) -> str:
    role = message["role"]
    call_id = message.get("tool_call_id")
    attributes = f'role="{role}"' + (f' tool_call_id="{call_id}"' if call_id else "")
    text = content_text(message.get("content")).strip()
    lines = [text]
    lines += [f"[tool call] {_render_call(call)}" for call in message.get("tool_calls") or []]
    if role == "user" and (typed := user_typed(message, previous_user)) != text:
        lines.append(f"<typed_by_user>\n{typed or '(nothing)'}\n</typed_by_user>")
    body = "\n".join(line for line in lines if line) or "(empty)"
    return f"<message {attributes}>\n{body}\n</message>"


def _render_call(call: dict[str, Any]) -> str:
    """`name(arguments)` with the id, so the judge can match results to calls."""
    function = call["function"]
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {})
    suffix = f" (id {call['id']})" if call.get("id") else ""
    return f"{function['name']}({arguments}){suffix}"
