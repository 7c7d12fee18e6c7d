"""How a worked solution reads in each of the answer styles the simulated users care about.

The tiny model is pre-trained on answers written here (``clawrl.sim.pretrain``), and the simulated
users (``clawrl.sim.users``) judge answers by detectors that look for these styles' traits:

* **AI-like**: an eager opener, a bold heading, numbered steps and a ``**Final answer**:`` line;
  what the tiny model writes by default, and what the student calls "too AI-like".
* **plain**: the same steps as sentences in one paragraph, no markup; what the student wants.
* **warm**: every step explained, a check, and encouragement for a child learning it; long and
  warm, as the teacher wants. Half of warm answers are formatted like AI-like ones, so that the
  teacher's preference is independent of the student's.
* **terse**: one short sentence, the question's numbers and the result, no working; what the
  terse user wants, and what neither the student (every calculation shown) nor the teacher (long
  and warm) accepts: the preference that conflicts with both (issue 32).

Openers differ between styles from their first word, so the style an answer is in is decided by
its first token or two: the place where learning changes the model's behaviour most visibly.
Every choice is drawn from the ``random.Random`` passed in, so a seeded caller gets the same text.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Literal

from clawrl.sim.corpus import Problem

AI_OPENERS = (
    "Great question! Let's break it down step by step.",
    "Sure! Here's a clear, step-by-step solution.",
    "Absolutely! Let's solve this together.",
    "Certainly! Below is a structured breakdown.",
    "Of course! Let's work through it carefully.",
)
AI_HEADINGS = ("**Step-by-step solution:**", "**Solution:**", "**Let's solve it:**", "### Solution")
PLAIN_OPENERS = ("", "", "Okay, so here's how it works.", "Let's see.", "Alright.", "Here's how I'd think about it.")
PLAIN_CLOSERS = (
    "So the answer is {answer}.",
    "That gives {answer}.",
    "The answer is {answer}.",
    "So it comes to {answer}.",
    "That makes {answer} in the end.",
)
WARM_OPENERS = (
    "This is a lovely one to practise with, so let's go through it slowly together.",
    "I'm happy to walk through this one with you, one small step at a time.",
    "What a nice problem! Let's take it slowly and look at each part together.",
)
WARM_READING = (
    "First, let's read the question carefully and find the numbers we need.",
    "Let's start by reading the question again and picking out the important numbers.",
)
WARM_ASIDES = (
    "Take your time with this part.",
    "It helps to say this out loud.",
    "Writing it down makes it easier to check.",
    "This is the key idea of the problem.",
    "Drawing a little picture can help here.",
)
WARM_CHECKS = (
    "We can check it by working backwards, and the numbers fit.",
    "A quick check: if we undo the last step, we get back to where we started.",
)
WARM_CLOSERS = (
    "You're doing great, keep practising!",
    "Well done for sticking with it!",
    "Great job working through this, you've got this!",
    "Keep it up, you can do it!",
)

TERSE_CLOSERS = ("so the answer is {answer}.", "so it's {answer}.", "and the answer is {answer}.")

Style = Literal["ai", "plain", "warm", "terse"]


def render_ai(problem: Problem, rng: random.Random) -> str:
    """Opener, heading, numbered steps, bold final-answer line."""
    lines = [rng.choice(AI_OPENERS), "", rng.choice(AI_HEADINGS), ""]
    lines += [f"{number}. {step}" for number, step in enumerate(problem.steps, start=1)]
    lines += ["", f"**Final answer**: {problem.answer}"]
    return "\n".join(lines)


def render_plain(problem: Problem, rng: random.Random) -> str:
    """Every step as a sentence, in one paragraph, then the answer in words."""
    parts = [rng.choice(PLAIN_OPENERS), *problem.steps, rng.choice(PLAIN_CLOSERS).format(answer=problem.answer)]
    return " ".join(part for part in parts if part)


def render_warm(problem: Problem, rng: random.Random) -> str:
    """Every step explained with an aside, a check, and encouragement; formatted half of the time."""
    explained = [f"{step} {rng.choice(WARM_ASIDES)}" for step in problem.steps]
    opening = f"{rng.choice(WARM_OPENERS)} {rng.choice(WARM_READING)}"
    check, closer = rng.choice(WARM_CHECKS), rng.choice(WARM_CLOSERS)
    if rng.random() < 0.5:
        numbered = [f"{number}. {text}" for number, text in enumerate(explained, start=1)]
        return "\n".join([opening, "", *numbered, "", check, f"**Final answer**: {problem.answer}", "", closer])
    return " ".join([opening, *explained, check, f"So the answer is {problem.answer}.", closer])


def render_terse(problem: Problem, rng: random.Random) -> str:
    """One sentence: the first step's facts (the question's numbers), then the result; no calculation."""
    facts = problem.steps[0].rstrip(".")
    return f"{facts}, {rng.choice(TERSE_CLOSERS).format(answer=problem.answer)}"


RENDERERS: dict[Style, Callable[[Problem, random.Random], str]] = {
    "ai": render_ai,
    "plain": render_plain,
    "warm": render_warm,
    "terse": render_terse,
}


def render(style: Style, problem: Problem, rng: random.Random) -> str:
    return RENDERERS[style](problem, rng)
