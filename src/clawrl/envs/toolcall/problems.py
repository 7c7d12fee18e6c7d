"""Procedurally generated problems with verifiable answers, for the tool-call family.

Four kinds (arithmetic, number theory, unit conversion, word problems) at three difficulty levels.
A problem is a pure function of its id, `<kind>-<level>-<index>`, so every machine generates the
same one; each carries its exact answer and a short Python program that computes it from the
problem's numbers (what the oracle policy runs through the `python` tool).

Splits are disjoint by content, not only by id: a problem belongs to eval exactly when a hash of
its question text says so, so the same question can never be in both splits.

Answers are compared as exact rationals (`parse_number`): integers, decimals and simple fractions
are equal when their values are (`0.5`, `1/2` and `2/4` are one answer); a leading `$`, thousands
commas, a trailing full stop and a trailing unit word (`2500 m`) are ignored; anything else (an
expression, words, two numbers) is wrong.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from clawrl.envs.protocol import Split

KINDS = ("arithmetic", "number_theory", "units", "word")
LEVELS = (1, 2, 3)
_EVAL_SHARE = 5  # one problem in five is eval (by question hash)
_NUMBER = re.compile(r"\$?\s*(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+)(?:\s*/\s*(\d+))?\s*[A-Za-z%°\s]*\.?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    answer: Fraction
    solution_code: str  # prints the answer when run with python3

    @property
    def split(self) -> Split:
        digest = hashlib.sha256(self.question.encode()).digest()
        return "eval" if digest[0] % _EVAL_SHARE == 0 else "train"


def problem(problem_id: str) -> Problem:
    """The problem an id names; ValueError for an id that names none."""
    kind, level, index = _parse_id(problem_id)
    rng = random.Random(f"toolcall:{kind}:{level}:{index}")  # str seeds are stable across runs
    question, answer, code = _GENERATORS[kind](rng, level)
    return Problem(problem_id, question, Fraction(answer), code)


def problem_ids(split: Split, count: int, kinds: Sequence[str] = KINDS, levels: Sequence[int] = LEVELS,
                skip: int = 0) -> list[str]:
    """The first `count` problems of a split after the first `skip`, drawn from `kinds` and `levels` interleaved.

    Restricting kinds and levels gives a micro split; a split of one kind and level holds the same
    problems as that kind and level do in the whole split, in the same order.
    """
    unknown = [kind for kind in kinds if kind not in KINDS] + [str(level) for level in levels if level not in LEVELS]
    if unknown or not kinds or not levels:
        raise ValueError(f"no tool-call problems of kind or level {', '.join(unknown) or '(none given)'}: "
                         f"kinds are {', '.join(KINDS)}; levels {', '.join(map(str, LEVELS))}")
    chosen: list[str] = []
    index = 0
    while len(chosen) < skip + count:
        kind, level = kinds[index % len(kinds)], levels[index // len(kinds) % len(levels)]
        candidate = f"{kind}-{level}-{index // (len(kinds) * len(levels))}"
        if problem(candidate).split == split:
            chosen.append(candidate)
        index += 1
    return chosen[skip:]


def final_answer(text: str) -> str:
    """The answer a final message gives: the last `\\boxed{...}`, else the whole text."""
    boxed = _BOXED.findall(text)
    return (boxed[-1] if boxed else text).strip()


def parse_number(text: str) -> Fraction | None:
    """The exact value of an answer, or None when it is not a single number (see the module doc)."""
    match = _NUMBER.fullmatch(text.strip())
    if match is None:
        return None
    value = Fraction(match.group(1).replace(",", ""))
    if match.group(2) is not None:
        if int(match.group(2)) == 0:
            return None
        value /= int(match.group(2))
    return value


def _parse_id(problem_id: str) -> tuple[str, int, int]:
    parts = problem_id.rsplit("-", 2)
    if len(parts) != 3 or parts[0] not in KINDS or not parts[1].isdigit() or int(parts[1]) not in LEVELS \
            or not parts[2].isdigit():
        raise ValueError(f"no tool-call problem {problem_id!r} (ids look like arithmetic-2-17, levels {LEVELS})")
    return parts[0], int(parts[1]), int(parts[2])


# --- generators: (rng, level) -> (question, answer, program printing the answer) ------------------


def _arithmetic(rng: random.Random, level: int) -> tuple[str, Fraction, str]:
    sign = rng.choice("+-")
    if level == 1:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        expression, exact = f"{a} {sign} {b}", f"{a} {sign} {b}"
    elif level == 2:
        a, b, c = rng.randint(12, 999), rng.randint(12, 99), rng.randint(100, 9999)
        expression, exact = f"{a} * {b} {sign} {c}", f"{a} * {b} {sign} {c}"
    else:
        a, b, c, d = (rng.randint(2, 12) for _ in range(4))
        expression, exact = f"{a}/{b} {sign} {c}/{d}", f"F({a}, {b}) {sign} F({c}, {d})"
    first, second = exact.rsplit(f" {sign} ", 1)
    value = _value(first) + (1 if sign == "+" else -1) * _value(second)
    wording = " as a fraction in lowest terms (or an integer)" if level == 3 else ""
    return f"Compute {expression}{wording}.", value, f"from fractions import Fraction as F\nprint({exact})"


def _value(term: str) -> Fraction:
    """The value of `a`, `a * b` or `F(a, b)`: the only terms _arithmetic writes."""
    numbers = [int(n) for n in re.findall(r"\d+", term)]
    if term.startswith("F("):
        return Fraction(numbers[0], numbers[1])
    return Fraction(math.prod(numbers))


def _number_theory(rng: random.Random, level: int) -> tuple[str, Fraction, str]:
    size = 10 ** (level + 1)
    choice = rng.randrange(4)
    if choice == 0:
        g = rng.randint(2, 9 * level)
        a, b = g * rng.randint(2, size // 10), g * rng.randint(2, size // 10)
        return f"What is the greatest common divisor of {a} and {b}?", Fraction(math.gcd(a, b)), (
            f"import math\nprint(math.gcd({a}, {b}))"
        )
    if choice == 1:
        a, b = rng.randint(2, size // 4), rng.randint(2, size // 4)
        return f"What is the least common multiple of {a} and {b}?", Fraction(math.lcm(a, b)), (
            f"import math\nprint(math.lcm({a}, {b}))"
        )
    if choice == 2:
        base, exponent, modulus = rng.randint(2, 50), rng.randint(5, 20 * level), rng.randint(7, size)
        return f"What is {base}^{exponent} mod {modulus}?", Fraction(pow(base, exponent, modulus)), (
            f"print(pow({base}, {exponent}, {modulus}))"
        )
    limit = rng.randint(size // 4, size)
    count = sum(1 for n in range(2, limit) if all(n % p for p in range(2, math.isqrt(n) + 1)))
    return f"How many prime numbers are less than {limit}?", Fraction(count), (
        f"import math\nprint(sum(1 for n in range(2, {limit}) if all(n % p for p in range(2, math.isqrt(n) + 1))))"
    )


# (from, to, factor): to = from * factor
_CONVERSIONS = (
    ("kilometres", "metres", 1000), ("metres", "centimetres", 100), ("hours", "minutes", 60),
    ("minutes", "seconds", 60), ("kilograms", "grams", 1000), ("litres", "millilitres", 1000),
    ("hours", "seconds", 3600), ("days", "hours", 24),
)  # fmt: skip


def _units(rng: random.Random, level: int) -> tuple[str, Fraction, str]:
    source, target, factor = rng.choice(_CONVERSIONS)
    backwards = level == 3 and rng.random() < 0.5  # e.g. metres to kilometres: a decimal answer
    if level == 1:
        amount = str(rng.randint(2, 99))
    else:
        amount = f"{rng.randint(1, 99)}.{rng.randint(1, 99):02d}".rstrip("0")
    if backwards:
        source, target = target, source
        value, program = Fraction(amount) / factor, f"F('{amount}') / {factor}"
    else:
        value, program = Fraction(amount) * factor, f"F('{amount}') * {factor}"
    return f"Convert {amount} {source} to {target}.", value, f"from fractions import Fraction as F\nprint({program})"


_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jo")


def _word(rng: random.Random, level: int) -> tuple[str, Fraction, str]:
    name = rng.choice(_NAMES)
    scale = 10 ** (level - 1)
    choice = rng.randrange(4)
    if choice == 0:
        price, count = rng.randint(2, 9) * scale, rng.randint(2, 12)
        paid = (price * count // 50 + 1) * 50
        return (f"{name} buys {count} notebooks at ${price} each and pays with ${paid}. How many dollars of change "
                f"does {name} get?"), Fraction(paid - price * count), f"print({paid} - {price} * {count})"
    if choice == 1:
        speed, hours = rng.randint(30, 120), rng.randint(2, 5 * level)
        return (f"A train travels at {speed} km/h for {hours} hours. How many kilometres does it travel?"), (
            Fraction(speed * hours)), f"print({speed} * {hours})"
    if choice == 2:
        people, each, extra = rng.randint(3, 9), rng.randint(4, 20) * scale, rng.randint(1, 2)
        total = people * each + extra
        return (f"{name} shares {total} marbles equally among {people} friends, giving each as many as possible. "
                f"How many marbles are left over?"), Fraction(total % people), f"print({total} % {people})"
    width, length = rng.randint(3, 20) * scale, rng.randint(3, 20)
    cost = rng.randint(2, 15)
    return (f"A garden is {width} m wide and {length} m long. Turf costs ${cost} per square metre. How many dollars "
            f"does turf for the whole garden cost?"), Fraction(width * length * cost), (
        f"print({width} * {length} * {cost})"
    )


_GENERATORS: dict[str, Callable[[random.Random, int], tuple[str, Fraction, str]]] = {
    "arithmetic": _arithmetic, "number_theory": _number_theory, "units": _units, "word": _word,
}  # fmt: skip
