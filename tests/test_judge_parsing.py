"""Parsing judge outputs: boxed scores, delimited hints, majority votes, and the prompts' shape."""

from __future__ import annotations

import pytest

from clawrl.judge.parsing import HINT_END, HINT_START, majority, parse_hint, parse_prm_score, prm_verdict
from clawrl.judge.prompts import hint_messages, prm_messages


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The user thanked the assistant.\n\\boxed{1}", 1),
        ("Moved on.\n\\boxed{+1}", 1),
        ("A correction.\n\\boxed{ -1 }", -1),
        ("No signal either way: \\boxed{0}", 0),
        ("At first I thought \\boxed{1}, but the tool failed, so \\boxed{-1}", -1),
        ("I considered \\boxed{-1}; on reflection \\boxed{1}", 1),
    ],
)
def test_score_is_the_last_box(text: str, expected: int) -> None:
    assert parse_prm_score(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "The response was good. Score: 1",
        "\\boxed{2}",
        "\\boxed{positive}",
        "\\boxed{}",
        "\\boxed{1/2}",
        "looked fine \\boxed{1} but I cannot decide \\boxed{maybe}",
    ],
)
def test_anything_else_is_an_invalid_vote(text: str) -> None:
    assert parse_prm_score(text) is None


@pytest.mark.parametrize(
    ("votes", "expected"),
    [
        ([1], 1),
        ([1, 1, -1], 1),
        ([-1, None, -1], -1),
        ([0, 0, 1], 0),
        ([1, -1], 0),
        ([1, -1, 0], 0),
        ([1, None, -1], 0),
        ([None, None, None], 0),
        ([], 0),
    ],
)
def test_majority_of_valid_votes_with_ties_and_no_valid_vote_at_zero(votes: list[int | None], expected: int) -> None:
    assert majority(votes) == expected


def test_verdict_keeps_every_vote_and_a_rationale_that_explains_the_score() -> None:
    outputs = ["Tool failed. \\boxed{-1}", "garbage", "User corrected it. \\boxed{-1}", "Fine. \\boxed{1}"]
    verdict = prm_verdict(outputs)
    assert verdict.score == -1
    assert verdict.votes == [-1, None, -1, 1]
    assert verdict.rationale == outputs[0]
    assert verdict.invalid_votes == 1
    assert verdict.agreement == 0.5


def test_tied_verdict_is_zero_and_still_has_a_rationale() -> None:
    verdict = prm_verdict(["Good. \\boxed{1}", "Bad. \\boxed{-1}"])
    assert (verdict.score, verdict.rationale, verdict.agreement) == (0, "Good. \\boxed{1}", 0.0)


def test_hint_is_the_stripped_text_between_the_delimiters() -> None:
    hint = "\n  Answer without bold or numbered lists.  \n"
    text = f"The user wants plain text.\n\\boxed{{1}}\n{HINT_START}{hint}{HINT_END}"
    assert parse_hint(text) == "Answer without bold or numbered lists."


def test_hint_with_a_negative_verdict_is_none() -> None:
    assert parse_hint(f"\\boxed{{-1}} {HINT_START}Answer without bold or numbered lists.{HINT_END}") is None


def test_a_hint_of_eleven_characters_counts() -> None:
    assert parse_hint(f"\\boxed{{1}} {HINT_START}Be concise.{HINT_END}") == "Be concise."


@pytest.mark.parametrize(
    "text",
    [
        f"\\boxed{{1}} {HINT_START}Be terse{HINT_END}",  # 8 characters: no direction to learn from
        "\\boxed{1} Answer without bold or numbered lists.",  # delimiters missing
        f"{HINT_START}Answer without bold or numbered lists.{HINT_END}",  # no verdict: the judge did not stand by it
        f"\\boxed{{0}} {HINT_START}Answer without bold or numbered lists.{HINT_END}",  # not a positive verdict
        f"\\boxed{{1}} {HINT_START}Be concise{HINT_END}",  # exactly 10 characters: a hint needs more
        f"\\boxed{{1}} {HINT_START}Answer without bold or numbered lists.",  # never closed
        "\\boxed{-1}",
    ],
)
def test_unusable_hints_are_none(text: str) -> None:
    assert parse_hint(text) is None


def test_prompts_show_the_response_with_its_tool_calls_and_the_next_state_with_roles() -> None:
    function = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    calls = [{"id": "call_1", "type": "function", "function": function}]
    next_state = [{"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'}]
    for build, answer_format in ((prm_messages, "\\boxed{0}"), (hint_messages, HINT_START)):
        system, user = build("Let me check.", calls, next_state)
        assert (system["role"], user["role"]) == ("system", "user")
        assert answer_format in system["content"]
        assert 'get_weather({"city": "Paris"}) (id call_1)' in user["content"]
        assert '<message role="tool" tool_call_id="call_1">\n{"temperature": 21}' in user["content"]


def test_prompt_renders_list_content_and_an_answer_with_no_text() -> None:
    next_state = [{"role": "user", "content": [{"type": "text", "text": "no, the other file"}]}]
    user = prm_messages("", [], next_state)[1]["content"]
    assert "(no text)" in user
    assert '<message role="user">\nno, the other file\n</message>' in user


def test_prompts_mark_what_the_user_typed_inside_an_agents_wrapping() -> None:
    """Language-model judges see the whole message, and a section saying which part the user typed."""
    def wrapped(text: str) -> str:
        return (f"[Mon 2026-11-23 15:45 UTC] {text}\n\n<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\n"
                "Active exec sessions: none\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>")

    request = [{"role": "user", "content": wrapped("summarise the article")}]
    next_state = [{"role": "user", "content": wrapped("thanks, perfect")}]
    for build in (prm_messages, hint_messages):
        system, case = (message["content"] for message in build("A summary.", None, next_state, request))
        assert "<typed_by_user>" in system
        assert wrapped("thanks, perfect") in case  # the whole message, as the agent sent it
        assert "<typed_by_user>\nthanks, perfect\n</typed_by_user>" in case


def test_prompts_leave_out_boilerplate_the_request_shares_and_plain_messages_unmarked() -> None:
    request = [{"role": "user", "content": "Branch: main (clean)\nsummarise the article"}]
    next_state = [{"role": "user", "content": "Branch: main (clean)\nshorter please"}]
    case = prm_messages("A summary.", None, next_state, request)[1]["content"]
    assert "<typed_by_user>\nshorter please\n</typed_by_user>" in case
    plain = prm_messages("A summary.", None, [{"role": "user", "content": "shorter please"}], request)[1]["content"]
    assert "<typed_by_user>" not in plain
