"""What the user typed: agents' wrappings around a user's words change no verdict and no hint.

The rule judge reads only the user-authored text (`messages.user_typed`); these tests wrap the
same request and reply the ways real agents do and expect the verdicts and hints of the bare text.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from clawrl.judge.rule import judge_by_rules
from clawrl.messages import user_typed

REQUEST = "Summarise this article about the river in three sentences."
REPLIES = [
    "thanks, perfect",  # +1
    "this looks too AI-like, rewrite it without the bold and the numbered list",  # -1 with a hint
    "ok, now do the same for the bridge article.",  # moving on: +1
    "Summarise this article about the river in three short sentences.",  # a restatement: -1
    "Who wrote the article?",  # a question about it, nothing to go on: 0
]


def openclaw(text: str) -> str:
    return (f"[Tue 2026-11-24 09:05 UTC] {text}\n\n<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\n"
            "Active exec sessions: none\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>")


def reminder(text: str) -> str:
    return f"<system-reminder>\nThe user prefers concise answers. Today is Tuesday.\n</system-reminder>\n{text}"


def memory(text: str) -> str:
    return f"<memory>\n- lives in Lyon\n- writes in English\n</memory>\n\n{text}"


def boilerplate(text: str) -> str:
    """A shape no rule knows: lines an agent repeats identically in every user message."""
    return f"Open files: notes.md, todo.md\nBranch: main (clean)\n{text}\nReply in the user's language."


WRAPPINGS: dict[str, Callable[[str], str]] = {"openclaw": openclaw, "reminder": reminder, "memory": memory,
                                               "boilerplate": boilerplate}


def verdict(wrap: Callable[[str], str], reply: str) -> tuple[int, str | None]:
    request = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": wrap(REQUEST)}]
    return judge_by_rules(request, [{"role": "user", "content": wrap(reply)}])


@pytest.mark.parametrize("wrapping", WRAPPINGS)
@pytest.mark.parametrize("reply", REPLIES)
def test_a_wrapped_reply_gets_the_bare_replys_verdict_and_hint(wrapping: str, reply: str) -> None:
    bare = verdict(lambda text: text, reply)
    assert verdict(WRAPPINGS[wrapping], reply) == bare


def test_the_bare_verdicts_are_the_ones_the_rules_promise() -> None:
    scores = [verdict(lambda text: text, reply)[0] for reply in REPLIES]
    assert scores == [1, -1, 1, -1, 0]
    assert verdict(lambda text: text, REPLIES[1])[1] == ["Rewrite it without the bold and the numbered list."]


def test_known_wrappings_come_off_without_a_previous_message() -> None:
    assert user_typed({"role": "user", "content": openclaw("thanks, perfect")}) == "thanks, perfect"
    parts = [{"type": "text", "text": "[Mon 2026-11-23 15:45 UTC] thanks"}, {"type": "text", "text": "that works"}]
    assert user_typed({"role": "user", "content": parts}) == "thanks\nthat works"


def test_a_message_repeated_word_for_word_is_kept_whole() -> None:
    """Boilerplate is what the previous message shares with this one, unless it is all of it:
    the user asking the same thing again is what a restatement check must see."""
    asked = {"role": "user", "content": boilerplate(REQUEST)}
    assert user_typed(asked, asked) == boilerplate(REQUEST)
    assert user_typed({"role": "user", "content": boilerplate("ok")}, asked) == "ok"
    assert judge_by_rules([asked], [asked]) == (-1, [])


def test_openclaws_runtime_line_under_a_sessions_first_message_comes_off() -> None:
    first = ("[Mon 2026-11-23 19:02 UTC] Write a short note to my team about Friday.\n\nRuntime: agent=main | "
             "session=agent:main:explicit:conv-a | sessionId=conv-a | host=vm | os=Linux (x64) | shell=bash")
    assert user_typed({"role": "user", "content": first}) == "Write a short note to my team about Friday."
    assert user_typed({"role": "user", "content": "Runtime: agent=main is what the log says"}) != ""  # not that line


def test_a_context_block_sent_as_a_message_of_its_own_is_neither_request_nor_reply() -> None:
    """OpenClaw sends its context block as a separate user message after the user's: the request
    the reply restates is the one before it, and the verdicts are the bare ones."""
    context = {"role": "user", "content": [{"type": "text", "text": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\n"
                                                                    "Active exec sessions: none\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"}]}
    request = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": openclaw(REQUEST)}, context]
    for reply, bare in zip(REPLIES, [1, -1, 1, -1, 0], strict=True):
        stamped = {"role": "user", "content": f"[Tue 2026-11-24 09:06 UTC] {reply}"}
        assert judge_by_rules(request, [stamped, context])[0] == bare, reply


@pytest.mark.parametrize(
    ("sent", "typed"),
    [
        ("New task:\nno, make it rhyme", "no, make it rhyme"),
        ("Observation:\nSteam curls from the cup.\nNew task:\nno, make it rhyme", "no, make it rhyme"),
        ("Error:\nReached max steps.\nNew task:\nthanks, that's perfect", "thanks, that's perfect"),
        ("New task:\nfirst\nNew task:\nsecond, on two\nlines", "second, on two\nlines"),
        # not smolagents' framing: the words "New task:" inside a line are the user's own
        ("My list has a line called New task:\nbuy milk", "My list has a line called New task:\nbuy milk"),
    ],
)
def test_smolagents_new_task_framing_comes_off(sent: str, typed: str) -> None:
    assert user_typed({"role": "user", "content": sent}) == typed
