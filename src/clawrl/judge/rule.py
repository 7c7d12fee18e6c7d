"""The `rule` judge backend: the offline judge (DESIGN §5; issue 27).

It needs no model, so the tiny model, the CPU demo and the tests can judge turns offline. It
follows the PRM rubric: an error in a tool result, or a user who corrects, rejects or repeats, is
-1; a user who thanks, approves or moves on, or a tool that succeeds, is +1; anything else
(a question about the answer, a "hmm") is 0.

* **Tool results** are read by rules: an error, a failed test or build, a non-zero exit code or a
  structured failure (`{"error": ...}`) is -1; a run that did nothing ("no tests ran") or whose
  result is not known yet (a batch job queued, a process sent to the background) is 0; any
  other output is +1.
* **What the user wrote** is read by a classifier (`classifier.py`) over the reply's character
  n-grams and the counts of a multilingual lexicon of cues (`lexicon.py`), trained on the tuning
  part of a labelled corpus of replies (`corpus.py`) in ten languages: it reads "no, that's
  perfect" as praise, "oh great, now it sounds like a lawyer wrote it" as a complaint and "would
  you mind making it more polite?" as a correction. One rule stands before it: a reply that
  repeats most of the request's words is the request asked again, -1.
* **Hints** are the user's directive clauses (`hints.py`: "could you make it shorter" gives "Make
  it shorter."), offered when the reply is not praise and the classifier reads it as saying how
  the answer should have been; a correction with no directive clause in it ("it's Mr. Romero, not
  Ms.") is its own hint. Overlap-guided selection (`judge/selection.py`) picks among several.

An agent's own note asking again after an answer that showed the user nothing (OpenClaw's "The
previous attempt did not produce a user-visible answer ...") is -1 with no hint: the answer
failed, and the note's words are the agent's, not a correction by the user.

Everything reads only what the user typed (`messages.user_typed`): a timestamp, a context block
or a memory section that the user's agent wrapped around "thanks, perfect" must neither hide the
thanks nor make the reply look like a restatement of the request it shares the wrapping with.
"""

from __future__ import annotations

import json
import re
from typing import Any

from clawrl.judge.classifier import ReplyModel, default_model
from clawrl.judge.hints import MAX_HINTS, directive_hints, reply_hint
from clawrl.messages import content_text, is_agent_retry_note, user_typed
from clawrl.types import Message

RESTATEMENT_JACCARD = 0.6
# The classifier's probability that a reply says how the answer should be, above which the judge
# offers hints: lower after a -1, where a reply that says what went wrong usually names what to
# change ("No beans. My partner can't eat them."), than after a 0, most often a question about the
# answer. Chosen on the three read writers' replies, each left out of training in turn.
DIRECTION_THRESHOLDS = {-1: 0.2, 0: 0.4}

