"""Simulated users with hidden preferences that code can check (DESIGN §8): how a session plays out.
The personas themselves, their phrasings and held-out reactions, are ``clawrl.sim.personas``.

Two personas ask grade-school word problems and react to the answers the way people do:

* the **student** wants every step shown, but no bold, headings or numbered lists: an answer
  like that is "too AI-like";
* the **teacher** wants answers detailed enough for a child (at least ``TEACHER_MIN_WORDS``
  words) with a few warm, encouraging words;
* the **strict student** (``student-strict``) wants the student's style *and* the right result;
* the **terse** user wants one short sentence with the result (at most ``TERSE_MAX_WORDS``
  words, no working): the opposite of the other two, for the benchmark of several users on one
  server (issue 32), where a shared policy is pulled both ways.

Whatever the preference, an answer about another problem (``on_topic``: it uses fewer than two of
the question's numbers) satisfies nobody: every user says so ("that's not what I asked, those
aren't my numbers") and asks again (issue 28). The held-out score stays the persona's preference, reported
beside two shares of correctness that no persona's score hides: answers on topic, and answers whose
last number is the reference result (``result_correct``).

The preference is hidden from the model: it only ever sees the user's reactions ("thanks!",
"too AI-like, rewrite it without the bold", the question asked again, "done"). The preference
*detectors* (``student_satisfied``, ``teacher_satisfied``, in ``answers.py``) are plain code, so the benchmark can
score any answer, from the tiny model or a real one, without a judge model.

A session is a few problems in a row. What happens next is decided by code (``UserSession``):
a satisfying answer gets thanks and the next problem; an unsatisfying one gets a correction or
the question asked again, up to ``max_retries`` times, then the user gives up and moves on; the
session ends with a "done" message after the last problem or at the turn limit. A noisy user
(``UserSession``'s rates, all 0 by default) sometimes says nothing when satisfied, complains
without saying why, moves on without complaining, or is wrong about the answer; what the benchmark
scores stays ``persona.satisfied``, and the user's truth ``satisfies``. *How* the user says it is the voice's job: ``ScriptedVoice``
picks from the phrasings below (what the CPU benchmark uses), ``LLMVoice`` asks a language model behind any OpenAI-compatible endpoint to
write the message in character (for real models on a GPU).

What the scripted user says *about* an answer without asking for a change (praise, a complaint
that does not say why, giving up) comes from the held-out part of the judge's labelled corpus of
replies (``held_out_reactions``: English replies of the styles praise, one-word and emoji scored
+1; complaints without direction and one-word replies scored -1), words the offline judge was
never tuned on, so the benchmark's judge agreement is an honest figure (issue 27). The
corrections that ask for the preferred style stay the personas' own words: they carry the habit
the benchmark teaches, which no corpus reply asks for.

The phrasings that say how an answer should be (``Requests``) come in two pools per persona that
share no hint string (issue 12): the tiny model is pre-trained on the ``pretraining`` pool
(``clawrl.sim.chats``), the simulated user speaks only the ``evaluation`` pool, so the benchmark
measures following hints worded in ways the model never saw, not recalling memorised ones.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import httpx

from clawrl.sim.answers import has_markup, on_topic, result_correct
from clawrl.sim.corpus import PROBLEMS, Problem
from clawrl.sim.personas import Persona, held_out_reactions


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
    CORRECT_TOPIC = "correct_topic"  # the answer is about another problem: say so, and ask again
    CORRECT_RESULT = "correct_result"  # the strict student: the result is wrong
    REASK = "reask"  # ask the same question again, with a nudge
    PRAISE_NEXT = "praise_next"  # thank, then ask the next problem
    PRAISE_DONE = "praise_done"
    GIVE_UP_NEXT = "give_up_next"  # stop asking for rewrites; next problem
    GIVE_UP_DONE = "give_up_done"
    # The noisy user's (UserSession's rates)
    CORRECT_VAGUELY = "correct_vaguely"  # a complaint that does not say what is wrong or how it should be
    MOVE_ON_NEXT = "move_on_next"  # nothing said about the answer: just the next problem
    MOVE_ON_DONE = "move_on_done"  # nothing said about the answer: the user leaves


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
    """Picks a phrasing: the persona's evaluation pool to ask, held-out corpus replies to react.

    Deterministic given the session's rng.
    """

    def say(self, cue: Cue, rng: random.Random) -> str:
        persona, requests, reactions = cue.persona, cue.persona.evaluation, held_out_reactions()
        reaction = {
            Intent.PRAISE_NEXT: reactions.praise,
            Intent.PRAISE_DONE: reactions.praise,
            Intent.GIVE_UP_NEXT: reactions.complaints,
            Intent.GIVE_UP_DONE: reactions.complaints,
            Intent.CORRECT_VAGUELY: reactions.complaints,
        }.get(cue.intent)
        if reaction is not None:
            said = rng.choice(reaction)
            return f"{said} {cue.question}" if cue.intent in _FOLLOWED_BY_THE_NEXT_PROBLEM else said
        phrasings = {
            Intent.OPEN: persona.openers,
            Intent.CORRECT: requests.corrections,
            Intent.CORRECT_STEPS: requests.step_corrections,
            Intent.CORRECT_TOPIC: requests.topic_corrections,
            Intent.CORRECT_RESULT: requests.result_corrections,
            Intent.REASK: requests.reasks,
            Intent.MOVE_ON_NEXT: persona.move_on_next,
            Intent.MOVE_ON_DONE: persona.move_on_done,
        }[cue.intent]
        return rng.choice(phrasings).format(question=cue.question or "")


_FOLLOWED_BY_THE_NEXT_PROBLEM = (Intent.PRAISE_NEXT, Intent.GIVE_UP_NEXT)


_LLM_INSTRUCTIONS = {
    Intent.CORRECT: "The answer is not what you want. Complain briefly and ask for a rewrite, saying how it should be.",
    Intent.CORRECT_STEPS: "The answer leaves out steps of the working. Complain briefly and ask for a rewrite "
    "that shows every step.",
    Intent.CORRECT_TOPIC: "The answer solves some other problem, not yours. Say so, and ask your question again.",
    Intent.CORRECT_RESULT: "The answer's result is wrong. Say so, and ask for the calculation again, step by step.",
    Intent.PRAISE_NEXT: "The answer is what you want. Thank the assistant briefly; your next question follows.",
    Intent.PRAISE_DONE: "The answer is what you want. Thank the assistant and say you are done for today.",
    Intent.GIVE_UP_NEXT: "The answer is still not what you want. Give up on it with a short complaint; your next question follows.",
    Intent.GIVE_UP_DONE: "The answer is still not what you want. Give up with a short complaint and say you are done.",
    Intent.CORRECT_VAGUELY: "The answer is not what you want. Say so in a few words, without saying what is wrong "
    "or how it should be.",
}


@dataclass
class LLMVoice:
    """A language model plays the persona through any OpenAI-compatible endpoint.

    Code still decides what happens (the intent) and supplies the questions verbatim, so that
    every session asks problems whose working the detectors know; the model only words the
    reactions, in character. Asking a question, and moving on without a word about the answer,
    are left to code entirely.
    """

    url: str  # base URL up to /v1
    model: str
    api_key: str | None = None
    temperature: float = 0.8
    max_tokens: int = 80
    timeout_s: float = 60.0
    retries: int = 3

    def say(self, cue: Cue, rng: random.Random) -> str:
        if cue.intent in (Intent.OPEN, Intent.REASK, Intent.MOVE_ON_NEXT, Intent.MOVE_ON_DONE):
            return ScriptedVoice().say(cue, rng)
        reaction = self._complete(cue, seed=rng.randrange(2**31))
        if cue.intent in _FOLLOWED_BY_THE_NEXT_PROBLEM:
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


def satisfies(persona: Persona, answer: str, problem: Problem) -> bool:
    """What the user really thinks of `answer`: their preference, and an answer about their problem.

    A persona's preference (`persona.satisfied`) is a style; no person is satisfied by a stylish
    answer to another question, so an answer that is not `on_topic` satisfies nobody.
    """
    return persona.satisfied(answer, problem) and on_topic(answer, problem)


@dataclass
class UserSession:
    """One session of one persona: the protocol, independent of how messages are worded.

    Call `first_message()`, then `react(answer)` after every answer until a message has
    `done=True`. `first_attempts` records, per problem, whether the first answer to it satisfied
    the preference; a session *satisfies* the preference when every first answer did.

    The noise rates are probabilities per reaction; at 0 (the default) the user's reaction is a
    function of `persona.satisfied` and the rng. Whatever the user says, `first_attempts` records
    the truth, so the benchmark's ground truth never depends on the noise.
    """

    persona: Persona
    problems: list[Problem]
    rng: random.Random
    voice: Voice = field(default_factory=ScriptedVoice)
    max_turns: int = 6
    max_retries: int = 1
    wrong_rate: float = 0.0  # the user is wrong: reacts as if the answer's satisfaction were flipped
    quiet_rate: float = 0.0  # a satisfied user says nothing about it: just the next question, or leaves
    vague_rate: float = 0.0  # a complaint does not say why: a held-out complaint labelled with no directive
    move_on_rate: float = 0.0  # an unsatisfied user does not complain: just the next question, or leaves
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
        ok = satisfies(self.persona, answer, self.problem)
        if self._retries == 0:
            self.first_attempts.append(ok)
        # What the user believes decides what they say; the noise draws nothing at rate 0.
        seems_ok = ok != self._chance(self.wrong_rate)
        silent = self._chance(self.quiet_rate if seems_ok else self.move_on_rate)
        last_problem = self._current + 1 >= len(self.problems)
        out_of_turns = self.turns >= self.max_turns
        if seems_ok or silent or self._retries >= self.max_retries or out_of_turns:
            if last_problem or out_of_turns:
                done = Intent.MOVE_ON_DONE if silent else Intent.PRAISE_DONE if seems_ok else Intent.GIVE_UP_DONE
                return UserMessage(self._say(done, None, answer), done=True)
            self._current += 1
            self._retries = 0
            following = Intent.MOVE_ON_NEXT if silent else Intent.PRAISE_NEXT if seems_ok else Intent.GIVE_UP_NEXT
            return UserMessage(self._say(following, self.problem.question, answer), done=False)
        self._retries += 1
        return UserMessage(self._say(self._complaint(answer), self.problem.question, answer), done=False)

    def _chance(self, rate: float) -> bool:
        """True with probability `rate`; a rate of 0 draws nothing, so the noiseless user's rng stream is unchanged."""
        return rate > 0 and self.rng.random() < rate

    def _complaint(self, answer: str) -> Intent:
        """Vague, a re-ask, or a correction that names what is wrong: the topic, the result (the strict
        student), the look, or the missing working."""
        if self._chance(self.vague_rate):
            return Intent.CORRECT_VAGUELY
        if not on_topic(answer, self.problem):
            return Intent.CORRECT_TOPIC
        if self.persona.evaluation.result_corrections and not result_correct(answer, self.problem):
            return Intent.CORRECT_RESULT
        if self.rng.random() < 0.25:
            return Intent.REASK
        if self.persona.evaluation.step_corrections and not has_markup(answer):
            return Intent.CORRECT_STEPS
        return Intent.CORRECT

    def _say(self, intent: Intent, question: str | None, answer: str | None) -> str:
        return self.voice.say(Cue(intent, self.persona, question, answer), self.rng)
