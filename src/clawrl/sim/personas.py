"""Who the simulated users are: their hidden preferences, and every phrasing they and the tiny model's
pre-training use (DESIGN §8; how a session plays out is ``clawrl.sim.users``).

A persona pairs a preference detector (``answers.py``) with two pools of requests that share no
hint string (issue 12): ``pretraining``, what the tiny model is pre-trained on (``clawrl.sim.chats``),
and ``evaluation``, what the simulated user says. Its praise and vague complaints come from the held-out
part of the judge's labelled corpus (``held_out_reactions``), words the offline judge was never tuned on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache

from clawrl.judge.corpus import TUNING, load_part
from clawrl.judge.rule import rule_hints
from clawrl.sim.answers import (
    TEACHER_MIN_WORDS,
    TERSE_MAX_WORDS,
    student_satisfied,
    student_strict_satisfied,
    teacher_satisfied,
    terse_satisfied,
)
from clawrl.sim.corpus import Problem

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
