"""The conversations the tiny model is pre-trained on (``clawrl.sim.pretrain``).

Word problems from the shared corpus, asked the way the simulated users ask them, answered in the
styles of ``clawrl.sim.styles``:

* without an instruction, in the default mix: AI-like most of the time, plain or warm sometimes,
  so that a user's preference is reachable without help and binary RL has successes to reinforce
  (another mix, `STYLE_MIXES` or explicit weights, makes another model: `PretrainConfig.styles`);
* with a style instruction in the message, a ``[Hint]`` appended to it (the exact format of
  ``clawrl.messages.teacher_messages``, with the hints the rule judge extracts from the
  personas' complaints), a complaint earlier in the conversation, or notes in the system
  prompt (the memory arm's format, ``clawrl.sim.memory``): the requested style, almost always.

Every instruction, complaint and hint comes from the personas' *pre-training* pool
(``Persona.pretraining``); the simulated users speak the evaluation pool, which shares no hint
string with it (``hint_strings_shared_with_pretraining``, 0 by test), so what the benchmark
measures is following requests worded in ways the model has never seen.

A new problem later in a conversation is answered in the default mix again: the tiny model does
not carry a correction over to the next question, so every answer in a session is a fresh sample
of the policy. Everything is drawn from the ``random.Random`` passed in.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable

from clawrl.messages import teacher_messages
from clawrl.judge.rule import rule_hints
from clawrl.sim.corpus import STYLE_INSTRUCTIONS
from clawrl.sim.memory import DEFAULT_SYSTEM_PROMPT, system_prompt_with_notes
from clawrl.sim.personas import PERSONAS, PRETRAINING_PERSONAS, STUDENT, TEACHER, TERSE, Persona, evaluation_hints
from clawrl.sim.styles import Style, render
from clawrl.sim.users import problems

Chat = list[dict[str, str]]

# Without an instruction: AI-like most of the time. Plain satisfies the student; warm the teacher
# (and, when it is not formatted, the student too); terse the terse user alone.
DEFAULT_STYLES: dict[Style, float] = {"ai": 0.7, "plain": 0.14, "warm": 0.1, "terse": 0.06}
# Other unprompted mixes the tiny model can be pre-trained with (`PretrainConfig.styles`,
# `clawrl bench learn --pretrain-styles`): `balanced` answers in each style a quarter of the time,
# so that the teacher's and the terse user's styles are as reachable without help as the student's.
STYLE_MIXES: dict[str, dict[Style, float]] = {
    "default": DEFAULT_STYLES,
    "balanced": {"ai": 0.25, "plain": 0.25, "warm": 0.25, "terse": 0.25},
}
FOLLOW_RATE = 0.96  # how often an instruction, hint, correction or note is followed
SYSTEM_PROMPTS = (None, DEFAULT_SYSTEM_PROMPT, "You are a friendly assistant.", "You help people with maths homework.")
CLOSINGS = ("You're welcome!", "Glad I could help. Good luck!", "Anytime! Have a good day.", "Happy to help.")
# Who wants which style; the "ai" requester exists so that following is about the words, not a
# shortcut from "any instruction" to "plain".
PREFERRED: dict[str, Style] = {"student": "plain", "teacher": "warm", "terse": "terse", "ai": "ai"}


def style_mix(text: str) -> dict[Style, float]:
    """A named mix of `STYLE_MIXES`, or explicit weights `ai=0.4,plain=0.2,warm=0.2,terse=0.2`
    (every style named once, weights non-negative, at least one positive; they need not sum to 1)."""
    text = text.strip()
    if text in STYLE_MIXES:
        return STYLE_MIXES[text]
    weights: dict[str, float] = {}
    for part in (part.strip() for part in text.split(",")):
        name, equals, value = part.partition("=")
        try:
            weight = float(value) if equals else -1.0
        except ValueError:
            weight = -1.0
        if name.strip() not in DEFAULT_STYLES or name.strip() in weights or not weight >= 0 or math.isinf(weight):
            raise ValueError(f"not a style mix: {text!r} (a name of {', '.join(STYLE_MIXES)}, or weights for each of "
                             f"{', '.join(DEFAULT_STYLES)}, e.g. ai=0.4,plain=0.2,warm=0.2,terse=0.2)")
        weights[name.strip()] = weight
    if set(weights) != set(DEFAULT_STYLES) or not sum(weights.values()) > 0:
        raise ValueError(f"a style mix names every style of {', '.join(DEFAULT_STYLES)} with a positive total: {text!r}")
    return {style: weights[style] for style in DEFAULT_STYLES}  # type: ignore[misc]


def default_style(rng: random.Random, styles: dict[Style, float] = DEFAULT_STYLES) -> Style:
    return rng.choices(list(styles), weights=list(styles.values()))[0]


def _followed(requester: str, rng: random.Random, styles: dict[Style, float] = DEFAULT_STYLES) -> Style:
    return PREFERRED[requester] if rng.random() < FOLLOW_RATE else default_style(rng, styles)


def _hints(persona: Persona) -> list[str]:
    """Hints the way the rule judge extracts them from this persona's pre-training complaints, plus its instructions."""
    requests = persona.pretraining
    extracted = [hint for text in requests.complaints()
                 for hint in rule_hints([{"role": "user", "content": text.format(question="")}])]
    return sorted(set(extracted) | set(requests.instructions))


HINTS: dict[str, list[str]] = {
    "student": _hints(STUDENT),
    "teacher": _hints(TEACHER),
    "terse": _hints(TERSE),
    "ai": list(STYLE_INSTRUCTIONS["ai"]),
}
INSTRUCTIONS: dict[str, tuple[str, ...]] = {
    "student": STUDENT.pretraining.instructions,
    "teacher": TEACHER.pretraining.instructions,
    "terse": TERSE.pretraining.instructions,
    "ai": STYLE_INSTRUCTIONS["ai"],
}


