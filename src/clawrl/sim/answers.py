"""What a simulated user checks in an answer: plain code, so any answer (from the tiny model or a
real one) is scored without a judge model (DESIGN §8).

The style detectors (`has_markup`, `shows_every_step`, `is_warm`, `word_count`, `sentences`) carry the
personas' hidden preferences; `on_topic` and `result_correct` say whether the answer is about the
problem asked and whether its last number is the reference result (issue 28), which no persona's
style score hides.
"""

from __future__ import annotations

import re

from clawrl.sim.corpus import Problem

TEACHER_MIN_WORDS = 70
TERSE_MAX_WORDS = 25

_BOLD = re.compile(r"\*\*[^*\n]+\*\*|__[^_\n]+__")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s", re.MULTILINE)
_LIST_ITEM = re.compile(r"^\s*(?:\d+[.)]|[-*•+])\s+\S", re.MULTILINE)
# "57 + 6 = 63", "2 × 5 + 2 × 3 = 16", "$100 - $72 = $28": a calculation written out with its result.
_NUMBER = r"\$?\d[\d,]*(?:\.\d+)?"
_EQUATION = re.compile(rf"{_NUMBER}(?:\s*[-+×x*÷/]\s*{_NUMBER})+\s*=\s*{_NUMBER}")
_WARM = re.compile(
    r"you(?:'re| are) doing (?:great|well)|well done|great job|good job|nice work|keep (?:it up|practi[sc]ing|going)"
    r"|you(?:'ve| have) got this|you can do (?:it|this)|proud of you|don't worry|take your time",
    re.IGNORECASE,
)
_WORD = re.compile(r"[A-Za-z0-9$']+")
# The end of a sentence: a full stop, "!" or "?" before a space or the end ("$2.50" is not one).
_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)")


def has_markup(answer: str) -> bool:
    """Bold, a markdown heading, or a numbered/bulleted list: what reads as "too AI-like"."""
    return bool(_BOLD.search(answer) or _HEADING.search(answer) or _LIST_ITEM.search(answer))


def equations(text: str) -> int:
    return len(_EQUATION.findall(text))


def shows_every_step(answer: str, problem: Problem) -> bool:
    """At least as many worked calculations as the reference solution has.

    Style, not correctness: the tiny model's arithmetic is often wrong, and the students in this
    benchmark care about how the working is shown.
    """
    return equations(answer) >= max(1, equations(" ".join(problem.steps)))


_ANY_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def numbers_in(text: str) -> list[str]:
    """The numbers written in `text`, in order, without thousands separators ("1,200" is "1200")."""
    return [number.replace(",", "").rstrip(".") for number in _ANY_NUMBER.findall(text)]


def on_topic(answer: str, problem: Problem) -> bool:
    """Is the answer about the problem asked? It uses at least two of the question's numbers (all, if
    fewer), or it ends on the right result ("So the answer is 38." answers the question, if tersely).

    What a person notices first: "2 × 2 + 2 × 6 = 22 m" is no answer to "11 cards in every pack,
    how many in 12 packs?", however well it is laid out.
    """
    asked = set(numbers_in(problem.question))
    return len(asked & set(numbers_in(answer))) >= min(2, len(asked)) or result_correct(answer, problem)


def result_correct(answer: str, problem: Problem) -> bool:
    """Is the answer's last number the reference result? ("... = 63. So the answer is 63." is.)"""
    written, expected = numbers_in(answer), numbers_in(problem.answer)
    return bool(written and expected) and float(written[-1]) == float(expected[0])


def student_strict_satisfied(answer: str, problem: Problem) -> bool:
    """The student's style with the right result (which is on topic, `on_topic`)."""
    return student_satisfied(answer, problem) and result_correct(answer, problem)


def word_count(text: str) -> int:
    return len(_WORD.findall(text))


def is_warm(answer: str) -> bool:
    """Encouragement addressed to the learner ("well done", "you've got this"), not an eager opener."""
    return bool(_WARM.search(answer))


def student_satisfied(answer: str, problem: Problem) -> bool:
    return shows_every_step(answer, problem) and not has_markup(answer)


def teacher_satisfied(answer: str, problem: Problem) -> bool:
    return word_count(answer) >= TEACHER_MIN_WORDS and is_warm(answer)


def sentences(text: str) -> int:
    """How many sentences `text` has (an unterminated last one counts)."""
    stripped = text.strip()
    if not stripped:
        return 0
    return len(_SENTENCE_END.findall(stripped)) + (stripped[-1] not in ".!?")


def terse_satisfied(answer: str, problem: Problem) -> bool:
    """One short sentence without markup or line breaks: what the terse user wants, working or not."""
    text = answer.strip()
    return (bool(text) and "\n" not in text and not has_markup(text) and sentences(text) == 1
            and word_count(text) <= TERSE_MAX_WORDS)
