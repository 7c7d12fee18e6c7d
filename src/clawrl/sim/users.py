"""Simulated users with hidden preferences that code can check (DESIGN §8).

Two personas ask grade-school word problems and react to the answers the way people do:

* the **student** wants every step shown, but no bold, headings or numbered lists: an answer
  like that is "too AI-like";
* the **teacher** wants answers detailed enough for a child (at least ``TEACHER_MIN_WORDS``
  words) with a few warm, encouraging words.

The preference is hidden from the model: it only ever sees the user's reactions ("thanks!",
"too AI-like, rewrite it without the bold", the question asked again, "done"). The preference
*detectors* (``student_satisfied``, ``teacher_satisfied``) are plain code, so the benchmark can
score any answer, from the tiny model or a real one, without a judge model.

A session is a few problems in a row. What happens next is decided by code (``UserSession``):
a satisfying answer gets thanks and the next problem; an unsatisfying one gets a correction or
the question asked again, up to ``max_retries`` times, then the user gives up and moves on; the
session ends with a "done" message after the last problem or at the turn limit. *How* the user
says it is the voice's job: ``ScriptedVoice`` picks from the phrasings below (what the CPU
benchmark uses), ``LLMVoice`` asks a language model behind any OpenAI-compatible endpoint to
write the message in character (for real models on a GPU). The scripted phrasings are written so
that the rule judge (``clawrl.judge.rule``) scores them as a person would: corrections say
"rewrite", "try again", "not", "AI-like"; praise says "thanks", "great", "perfect".
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import httpx

from clawrl.sim.corpus import PROBLEMS, Problem

# --------------------------------------------------------------------------- detectors

TEACHER_MIN_WORDS = 70

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


def word_count(text: str) -> int:
    return len(_WORD.findall(text))


def is_warm(answer: str) -> bool:
    """Encouragement addressed to the learner ("well done", "you've got this"), not an eager opener."""
    return bool(_WARM.search(answer))


def student_satisfied(answer: str, problem: Problem) -> bool:
    return shows_every_step(answer, problem) and not has_markup(answer)


def teacher_satisfied(answer: str, problem: Problem) -> bool:
    return word_count(answer) >= TEACHER_MIN_WORDS and is_warm(answer)


# --------------------------------------------------------------------------- personas


@dataclass(frozen=True)
class Persona:
    """Who the user is, what they want (hidden), and the ways they say things."""

    name: str
    character: str  # for LLMVoice: who to play, in the second person
    preference: str  # for LLMVoice and reports: the hidden preference in words
    satisfied: Callable[[str, Problem], bool]
    openers: tuple[str, ...]  # "{question}" is replaced
    instructions: tuple[str, ...]  # asking for the preferred style up front
    corrections: tuple[str, ...]  # the first complaint about an answer
    step_corrections: tuple[str, ...]  # the first complaint about an answer whose only fault is missing working
    repeated_corrections: tuple[str, ...]  # when the rewrite is still not right
    reasks: tuple[str, ...]  # the question again, with a nudge; "{question}" is replaced
    praise_next: tuple[str, ...]  # "{question}" is the next problem
    praise_done: tuple[str, ...]
    give_up_next: tuple[str, ...]
    give_up_done: tuple[str, ...]


STUDENT = Persona(
    name="student",
    character="You are a twelve-year-old doing maths homework with the help of an AI assistant.",
    preference="every step of the working shown, written as normal sentences: no bold, no headings, no numbered lists",
    satisfied=student_satisfied,
    openers=("{question}", "{question}", "can you help me with this one? {question}", "homework question: {question}",
             "how do I solve this: {question}"),
    instructions=(
        "Please don't use bold or numbered lists, just explain every step in sentences.",
        "Write it like a person would: plain sentences, no bold, no lists.",
        "No markdown please, but show every step.",
        "Explain it in a normal paragraph without any formatting.",
    ),
    corrections=(
        "too AI-like, rewrite it without the bold and the numbered list",
        "this sounds like a robot. rewrite it without the bold and the numbered steps, just normal sentences",
        "no, not like that. please write it as plain sentences, without bold or a numbered list",
        "that's not how I want it. rewrite it like a person would explain it, no bold, no lists",
        "too AI-like. try again without the formatting, but keep every step",
    ),
    step_corrections=(
        "you skipped some steps. rewrite it and show every step of the working",
        "that's not enough working for me. please show every step, in sentences",
    ),
    repeated_corrections=(
        "still too AI-like. please don't use bold or numbered steps at all",
        "no, that's still a list. rewrite it as one normal paragraph",
    ),
    reasks=(
        "{question} Try again, and please write it in plain sentences, without bold or lists.",
        "I'll ask again: {question} That's not what I asked for: please don't format it, just write the steps as sentences.",
    ),
    praise_next=(
        "thanks! next one: {question}",
        "perfect, that's how I like it. {question}",
        "great, thank you. another one: {question}",
        "nice, got it. {question}",
        "ok, moving on. {question}",
    ),
    praise_done=("thanks, that's all for today!", "great, I'm done. thank you!", "perfect, that's everything. bye!"),
    give_up_next=("forget it, still too AI-like. next one: {question}", "ugh, not what I asked for. next: {question}"),
    give_up_done=("forget it, it's still too AI-like. I'm done.", "that's still not what I meant. done for today."),
)

TEACHER = Persona(
    name="teacher",
    character="You are a primary-school teacher preparing worked examples for your class of ten-year-olds.",
    preference=f"a detailed explanation (at least {TEACHER_MIN_WORDS} words) with warm, encouraging words for the children",
    satisfied=teacher_satisfied,
    openers=("{question}", "Could you solve this one for my class? {question}", "For tomorrow's worksheet: {question}"),
    instructions=(
        "Please explain it in detail and be encouraging, it's for my pupils.",
        "Make it detailed and warm, with some encouragement for the kids.",
        "Explain every step slowly and cheer the children on.",
    ),
    corrections=(
        "not quite what I need for my class. rewrite it with more detail and a few warm words of encouragement",
        "too short and a bit cold for kids. try again, and please explain every step in more detail, with some encouragement",
        "that's not warm enough for ten-year-olds. make it longer and more encouraging",
        "no, the kids need more than that. rewrite it in more detail and cheer them on a little",
    ),
    step_corrections=(),  # the teacher's complaints already ask for every step in detail
    repeated_corrections=(
        "still not quite right. please make it longer and add encouragement for the children",
        "that's not it yet. rewrite it slowly, step by step, and end with some praise for the kids",
    ),
    reasks=(
        "{question} Try again, and please make it detailed and encouraging, it's for my pupils.",
        "Let me ask again: {question} That's not what I need: please explain it slowly and warmly for the children.",
    ),
    praise_next=(
        "lovely, thank you! that's perfect for the class. next: {question}",
        "great, the kids will like this. thanks! another one: {question}",
        "perfect, thank you. {question}",
    ),
    praise_done=("thank you, that's all I needed for tomorrow!", "great, that's everything. thanks!"),
    give_up_next=("not what I need, forget it. next: {question}", "that's not right either. let's move on: {question}"),
    give_up_done=("that's still not what I meant. I'll write it myself, done.", "no, still not right. that's all for today."),
)

PERSONAS: dict[str, Persona] = {persona.name: persona for persona in (STUDENT, TEACHER)}


def problems(rng: random.Random, count: int) -> list[Problem]:
    """`count` word problems, consecutive ones of different kinds.

    Two problems from one template read alike; asked in a row, the second could look like the
    first asked again (a restatement, which judges score as a complaint).
    """
    chosen: list[Problem] = []
    previous: Callable[[random.Random], Problem] | None = None
    for _ in range(count):
        generator = rng.choice([g for g in PROBLEMS if g is not previous])
        chosen.append(generator(rng))
        previous = generator
    return chosen


# --------------------------------------------------------------------------- what the user says next


class Intent(Enum):
    """What the user means to say; the voice decides the words."""

    OPEN = "open"  # ask the first problem
    CORRECT = "correct"  # complain about the answer and ask for a rewrite
    CORRECT_STEPS = "correct_steps"  # the answer's only fault: working left out
    CORRECT_AGAIN = "correct_again"
    REASK = "reask"  # ask the same question again, with a nudge
    PRAISE_NEXT = "praise_next"  # thank, then ask the next problem
    PRAISE_DONE = "praise_done"
    GIVE_UP_NEXT = "give_up_next"  # stop asking for rewrites; next problem
    GIVE_UP_DONE = "give_up_done"


@dataclass(frozen=True)
class Cue:
    """Everything a voice needs to word one message."""

    intent: Intent
    persona: Persona
    question: str | None  # the problem to ask (OPEN, REASK, *_NEXT)
    answer: str | None  # the assistant's answer being reacted to


class Voice(Protocol):
    def say(self, cue: Cue, rng: random.Random) -> str: ...


class ScriptedVoice:
    """Picks one of the persona's phrasings: deterministic given the session's rng."""

    def say(self, cue: Cue, rng: random.Random) -> str:
        persona = cue.persona
        phrasings = {
            Intent.OPEN: persona.openers,
            Intent.CORRECT: persona.corrections,
            Intent.CORRECT_STEPS: persona.step_corrections,
            Intent.CORRECT_AGAIN: persona.repeated_corrections,
            Intent.REASK: persona.reasks,
            Intent.PRAISE_NEXT: persona.praise_next,
            Intent.PRAISE_DONE: persona.praise_done,
            Intent.GIVE_UP_NEXT: persona.give_up_next,
            Intent.GIVE_UP_DONE: persona.give_up_done,
        }[cue.intent]
        return rng.choice(phrasings).format(question=cue.question or "")


_LLM_INSTRUCTIONS = {
    Intent.CORRECT: "The answer is not what you want. Complain briefly and ask for a rewrite, saying how it should be.",
    Intent.CORRECT_STEPS: "The answer leaves out steps of the working. Complain briefly and ask for a rewrite "
    "that shows every step.",
    Intent.CORRECT_AGAIN: "The rewrite is still not what you want. Say so, and say again how it should be.",
    Intent.PRAISE_NEXT: "The answer is what you want. Thank the assistant briefly; your next question follows.",
    Intent.PRAISE_DONE: "The answer is what you want. Thank the assistant and say you are done for today.",
    Intent.GIVE_UP_NEXT: "The answer is still not what you want. Give up on it with a short complaint; your next question follows.",
    Intent.GIVE_UP_DONE: "The answer is still not what you want. Give up with a short complaint and say you are done.",
}


@dataclass
class LLMVoice:
    """A language model plays the persona through any OpenAI-compatible endpoint.

    Code still decides what happens (the intent) and supplies the questions verbatim, so that
    every session asks problems whose working the detectors know; the model only words the
    reactions, in character. Asking a question is left to code entirely.
    """

    url: str  # base URL up to /v1
    model: str
    api_key: str | None = None
    temperature: float = 0.8
    max_tokens: int = 80
    timeout_s: float = 60.0
    retries: int = 3

    def say(self, cue: Cue, rng: random.Random) -> str:
        if cue.intent in (Intent.OPEN, Intent.REASK):
            return ScriptedVoice().say(cue, rng)
        reaction = self._complete(cue, seed=rng.randrange(2**31))
        if cue.intent in (Intent.PRAISE_NEXT, Intent.GIVE_UP_NEXT):
            return f"{reaction} {cue.question}"
        return reaction

    def _complete(self, cue: Cue, seed: int) -> str:
        system = (
            f"{cue.persona.character} You secretly want {cue.persona.preference}. Never reveal that you are "
            "simulated. Write only your next chat message: one or two short, casual sentences."
        )
        user = f"The assistant answered:\n\n{cue.answer}\n\n{_LLM_INSTRUCTIONS[cue.intent]}"
        body = {
            "model": self.model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "seed": seed,
        }
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        for attempt in range(self.retries):
            try:
                response = httpx.post(f"{self.url.rstrip('/')}/chat/completions", json=body, headers=headers,
                                      timeout=self.timeout_s)
                if response.status_code < 500:
                    response.raise_for_status()
                    text = (response.json()["choices"][0]["message"].get("content") or "").strip()
                    if text:
                        return text
            except httpx.TransportError:
                pass
            time.sleep(0.2 * 2**attempt)
        raise RuntimeError(f"the user model at {self.url} gave no reply after {self.retries} attempts")


# --------------------------------------------------------------------------- one session


@dataclass(frozen=True)
class UserMessage:
    text: str
    done: bool  # the session ends with this message


@dataclass
class UserSession:
    """One session of one persona: the protocol, independent of how messages are worded.

    Call `first_message()`, then `react(answer)` after every answer until a message has
    `done=True`. `first_attempts` records, per problem, whether the first answer to it satisfied
    the preference; a session *satisfies* the preference when every first answer did.
    """

    persona: Persona
    problems: list[Problem]
    rng: random.Random
    voice: Voice = field(default_factory=ScriptedVoice)
    max_turns: int = 6
    max_retries: int = 1
    first_attempts: list[bool] = field(default_factory=list)
    turns: int = 0
    _current: int = 0
    _retries: int = 0

    @property
    def satisfied(self) -> bool:
        return bool(self.first_attempts) and all(self.first_attempts)

    @property
    def problem(self) -> Problem:
        return self.problems[self._current]

    def first_message(self) -> str:
        return self._say(Intent.OPEN, question=self.problem.question, answer=None)

    def react(self, answer: str) -> UserMessage:
        self.turns += 1
        ok = self.persona.satisfied(answer, self.problem)
        if self._retries == 0:
            self.first_attempts.append(ok)
        last_problem = self._current + 1 >= len(self.problems)
        out_of_turns = self.turns >= self.max_turns
        if ok or self._retries >= self.max_retries or out_of_turns:
            gave_up = not ok
            if last_problem or out_of_turns:
                intent = Intent.GIVE_UP_DONE if gave_up else Intent.PRAISE_DONE
                return UserMessage(self._say(intent, None, answer), done=True)
            self._current += 1
            self._retries = 0
            intent = Intent.GIVE_UP_NEXT if gave_up else Intent.PRAISE_NEXT
            return UserMessage(self._say(intent, self.problem.question, answer), done=False)
        self._retries += 1
        return UserMessage(self._say(self._complaint(answer), self.problem.question, answer), done=False)

    def _complaint(self, answer: str) -> Intent:
        """Again, a re-ask, or a correction that names what is wrong: the look, or the missing working."""
        if self._retries > 1:
            return Intent.CORRECT_AGAIN
        if self.rng.random() < 0.25:
            return Intent.REASK
        if self.persona.step_corrections and not has_markup(answer):
            return Intent.CORRECT_STEPS
        return Intent.CORRECT

    def _say(self, intent: Intent, question: str | None, answer: str | None) -> str:
        return self.voice.say(Cue(intent, self.persona, question, answer), self.rng)
