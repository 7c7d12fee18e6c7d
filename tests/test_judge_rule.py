"""The `rule` judge backend on realistic next states (issue 3; the offline judge since issue 27).

Decision under test: moving on with a word of acknowledgement ("now write a test") scores +1; a
bare question, about the answer or about something else, scores 0, as the labelled corpus's
careful readers scored it ("Totally random but what's the capital of Australia?" is 0 there).
"""

from __future__ import annotations

import json

import pytest

from clawrl.judge.rule import judge_by_rules, rule_hints, rule_score

TRACEBACK = """Traceback (most recent call last):
  File "/tmp/run.py", line 3, in <module>
    print(load("config.yaml"))
  File "/tmp/run.py", line 2, in load
    return open(path).read()
FileNotFoundError: [Errno 2] No such file or directory: 'config.yaml'
"""


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def tool(content: str) -> list[dict[str, str]]:
    return [{"role": "tool", "tool_call_id": "call_1", "content": content}]


@pytest.mark.parametrize(
    "reply",
    [
        "thanks, perfect",
        "Great, that works!",
        "Thank you so much",
        "No problem, that's what I needed. Thanks!",
        "Now write a unit test for the parser.",
    ],
)
def test_praise_and_moving_on_score_plus_one(reply: str) -> None:
    assert rule_score(user(reply), previous_user_text="Summarise this article in three sentences.") == 1


@pytest.mark.parametrize(
    "reply",
    [
        "no, I meant the other file",
        "too AI-like, rewrite it without the bold",
        "That's wrong, the function returns a list.",
        "Thanks, but that’s not what I asked for",  # a typographic apostrophe, and praise that a correction outranks
        "It still doesn't work. Try again.",
        "this looks too AI-like, rewrite it without the bold and the numbered list",
    ],
)
def test_corrections_and_redo_requests_score_minus_one(reply: str) -> None:
    assert rule_score(user(reply)) == -1


def test_restating_the_same_request_scores_minus_one() -> None:
    request = "Summarise this article in three sentences."
    assert rule_score(user(request), previous_user_text=request) == -1
    assert rule_score(user("summarise this article in three short sentences"), previous_user_text=request) == -1


@pytest.mark.parametrize("reply", ["What's the capital of Australia?", "Where did the 2019 figure come from?"])
def test_a_bare_question_scores_zero(reply: str) -> None:
    assert rule_score(user(reply), previous_user_text="Summarise this article in three sentences.") == 0


def test_nothing_next_scores_zero() -> None:
    assert rule_score([]) == 0


@pytest.mark.parametrize(
    "result",
    [
        TRACEBACK,
        "Error: connection refused",
        "bash: jq: command not found",
        "build failed, exit code 1",
        json.dumps({"stdout": "", "stderr": "boom", "exit_code": 2}),
        json.dumps({"error": "city not found"}),
        json.dumps({"ok": False, "message": "rate limited"}),
        "npm ERR! code ERESOLVE\nnpm ERR! ERESOLVE unable to resolve dependency tree",
        "src/app.ts:27:14 - error TS2339: Property 'total' does not exist on type 'Order'.",
        "tests/test_login.py ....F....\n\n=================== FAILURES ===================",
        "curl: (6) Could not resolve host: api.example.com",
        "Found 2 errors.",
        "CMake Error at CMakeLists.txt:1 (cmake_minimum_required):\n  CMake 3.24 or higher is required.",
        "ERROR 1054 (42S22) at line 1: Unknown column 'customer_id' in 'field list'",
        'HTTP 401 Unauthorized\n{"message": "missing api key"}',
        "#N/A",
        "AssertionError [ERR_ASSERTION]: Expected values to be strictly equal:\n\n1 !== 2\n",
        "jq: error (at orders.json:12): Cannot index string with \"id\"",
        './main.go:4:2: "os" imported and not used\n./main.go:9:3: undefined: parseArgs',
        "On branch dev\nUntracked files:\n\tnotes.txt\n\nnothing added to commit but untracked files present",
        "An error occurred (AccessDenied) when calling the PutObject operation: Access Denied",
        "Msg 208, Level 16, State 1, Line 1\nInvalid object name 'dbo.Invoice'.",
        "git: 'stauts' is not a git command. See 'git --help'.",
        "'make' is not recognized as an internal or external command,\noperable program or batch file.",
        "#ERROR!",
    ],
)
def test_errors_in_tool_results_score_minus_one(result: str) -> None:
    assert rule_score(tool(result)) == -1


