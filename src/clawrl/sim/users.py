"""Simulated users with hidden preferences that code can check (DESIGN §8).

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
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cache
from typing import Protocol

import httpx

from clawrl.judge.corpus import TUNING, load_part
from clawrl.judge.rule import rule_hints
from clawrl.sim.answers import (
    TEACHER_MIN_WORDS,
    TERSE_MAX_WORDS,
    has_markup,
    on_topic,
    result_correct,
    student_satisfied,
    student_strict_satisfied,
    teacher_satisfied,
    terse_satisfied,
)
from clawrl.sim.corpus import PROBLEMS, Problem

# --------------------------------------------------------------------------- personas


@dataclass(frozen=True)
class Requests:
    """The phrasings that say how an answer should be: the ones the rule judge takes hints from."""

    instructions: tuple[str, ...]  # asking for the preferred style up front
    corrections: tuple[str, ...]  # the first complaint about an answer
    step_corrections: tuple[str, ...]  # the first complaint about an answer whose only fault is missing working
    reasks: tuple[str, ...]  # the question again, with a nudge; "{question}" is replaced
    # In pre-training only: a complaint when the rewrite is still not right (the simulated user, who
    # asks for one rewrite, gives up instead)
    repeated_corrections: tuple[str, ...] = ()
    # Said by the simulated user only (pre-training has none, so the tiny model is the one it was):
    topic_corrections: tuple[str, ...] = ()  # the answer is about another problem; "{question}" is replaced
    result_corrections: tuple[str, ...] = ()  # the strict student: the result is wrong

    def complaints(self) -> tuple[str, ...]:
        return (*self.corrections, *self.step_corrections, *self.repeated_corrections, *self.reasks,
                *self.topic_corrections, *self.result_corrections)


@dataclass(frozen=True)
class Persona:
    """Who the user is, what they want (hidden), and the ways they say things."""

    name: str
    character: str  # for LLMVoice: who to play, in the second person
    preference: str  # for LLMVoice and reports: the hidden preference in words
    satisfied: Callable[[str, Problem], bool]
    openers: tuple[str, ...]  # "{question}" is replaced
    pretraining: Requests  # what the tiny model is pre-trained on; never said by the simulated user
    evaluation: Requests  # what the simulated user says; never in the pre-training corpus
    # Praise in the pre-training conversations (`clawrl.sim.chats`); the simulated user praises in
    # held-out words instead (`held_out_reactions`).
    pretraining_praise_next: tuple[str, ...]  # "{question}" is the next problem
    pretraining_praise_done: tuple[str, ...]
    # The quiet user's next question (or goodbye), with nothing said about the answer.
    move_on_next: tuple[str, ...]  # "{question}" is the next problem
    move_on_done: tuple[str, ...]

    def evaluation_phrasings(self) -> tuple[str, ...]:
        """Everything the simulated user may say in reaction to an answer, with "{question}" left empty."""
        said = (*self.evaluation.complaints(), *self.move_on_next, *self.move_on_done)
        reactions = held_out_reactions()
        return (*(text.format(question="") for text in said), *reactions.praise, *reactions.complaints)


STUDENT = Persona(
    name="student",
    character="You are a twelve-year-old doing maths homework with the help of an AI assistant.",
    preference="every step of the working shown, written as normal sentences: no bold, no headings, no numbered lists",
    satisfied=student_satisfied,
    openers=("{question}", "{question}", "can you help me with this one? {question}", "homework question: {question}",
             "how do I solve this: {question}"),
    pretraining=Requests(
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
    ),
    evaluation=Requests(
        instructions=(
            "Please skip the markdown and talk me through each step in sentences.",
            "Keep it plain: ordinary sentences, all the working, and nothing in bold.",
            "Can you avoid headings and numbered points and just explain each calculation?",
            "I'd like it as a normal explanation, every sum shown, with no formatting at all.",
        ),
        corrections=(
            "too AI-like for me. rewrite it in ordinary sentences, with no bold and no numbered points",
            "hmm, that's not it. please drop the bold and the list and just talk me through each step",
            "that reads like a chatbot. rewrite it as a normal explanation, no headings or bold text",
            "nope, too formatted. please just use ordinary sentences and keep all the working",
            "not what I wanted. avoid the bold and the numbering, and explain each step like you're talking to me",
        ),
        step_corrections=(
            "you missed some steps of the working. rewrite it so each calculation is written out",
            "that's not enough for me to follow. please write out every step as a sentence with its sum",
        ),
        reasks=(
            "{question} That's not what I asked for. Please skip the bold and the numbered list and write each step "
            "as a sentence.",
            "Asking again: {question} Try again. Use ordinary sentences with no formatting and show each step of the sum.",
        ),
        topic_corrections=(
            "that's not what I asked, those aren't my numbers. please answer this one: {question}",
            "this is wrong, it's not my problem. please do this one: {question}",
        ),
    ),
    pretraining_praise_next=(
        "thanks! next one: {question}",
        "perfect, that's how I like it. {question}",
        "great, thank you. another one: {question}",
        "nice, got it. {question}",
        "ok, moving on. {question}",
    ),
    pretraining_praise_done=("thanks, that's all for today!", "great, I'm done. thank you!",
                             "perfect, that's everything. bye!"),
    move_on_next=("{question}", "{question}", "another one: {question}"),
    move_on_done=("that's all for now.", "I have to go.", "bye"),
)

TEACHER = Persona(
    name="teacher",
    character="You are a primary-school teacher preparing worked examples for your class of ten-year-olds.",
    preference=f"a detailed explanation (at least {TEACHER_MIN_WORDS} words) with warm, encouraging words for the children",
    satisfied=teacher_satisfied,
    openers=("{question}", "Could you solve this one for my class? {question}", "For tomorrow's worksheet: {question}"),
    pretraining=Requests(
        instructions=(
            "Please explain it in detail and be encouraging, it's for my pupils.",
            "Make it detailed and warm, with some encouragement for the kids.",
            "Explain every step slowly and cheer the children on.",
        ),
        corrections=(
            "not quite what I need for my class. rewrite it with more detail and a few warm words of encouragement",
            "too short and a bit cold for kids. try again, and please explain every step in more detail, with some "
            "encouragement",
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
    ),
    evaluation=Requests(
        instructions=(
            "It's for children, so please go through it at length and add a few kind words.",
            "Give a long, gentle explanation and tell the pupils they're doing well.",
            "Please be thorough and supportive, my class needs a bit of confidence.",
        ),
        corrections=(
            "not quite right for my pupils. rewrite it at more length, with some kind words to cheer them up",
            "too brief and too dry for children. try again, and make it fuller with a few encouraging words",
            "that's not enough for ten-year-olds. please go through it slowly and add a little encouragement at the end",
            "no, my class needs more than this. please explain each part at length and tell them they're doing well",
        ),
        step_corrections=(),
        reasks=(
            "{question} That's not what I need. Please give a longer explanation with some encouragement for my class.",
            "Once more: {question} Try again, and make it thorough and kind, it's for children.",
        ),
        topic_corrections=(
            "this is wrong, it's not the problem on my worksheet. please do this one: {question}",
            "that's not what I asked, those aren't the numbers from my question. please answer this one: {question}",
        ),
    ),
    pretraining_praise_next=(
        "lovely, thank you! that's perfect for the class. next: {question}",
        "great, the kids will like this. thanks! another one: {question}",
        "perfect, thank you. {question}",
    ),
    pretraining_praise_done=("thank you, that's all I needed for tomorrow!", "great, that's everything. thanks!"),
    move_on_next=("{question}", "next one: {question}", "{question}"),
    move_on_done=("that's all for now.", "I have to go.", "bye for now"),
)


TERSE = Persona(
    name="terse",
    character="You are a busy parent checking your child's homework answers between meetings.",
    preference=f"the result in one short sentence (at most {TERSE_MAX_WORDS} words): no working, no lists, no pleasantries",
    satisfied=terse_satisfied,
    openers=("{question}", "quick one: {question}", "{question} what's the answer?"),
    pretraining=Requests(
        instructions=(
            "Just the answer in one sentence, please.",
            "Keep it to a single short sentence.",
            "No explanation needed, one sentence with the result.",
        ),
        corrections=(
            "too long. give me just the result in one sentence",
            "I don't need all that. answer in a single short sentence",
            "way too much. rewrite it as one short sentence with the answer",
            "no, shorter. one sentence is enough",
        ),
        step_corrections=(),  # the terse user never asks for working
        repeated_corrections=(
            "still too long. just one sentence please",
            "that's not short. rewrite it as a single sentence",
        ),
        reasks=(
            "{question} Try again, and please answer in one short sentence.",
            "I'll ask again: {question} That's too long: just the result, in one sentence.",
        ),
    ),
    evaluation=Requests(
        instructions=(
            "Skip the explanation and tell me the result in a line.",
            "I'm in a hurry, so a brief reply with only the result.",
            "Answer briefly: a single line, nothing more.",
        ),
        corrections=(
            "that's far more than I need. cut it down to a brief line with the result",
            "hmm, too wordy for me. reply in a line with only the result",
            "not what I wanted. skip the explanation and reply briefly",
            "nope, I only need the result. make it a brief line",
        ),
        step_corrections=(),
        reasks=(
            "{question} That's not what I asked for. Reply in a line with the result, nothing more.",
            "Asking again: {question} Try again, briefly this time: only the result.",
        ),
        topic_corrections=(
            "that's not what I asked, those aren't my numbers. please answer this one: {question}",
            "this is wrong, it's not my question. please do this one: {question}",
        ),
    ),
    pretraining_praise_next=(
        "perfect, thanks. {question}",
        "great, exactly what I needed. next: {question}",
        "ok thanks. {question}",
    ),
    pretraining_praise_done=("thanks, that's all.", "great, done. thanks!"),
    move_on_next=("{question}", "next: {question}", "{question}"),
    move_on_done=("that's all.", "gotta go.", "bye"),
)


def evaluation_hints(persona: Persona) -> set[str]:
    """Every hint the rule judge can take from what the simulated user says, and its instructions.

    What must never appear among the pre-training corpus's hints (``clawrl.sim.chats``).
    """
    extracted = {hint for text in persona.evaluation_phrasings()
                 for hint in rule_hints([{"role": "user", "content": text}])}
    return extracted | set(persona.evaluation.instructions)


# The student who also checks the sums: satisfied only by the student's style, on the problem asked,
# with the right result; says so when the result is wrong. Pre-trained on nothing of its own (the
# tiny model's corpus has the student, the teacher and the terse user only, `PRETRAINING_PERSONAS`).
STUDENT_STRICT = replace(
    STUDENT,
    name="student-strict",
    preference=f"{STUDENT.preference}; and the right result",
    satisfied=student_strict_satisfied,
    evaluation=replace(STUDENT.evaluation, result_corrections=(
        "the working looks nice but the result is wrong. check the sums again and show each step",
        "that's not the right answer, I checked it. please redo the calculation step by step, in sentences",
    )),
)
PRETRAINING_PERSONAS = (STUDENT, TEACHER, TERSE)  # whom the tiny model's pre-training conversations are with
PERSONAS: dict[str, Persona] = {persona.name: persona for persona in (STUDENT, TEACHER, STUDENT_STRICT, TERSE)}


# --------------------------------------------------------------------------- held-out reactions

HELD_OUT_PART = "held_out"  # the corpus part the offline judge is never tuned on (`clawrl.judge.corpus`)
PRAISE_STYLES = ("praise", "one_word", "emoji")
COMPLAINT_STYLES = ("complaint_no_direction", "one_word")


@dataclass(frozen=True)
class Reactions:
    """What the simulated user says about an answer when it asks for no change, in words the judge was not tuned on."""

    praise: tuple[str, ...]  # scored +1 by the corpus's labellers
    complaints: tuple[str, ...]  # scored -1, with no directive in them


@cache
def held_out_reactions(language: str = "en") -> Reactions:
    """The held-out corpus's replies of the kinds a user says about an answer, chosen by their labels alone.

    Nobody picked them by reading them: every reply of the language, the styles and the score
    qualifies, whatever the judge makes of it, except any that the tuning part also has word for
    word (a bare emoji, say): the judge was tuned on those.
    """
    tuned = {_plain(item.reply) for item in load_part(TUNING)}
    replies = [item for item in load_part(HELD_OUT_PART)
               if item.role == "user" and item.language == language and _plain(item.reply) not in tuned]
    return Reactions(
        praise=tuple(item.reply for item in replies if item.style in PRAISE_STYLES and item.score == 1),
        complaints=tuple(item.reply for item in replies
                         if item.style in COMPLAINT_STYLES and item.score == -1 and item.hint is None),
    )


def _plain(text: str) -> str:
    return " ".join(text.lower().split())


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