def _normalised(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9']+", text.lower()))


def hint_strings_shared_with_pretraining() -> int:
    """How many of the simulated users' hints (``evaluation_hints``) the pre-training corpus contains.

    A hint counts as shared when, ignoring case and punctuation, it equals, contains or is contained
    in a pre-training hint: any of these would let the model recall a memorised mapping instead of
    reading the words. It must be 0.
    """
    seen = {_normalised(hint) for hints in HINTS.values() for hint in hints}
    unseen = {_normalised(hint) for persona in PERSONAS.values() for hint in evaluation_hints(persona)}
    return sum(any(hint in other or other in hint for other in seen) for hint in unseen)


def _requester(rng: random.Random) -> str:
    return rng.choices(("student", "teacher", "terse", "ai"), weights=(0.35, 0.3, 0.2, 0.15))[0]


def _start(rng: random.Random) -> Chat:
    system = rng.choice(SYSTEM_PROMPTS)
    return [{"role": "system", "content": system}] if system else []


def ask(persona: Persona, question: str, rng: random.Random) -> str:
    return rng.choice(persona.openers).format(question=question)


def default_chat(rng: random.Random, styles: dict[Style, float] = DEFAULT_STYLES) -> Chat:
    """A question with no instruction, answered in the unprompted style mix."""
    problem = problems(rng, 1)[0]
    persona = rng.choice(PRETRAINING_PERSONAS)
    return [*_start(rng), {"role": "user", "content": ask(persona, problem.question, rng)},
            {"role": "assistant", "content": render(default_style(rng, styles), problem, rng)}]


def instructed_chat(rng: random.Random, styles: dict[Style, float] = DEFAULT_STYLES) -> Chat:
    """A style instruction before or after the question, followed."""
    problem, requester = problems(rng, 1)[0], _requester(rng)
    instruction = rng.choice(INSTRUCTIONS[requester])
    user = f"{problem.question} {instruction}" if rng.random() < 0.6 else f"{instruction} {problem.question}"
    return [*_start(rng), {"role": "user", "content": user},
            {"role": "assistant", "content": render(_followed(requester, rng, styles), problem, rng)}]


def hinted_chat(rng: random.Random, styles: dict[Style, float] = DEFAULT_STYLES) -> Chat:
    """The OPD teacher's prompt: a hint appended to the last user message, followed."""
    problem, requester = problems(rng, 1)[0], _requester(rng)
    persona = PERSONAS.get(requester, STUDENT)
    messages = teacher_messages([*_start(rng), {"role": "user", "content": ask(persona, problem.question, rng)}],
                                rng.choice(HINTS[requester]))
    return [*messages, {"role": "assistant", "content": render(_followed(requester, rng, styles), problem, rng)}]


def corrected_chat(rng: random.Random, styles: dict[Style, float] = DEFAULT_STYLES) -> Chat:
    """A session as the simulated users play it: complaints are followed, praise moves on."""
    persona = rng.choice(PRETRAINING_PERSONAS)
    asked = problems(rng, rng.randint(1, 2))
    messages = [*_start(rng), {"role": "user", "content": ask(persona, asked[0].question, rng)}]
    for index, problem in enumerate(asked):
        style = default_style(rng, styles)
        messages.append({"role": "assistant", "content": render(style, problem, rng)})
        if not persona.satisfied(messages[-1]["content"], problem):
            complaint = rng.choice((*persona.pretraining.corrections, *persona.pretraining.reasks))
            messages.append({"role": "user", "content": complaint.format(question=problem.question)})
            messages.append({"role": "assistant", "content": render(_followed(persona.name, rng, styles), problem, rng)})
        if index + 1 < len(asked):
            praise = rng.choice(persona.pretraining_praise_next).format(question=asked[index + 1].question)
            messages.append({"role": "user", "content": praise})
    if rng.random() < 0.5:
        messages += [{"role": "user", "content": rng.choice(persona.pretraining_praise_done)},
                     {"role": "assistant", "content": rng.choice(CLOSINGS)}]
    return messages


def remembered_chat(rng: random.Random, styles: dict[Style, float] = DEFAULT_STYLES) -> Chat:
    """Notes from earlier sessions in the system prompt (the memory arm's format), followed."""
    problem, requester = problems(rng, 1)[0], _requester(rng)
    notes = rng.sample(HINTS[requester], k=min(len(HINTS[requester]), rng.randint(1, 3)))
    system = system_prompt_with_notes(notes, base=rng.choice(SYSTEM_PROMPTS[1:]))
    persona = PERSONAS.get(requester, STUDENT)
    return [{"role": "system", "content": system}, {"role": "user", "content": ask(persona, problem.question, rng)},
            {"role": "assistant", "content": render(_followed(requester, rng, styles), problem, rng)}]


CHATS: tuple[tuple[Callable[[random.Random, dict[Style, float]], Chat], float], ...] = (
    (default_chat, 0.35),
    (instructed_chat, 0.15),
    (hinted_chat, 0.2),
    (corrected_chat, 0.15),
    (remembered_chat, 0.15),
)


def chat(rng: random.Random, styles: dict[Style, float] = DEFAULT_STYLES) -> Chat:
    """One pre-training conversation; `styles` is the unprompted style mix (the default's draws are today's)."""
    kinds, weights = zip(*CHATS)
    return rng.choices(kinds, weights=weights)[0](rng, styles)