@pytest.mark.parametrize(
    "result",
    [
        json.dumps({"city": "Paris", "temperature_c": 21, "conditions": "sunny", "error": None}),
        json.dumps({"stdout": "3 passed", "exit_code": 0}),
        "Wrote 120 bytes to notes.md",
        "14 passed, 0 failed in 0.42s",
        "Found 0 errors.",
        "Error handling docs generated in site/errors.html",
        "HTTP/1.1 200 OK\ncontent-type: application/json",
        "Build succeeded.\n    0 Warning(s)\n    0 Error(s)\n\nTime Elapsed 00:00:04.12",  # a count of none is no error
        "Started background job 4 (pid 9120). Finished: 3 reports written.",  # it reports its result
    ],
)
def test_successful_tool_results_score_plus_one(result: str) -> None:
    assert rule_score(tool(result)) == 1


def test_a_run_that_did_nothing_scores_zero() -> None:
    assert rule_score(tool("collected 0 items\n\n===== no tests ran in 0.01s =====")) == 0
    assert rule_score(tool("")) == 0  # printed nothing: no sign either way


@pytest.mark.parametrize(
    "result",
    ["Submitted batch job 98112", "[2] 77341", "nohup: ignoring input and appending output to 'train.log'",
     "Waiting for cache lock: Could not get lock /var/lib/apt/lists/lock. It is held by process 811 (apt-get)... 9s"],
)
def test_a_run_whose_result_is_not_known_yet_scores_zero(result: str) -> None:
    """Queued, sent to the background or waiting for a lock: whether the call worked is still to come."""
    assert rule_score(tool(result)) == 0


@pytest.mark.parametrize(
    ("result", "score"),
    [
        ("[scheduler] The job queue pauses at midnight for backups.", 0),
        ("[session moved to a new host, id 88]", 0),
        ("[build] done in 2.3s, 4 files written", 1),  # a bracketed tag that reports the call's result
        ("[12.5, 13.0, 14.25]", 1),  # a list of results, not a tag
    ],
)
def test_a_note_from_the_tools_host_is_no_sign_either_way(result: str, score: int) -> None:
    assert rule_score(tool(result)) == score


def test_a_failed_call_among_several_results_scores_minus_one() -> None:
    assert rule_score(tool('{"temperature_c": 21}') + tool(TRACEBACK)) == -1


def test_hint_carries_the_users_directive() -> None:
    assert rule_hints(user("too AI-like, rewrite it without the bold")) == ["Rewrite it without the bold."]


def test_end_to_end_example_from_the_issue() -> None:
    reply = user("this looks too AI-like, rewrite it without the bold and the numbered list")
    assert rule_score(reply) == -1
    assert rule_hints(reply) == ["Rewrite it without the bold and the numbered list."]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Please use metric units.", ["Please use metric units."]),
        (
            "Hmm. Don't use bullet points, italics or headings; keep it under 100 words",
            ["Don't use bullet points, italics or headings.", "Keep it under 100 words."],
        ),
        ("no, I meant the other file", ["I meant the other file."]),
        (
            "You should cite the source. Also, do not guess the year.",
            ["You should cite the source.", "Do not guess the year."],
        ),
        ("Use metric units. Please use metric units!", ["Use metric units.", "Please use metric units."]),
        ("Use bold. Use metric units.", ["Use metric units."]),  # "Use bold." has 9 characters: no direction
    ],
)
def test_each_directive_clause_is_a_candidate(reply: str, expected: list[str]) -> None:
    assert rule_hints(user(reply)) == expected