_TOOL_ERROR = re.compile(
    r"Traceback \(most recent call last\)|\b\w*(?:error|exception):|\bfatal:|command not found"
    r"|no such file or directory|permission denied|segmentation fault|non-?zero exit"
    # what failing tools print besides "error:": package managers, compilers, linkers, test runners,
    # network clients, servers and git
    r"|\bERR!|\berror [A-Z]+\d+\b|\bfound [1-9]\d* errors?\b|\b[1-9]\d* (?:failed|errors?)\b|^FAILED\b|={3,} FAILURES ={3,}"
    r"|\bfailed:|\btest failed\b|\bbuild failed\b|\bcould not resolve\b|\bcannot stat\b|\bcannot (?:open|find|access)\b"
    r"|\btoo many requests\b|\brate limit(?:ed)? exceeded\b|\[emerg\]|\binvalid option\b|\bundefined reference\b"
    r"|\balready (?:exists|allocated|in use)\b|\bblocked by CORS\b|\bbad interpreter\b|\bnot fully merged\b"
    r"|\[rejected\]|\bconnection refused\b|\btimed out\b|\bunable to\b|\bsyntax error\b|\bpanic:|\bnothing added to commit\b"
    # the AWS CLI ("An error occurred (ExpiredToken) when calling ..."), SQL Server ("Msg 102, Level 15, State 1")
    r"|\ban error occurred \(\w+\)|\bMsg \d+, Level \d+, State \d+"
    r"|\*\*\* .*\bStop\.|\bWARNING: DATA RACE\b|\bError from server\b|\bnot found\s*$|\bAddressSanitizer\b"
    # a bracketed error code ("AssertionError [ERR_ASSERTION]:"), jq's "error (at FILE:LINE)", Go's compiler
    r"|\b\w*(?:Error|Exception) \[\w+\]:|\berror \(at\b|\bundefined: \w|\b(?:imported|declared) and not used\b"
    # a line that opens with the word ("CMake Error at ...", "ERROR 1054 (42S22): ..."), an HTTP
    # client or server error status, a spreadsheet's error value
    # (but not a count of none: dotnet's "0 Error(s)" after "Build succeeded.")
    r"|^\s*(?:[^\W\d]\w* )?(?:error|fatal)(?= at\b| \d| ?\(| ?\[)|\bHTTP(?:/[\d.]+)? [45]\d\d\b"
    r"|^\s*#(?:N/?[AD]|NV|VALUE!|REF!|DIV/0!|NAME\?|ERROR!)\s*$"
    # a shell or git that did not know the command
    r"|\bis not a git command\b|\bis not recognized as an internal or external command\b",
    re.IGNORECASE | re.MULTILINE,
)
_EXIT_CODE = re.compile(
    r"\b(?:exit(?:ed)?(?:\s+with)?[\s_]?(?:code|status)|return[\s_]?code|returncode)[\"']?\s*[:=]?\s*(-?\d+)",
    re.IGNORECASE,
)
_TOOL_DID_NOTHING = re.compile(
    r"\bno tests ran\b|\bcollected 0 items\b|\[no test files\]|\bRan 0 tests\b|\bno tests to run\b|\b0 passing\b",
    re.IGNORECASE,
)
# A run whose result is not known yet: queued, sent to the background, waiting for a lock.
_TOOL_PENDING = re.compile(
    r"^Submitted batch job \d+|\b(?:started|running|moved to) (?:in )?(?:the )?background\b|^nohup: ignoring input"
    r"|^Waiting for (?:cache )?lock\b|^\[\d+\] \d+\s*$",
    re.IGNORECASE | re.MULTILINE,
)
# A line the tool's host wrote about the session, not the call's result: "[kernel] Kernel restarted
# by the administrator.", "[process moved to background, pid 51734]". Nothing either way.
_HOST_NOTICE = re.compile(r"^\s*\[[^\W\d_][^\]\n]{1,59}\][^\n]*$")
_REPORTS_RESULT = re.compile(r"\b(?:ok|success\w*|succeeded|passed|done|complete[d]?|created|saved|written|finished|installed)\b",
                             re.IGNORECASE)
_WORD = re.compile(r"[a-z0-9']+")