def test_candidates_are_capped_and_never_repeated() -> None:
    reply = ". ".join(f"Please use unit number {n}" for n in range(8)) + ". Please use unit number 0."
    hints = rule_hints(user(reply))
    assert hints == [f"Please use unit number {n}." for n in range(4)]


@pytest.mark.parametrize("reply", ["thanks, perfect", "What's the capital of Australia?", "use it", ""])
def test_no_directive_or_too_short_gives_no_hint(reply: str) -> None:
    assert rule_hints(user(reply)) == []


def test_tool_results_give_no_hint() -> None:
    assert rule_hints(tool(TRACEBACK)) == []


# OpenClaw's three notes when an answer showed the user nothing (openclaw 2026.9.6,
# src/agents/embedded-agent-runner/run/incomplete-turn-recovery.ts), as it sends them: timestamped,
# then its context block as a message of its own.
OPENCLAW_RETRY_NOTES = [
    "The previous attempt did not produce a user-visible answer. Continue from the current state and produce the "
    "visible answer now. Do not restart from scratch.",
    "The previous assistant turn recorded reasoning but did not produce a user-visible answer. Continue from that "
    "partial turn and produce the visible answer now. Do not restate the reasoning or restart from scratch.",
    "The previous assistant turn completed its tool calls but did not produce a user-visible answer. Continue from "
    "the current transcript and produce the final user-visible answer now. Do not repeat completed tool calls or "
    "restart from scratch. Tools are unavailable in this step: it is a text-only pass, so reply with plain text and "
    "do not attempt any tool call.",
]


@pytest.mark.parametrize("note", OPENCLAW_RETRY_NOTES)
def test_an_agents_retry_note_is_a_failed_answer_without_a_hint(note: str) -> None:
    """The note is the agent's, not the user's: the empty answer failed, and "Do not restart from
    scratch." is no correction to distil (it also cost the judge a scoring pass per candidate over
    OpenClaw's 23K-token prompt)."""
    request = [{"role": "user", "content": "[Wed 2026-11-25 12:51 UTC] Plan a day in Lyon for me."}]
    context = {"role": "user", "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nworkspace\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"}
    retry = [{"role": "user", "content": f"[Wed 2026-11-25 12:52 UTC] {note}"}, context]
    assert judge_by_rules(request, retry) == (-1, [])


# smolagents 1.26's notes in the user's place after a step failed (agents.py, memory.py): the error, its
# retry line, and after max_steps its request for an answer, the task repeated.
SMOLAGENTS_RETRY = "Now let's retry: take care not to repeat previous errors! If you have retried several times, try a completely different approach.\n"
SMOLAGENTS_NOTES = [
    "Error:\nError while parsing tool call from model output: The model output does not contain any JSON blob.\n" + SMOLAGENTS_RETRY,
    "Error:\nError in code parsing:\nYour code snippet is invalid.\nMake sure to include code.\n" + SMOLAGENTS_RETRY
    + "\nBased on the above, please provide an answer to the following user task:\nPlan a day in Lyon for me.",
]


@pytest.mark.parametrize("note", SMOLAGENTS_NOTES)
def test_smolagents_note_after_a_failed_step_is_a_failed_answer_without_a_hint(note: str) -> None:
    assert judge_by_rules(user("New task:\nPlan a day in Lyon for me."), user(note)) == (-1, [])


def test_a_user_who_pastes_an_error_is_still_read() -> None:
    """A user's own error report is no agent note, though it opens the same way."""
    score, hints = judge_by_rules(user("Write the script."), user("Error:\nNameError: name 'x' is not defined\nplease fix it"))
    assert score == -1 and hints


def test_a_user_who_mentions_the_previous_attempt_is_still_read() -> None:
    request = user("Plan a day in Lyon for me.")
    score, hints = judge_by_rules(request, user("the previous attempt was better, go back to it"))
    assert score == -1 and hints