def judge_by_rules(
    request_messages: list[Message], next_state_messages: list[Message], model: ReplyModel | None = None
) -> tuple[int, list[str]]:
    """(score, hint candidates) of the response to `request_messages` that `next_state_messages` followed.

    Both sides are read as the user typed them (`user_typed`): the lines an agent repeats in every
    user message are boilerplate, so the request's last user message and the reply leave out the
    lines they share (and the request, when there is no reply, those it shares with the user
    message before it). `model` is the classifier (the one trained on the tuning part by default).
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
    if replies and all(is_agent_retry_note(user_typed(message, request)) for message in replies):
        return -1, []  # the agent asked again because the answer showed the user nothing; no user words to hint with
    model = model or default_model()
    score = rule_score(reply, previous_user_text=previous_text, model=model)
    return score, judged_hints(_user_text(reply), score, previous_text, model)


def rule_score(
    next_state_messages: list[dict[str, Any]], previous_user_text: str | None = None, model: ReplyModel | None = None
) -> int:
    """+1, -1 or 0 for the response that `next_state_messages` followed.

    `previous_user_text` is the request the response answered; without it a restatement
    cannot be recognised and is judged on its words alone.
    """
    tool_results = [_text(m) for m in next_state_messages if m["role"] == "tool"]
    if any(_is_tool_error(result) for result in tool_results):
        return -1
    user_text = _user_text(next_state_messages)
    if user_text:
        return _user_score(user_text, previous_user_text, model or default_model())
    if tool_results and all(_did_nothing(result) for result in tool_results):
        return 0  # did nothing, printed nothing, is still running or waiting, or only its host spoke: no sign either way
    return 1 if tool_results else 0


def rule_hints(next_state_messages: list[dict[str, Any]]) -> list[str]:
    """The user's directive clauses, one hint candidate each (`hints.directive_hints`), whatever the score.

    In each sentence the directive runs from its first trigger to the sentence's end, so "too
    AI-like, rewrite it without the bold" gives "Rewrite it without the bold." and a list
    ("don't use bold, italics or lists") stays whole.
    """
    return directive_hints(_user_text(next_state_messages))


def judged_hints(user_text: str, score: int, previous_user_text: str | None, model: ReplyModel) -> list[str]:
    """The hints the judge offers for a reply it scored `score`: the reply as one hint, then each directive clause.

    None for praise: a reply read as +1 asks for nothing in this answer to change ("thanks! now add
    tests" moves on; "Thanks! Could you add the costs?", which asks for more in the same answer, the
    classifier reads as -1, as every writer of the corpus labels it). None for a reply that says
    nothing of how the answer should be ("this is useless"), as the classifier's direction head
    reads it (`DIRECTION_THRESHOLDS`); a clause of a -1 reply is offered whatever that head says.
    """
    if score == 1 or not user_text:
        return []
    if previous_user_text and _plain(user_text) == _plain(previous_user_text):
        return []  # the request asked again word for word: nothing in it that a hint could add
    clauses = directive_hints(user_text)
    directs = model.direction_probability(user_text, previous_user_text) >= DIRECTION_THRESHOLDS[score]
    if not directs and not (score == -1 and clauses):
        return []
    whole = reply_hint(user_text)
    candidates = list(dict.fromkeys([*([whole] if whole else []), *clauses]))[:MAX_HINTS]
    return candidates or [_quoted(user_text)]


def _user_score(text: str, previous_user_text: str | None, model: ReplyModel) -> int:
    if previous_user_text and _is_restatement(text, previous_user_text):
        return -1
    probabilities = model.score_probabilities(text, previous_user_text)
    return max(probabilities, key=probabilities.get)


def _quoted(text: str) -> str:
    """A correction too short to stand alone as a hint ("Grams?"), quoted."""
    return f'The user replied: "{" ".join(text.split())}"'


def _is_restatement(text: str, previous: str) -> bool:
    """High word overlap with the previous request: the user is asking for the same thing again."""
    words, previous_words = _words(text), _words(previous)
    union = words | previous_words
    return bool(union) and len(words & previous_words) / len(union) >= RESTATEMENT_JACCARD


def _is_tool_error(result: str) -> bool:
    if _TOOL_ERROR.search(result) or any(int(code) != 0 for code in _EXIT_CODE.findall(result)):
        return True
    return _is_json_failure(result)


def _did_nothing(result: str) -> bool:
    if _TOOL_DID_NOTHING.search(result) or not result.strip():
        return True
    waits = _TOOL_PENDING.search(result) or _HOST_NOTICE.match(result.strip())
    return bool(waits) and not _REPORTS_RESULT.search(result)


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


def _user_text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(_text(m) for m in messages if m["role"] == "user").strip()


def _text(message: dict[str, Any]) -> str:
    """Content as one string, with typographic apostrophes made plain so "don’t" matches "don't"."""
    return content_text(message.get("content")).replace("\u2019", "'")


def _plain(text: str) -> str:
    return " ".join(text.lower().split())


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))
