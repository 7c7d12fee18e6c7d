"""A deterministic synthetic English corpus for the tiny model.

The tiny model (``clawrl.sim.tiny``) must be buildable with no download, so its tokenizer is
trained on text generated here from hand-written templates. The same corpus is meant to be the
starting point for pre-training the tiny model later, so it covers the kinds of text the demo
loop produces and consumes:

* everyday narrative prose, for general English vocabulary;
* short dialogues between a user and an assistant, including the feedback a simulated user
  gives ("thanks", "too AI-like, rewrite it without the bold", ...);
* grade-school word problems with worked solutions in two styles: an "AI-like" one (bold,
  numbered steps, a ``**Final answer**:`` line) and plain natural prose, sometimes preceded by
  an instruction that asks for that style, so a model can learn to follow it;
* tool definitions, tool calls (``<tool_call>`` blocks) and tool results as JSON;
* Python code and Python tracebacks.

Everything is drawn from a ``random.Random(seed)``, never from global state or set/dict order
that depends on hashing, so ``build_corpus(seed)`` returns the same list on every run.

To add a new kind of text, write a ``(rng) -> str`` function and register it in ``GENERATORS``
with a weight.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

# About 300 KB: enough text for a 2K-token BPE vocabulary, small enough to build in a second.
TARGET_CHARS = 300_000

Generator = Callable[[random.Random], str]

NAMES = (
    "Ava", "Ben", "Chen", "Diego", "Emma", "Farah", "Gus", "Hana", "Ivan", "Jia", "Kofi",
    "Lena", "Mateo", "Nia", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Vera",
    "Wei", "Yusuf", "Zoë", "José", "Mia", "Noah", "Leo", "Aisha",
)
# (singular, plural) so sentences read naturally for any count.
ITEMS = (
    ("apple", "apples"), ("pencil", "pencils"), ("sticker", "stickers"), ("marble", "marbles"),
    ("cookie", "cookies"), ("book", "books"), ("card", "cards"), ("shell", "shells"),
    ("stamp", "stamps"), ("cupcake", "cupcakes"), ("balloon", "balloons"), ("toy car", "toy cars"),
)
CONTAINERS = ("box", "bag", "jar", "basket", "crate", "pack")
SHE_NAMES = frozenset({"Ava", "Emma", "Farah", "Hana", "Jia", "Lena", "Nia", "Priya", "Rosa", "Uma", "Vera",
                       "Zoë", "Mia", "Aisha"})


def _pronoun(name: str) -> str:
    """A fixed pronoun per name, so a problem's sentences agree with each other."""
    return "she" if name in SHE_NAMES else "he"


def _noun(count: int, item: tuple[str, str]) -> str:
    return f"{count} {item[0] if count == 1 else item[1]}"


def _plural(word: str) -> str:
    return f"{word}es" if word.endswith("x") else f"{word}s"


# --------------------------------------------------------------------------- word problems


@dataclass(frozen=True)
class Problem:
    """A word problem: the question, the solution as full sentences, and the answer."""

    question: str
    steps: tuple[str, ...]
    answer: str


def _problem_add(rng: random.Random) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(3, 60), rng.randint(2, 40)
    he = _pronoun(name)
    question = rng.choice((
        f"{name} has {_noun(a, item)}. {he.capitalize()} gets {b} more. How many {item[1]} does {name} have now?",
        f"{name} collected {_noun(a, item)} on Monday and {_noun(b, item)} on Tuesday. "
        f"How many {item[1]} did {he} collect in all?",
    ))
    steps = (
        f"{name} starts with {_noun(a, item)}.",
        f"Adding the {b} new ones gives {a} + {b} = {a + b}.",
    )
    return Problem(question, steps, str(a + b))


def _problem_subtract(rng: random.Random) -> Problem:
    name, friend, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
    a = rng.randint(10, 90)
    b = rng.randint(1, a - 1)
    question = rng.choice((
        f"{name} had {_noun(a, item)} and gave {b} to {friend}. How many {item[1]} are left?",
        f"There were {_noun(a, item)} on the table. {name} took {b} of them. How many {item[1]} remain on the table?",
    ))
    steps = (
        f"At the start there are {_noun(a, item)}.",
        f"Taking away {b} leaves {a} - {b} = {a - b}.",
    )
    return Problem(question, steps, str(a - b))


def _problem_multiply(rng: random.Random) -> Problem:
    name, item, box = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(CONTAINERS)
    n, k = rng.randint(2, 12), rng.randint(2, 15)
    question = rng.choice((
        f"{name} buys {n} {_plural(box)} of {item[1]}. Each {box} holds {k} {item[1]}. How many {item[1]} does {name} buy?",
        f"A shop puts {k} {item[1]} in every {box}. How many {item[1]} are in {n} full {_plural(box)}?",
    ))
    steps = (
        f"Each {box} holds {k} {item[1]}, and there are {n} of them.",
        f"Multiplying gives {n} × {k} = {n * k}.",
    )
    return Problem(question, steps, str(n * k))


def _problem_divide(rng: random.Random) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    friends, each = rng.randint(2, 9), rng.randint(2, 12)
    total = friends * each
    question = (
        f"{name} shares {_noun(total, item)} equally among {friends} friends. "
        f"How many {item[1]} does each friend get?"
    )
    steps = (
        f"There are {_noun(total, item)} to share between {friends} friends.",
        f"Dividing gives {total} ÷ {friends} = {each}.",
    )
    return Problem(question, steps, str(each))


def _problem_money(rng: random.Random) -> Problem:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    qty, price = rng.randint(2, 9), rng.randint(1, 8)
    cost = qty * price
    bill = next(b for b in (5, 10, 20, 50, 100) if b >= cost)
    question = (
        f"{item[0].capitalize()}s cost ${price} each. {name} buys {qty} of them and pays with a "
        f"${bill} bill. How much change does {_pronoun(name)} get?"
    )
    steps = (
        f"The {item[1]} cost {qty} × ${price} = ${cost}.",
        f"The change is ${bill} - ${cost} = ${bill - cost}.",
    )
    return Problem(question, steps, f"${bill - cost}")


def _problem_speed(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    vehicle = rng.choice(("bike", "car", "train", "bus", "boat"))
    speed, hours = rng.randint(8, 90), rng.randint(2, 6)
    question = (
        f"{name} travels by {vehicle} at {speed} km per hour for {hours} hours. "
        f"How far does {_pronoun(name)} go?"
    )
    steps = (
        "Distance is speed times time.",
        f"So the distance is {speed} × {hours} = {speed * hours} km.",
    )
    return Problem(question, steps, f"{speed * hours} km")


def _problem_two_step(rng: random.Random) -> Problem:
    name, item, box = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(("pack", "bag", "jar"))
    start, packs, per = rng.randint(1, 20), rng.randint(2, 6), rng.randint(3, 10)
    total = start + packs * per
    given = rng.randint(1, total - 1)
    question = (
        f"{name} has {_noun(start, item)}. {_pronoun(name).capitalize()} buys {packs} {box}s with "
        f"{per} {item[1]} in each, then gives {given} away. How many {item[1]} does {name} have now?"
    )
    steps = (
        f"The {box}s hold {packs} × {per} = {packs * per} {item[1]}.",
        f"Together with the first ones that makes {start} + {packs * per} = {total}.",
        f"After giving {given} away, {total} - {given} = {total - given} are left.",
    )
    return Problem(question, steps, str(total - given))


def _problem_rectangle(rng: random.Random) -> Problem:
    thing = rng.choice(("garden", "rug", "poster", "table top", "playground"))
    w, h = rng.randint(2, 20), rng.randint(2, 20)
    if rng.random() < 0.5:
        question = f"A {thing} is {w} m wide and {h} m long. What is its area?"
        steps = ("The area of a rectangle is width times length.", f"So it is {w} × {h} = {w * h} square metres.")
        return Problem(question, steps, f"{w * h} square metres")
    question = f"A {thing} is {w} m wide and {h} m long. What is its perimeter?"
    steps = ("The perimeter is twice the width plus twice the length.", f"So it is 2 × {w} + 2 × {h} = {2 * (w + h)} m.")
    return Problem(question, steps, f"{2 * (w + h)} m")


PROBLEMS: tuple[Callable[[random.Random], Problem], ...] = (
    _problem_add, _problem_subtract, _problem_multiply, _problem_divide,
    _problem_money, _problem_speed, _problem_two_step, _problem_rectangle,
)

AI_OPENERS = (
    "Great question! Let's break it down step by step.",
    "Sure! Here's a clear, step-by-step solution.",
    "Absolutely! Let's solve this together.",
    "Certainly! Below is a structured breakdown.",
)
PLAIN_OPENERS = ("", "Sure.", "Okay, so", "Let's see.", "Happy to help with this one.", "Good one!")
PLAIN_CLOSERS = (
    "So the answer is {answer}.",
    "That gives {answer}.",
    "The answer is {answer}.",
    "So it comes to {answer}. Hope that helps!",
    "Final count: {answer}.",
)
STYLE_INSTRUCTIONS = {
    "ai": (
        "Use a structured format with bold headings, numbered steps and a final answer line.",
        "Format the solution with numbered steps and end with **Final answer**.",
    ),
    "plain": (
        "Write plainly, like a person would: no bold, no lists, just a couple of sentences.",
        "Please don't sound like an AI. No bold, no numbered lists.",
        "Answer in a short, warm paragraph without any formatting.",
    ),
}


def render_ai_style(problem: Problem, rng: random.Random) -> str:
    """The formatted style the simulated users call "too AI-like"."""
    lines = [rng.choice(AI_OPENERS), "", "**Step-by-step solution:**", ""]
    lines += [f"{i}. {step}" for i, step in enumerate(problem.steps, start=1)]
    lines += ["", f"**Final answer**: {problem.answer}"]
    return "\n".join(lines)


def render_plain_style(problem: Problem, rng: random.Random) -> str:
    """The natural-prose style: one paragraph, no markup, a closing answer sentence."""
    parts = [rng.choice(PLAIN_OPENERS), *problem.steps, rng.choice(PLAIN_CLOSERS).format(answer=problem.answer)]
    return " ".join(part for part in parts if part)


def word_problem(rng: random.Random) -> str:
    """A question and a worked solution, sometimes preceded by an instruction naming the style."""
    problem = rng.choice(PROBLEMS)(rng)
    style = rng.choice(("ai", "plain"))
    render = render_ai_style if style == "ai" else render_plain_style
    header = f"Instruction: {rng.choice(STYLE_INSTRUCTIONS[style])}\n" if rng.random() < 0.5 else ""
    return f"{header}Question: {problem.question}\nAnswer: {render(problem, rng)}\n"


# --------------------------------------------------------------------------- dialogues

TOPICS = (
    ("a quick dinner idea", ("Try a vegetable stir-fry with rice; it takes about twenty minutes.",
                             "Pasta with garlic, olive oil and spinach is quick and cheap.")),
    ("a good book to read this weekend", ("If you like mysteries, try an Agatha Christie novel.",
                                          "A short story collection is nice when you only have a little time.")),
    ("falling asleep faster", ("Keep the room cool and put your phone away half an hour before bed.",
                                   "A regular bedtime helps more than most tricks.")),
    ("packing for a rainy trip", ("Bring a light rain jacket, spare socks and shoes that dry fast.",
                                       "An umbrella and a waterproof bag for your phone are worth it.")),
    ("getting started with running", ("Start with short runs mixed with walking, three times a week.",
                              "Go slowly enough that you could still talk while running.")),
    ("a birthday gift for my sister", ("A book by an author she likes, or tickets to a show you can see together.",
                                       "Something handmade, like a photo album, usually means a lot.")),
    ("watering a cactus", ("Water it deeply, then wait until the soil is completely dry.",
                               "In winter, once a month is usually enough.")),
    ("a polite email to my landlord", ("Keep it short: say what the problem is, when it started, and what you'd like done.",
                                                     "Open with a greeting, state the issue clearly, and thank them at the end.")),
)
USER_OPENERS = ("Hi! Can you help me with {topic}?", "hey, any tips on {topic}?", "I could use some help with {topic}.",
                "Could you help me with {topic}?", "Any thoughts on {topic}?")
ASSISTANT_PREFIXES = ("", "Sure! ", "Of course. ", "Good question. ", "Happy to help. ")
# The replies a simulated user gives after an answer, paired with how the assistant reacts.
FEEDBACK = (
    ("thanks!", "You're welcome!"),
    ("thank you, that helps", "Glad it helped."),
    ("too AI-like, rewrite it without the bold", "Sure, here it is in plain words: {answer}"),
    ("that's too long, keep it shorter", "Shorter version: {answer}"),
    ("can you say that again more simply?", "Simply put: {answer}"),
    ("ok, moving on.", "Sounds good."),
    ("hmm, not sure that's right", "Let me check again. {answer}"),
)


def dialogue(rng: random.Random) -> str:
    """A two- or three-turn exchange ending with the user's reaction and the assistant's reply."""
    topic, answers = rng.choice(TOPICS)
    answer = rng.choice(answers)
    user, assistant = rng.choice(("User", "Person", "Me")), rng.choice(("Assistant", "AI", "Bot"))
    lines = [
        f"{user}: {rng.choice(USER_OPENERS).format(topic=topic)}",
        f"{assistant}: {rng.choice(ASSISTANT_PREFIXES)}{answer}",
    ]
    for said, reply in rng.sample(FEEDBACK, k=rng.randint(1, 2)):
        lines += [f"{user}: {said}", f"{assistant}: {reply.format(answer=rng.choice(answers))}"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- everyday prose

PLACES = ("market", "library", "park", "station", "beach", "kitchen", "office", "garden", "museum", "bakery",
          "school", "hospital", "river", "mountain", "village", "harbour", "cinema", "farm", "bridge", "forest")
TIMES = ("on Monday", "on Saturday morning", "last week", "yesterday", "in the evening", "after lunch",
         "before sunrise", "in early spring", "during the summer", "in October", "every Sunday", "at midnight")
ACTIVITIES = ("buy fresh bread", "return a book", "meet an old friend", "take photographs", "paint the fence",
              "plant tomatoes", "fix a bicycle", "practise the piano", "write a letter", "look for a lost cat",
              "watch the boats", "learn to swim", "cook soup for the neighbours", "study for an exam",
              "repair the roof", "sell vegetables", "feed the ducks", "climb the hill", "visit a cousin")
ADJECTIVES = ("quiet", "bright", "cold", "noisy", "gentle", "strange", "beautiful", "tired", "careful", "lucky",
              "busy", "empty", "narrow", "ancient", "curious", "proud", "heavy", "golden", "muddy", "friendly")
NOUNS = ("window", "basket", "letter", "garden", "umbrella", "lantern", "ticket", "kettle", "blanket", "violin",
         "notebook", "bicycle", "ladder", "teacup", "mirror", "parcel", "journey", "storm", "festival", "recipe")
VERBS_PAST = ("noticed", "carried", "opened", "forgot", "borrowed", "painted", "repaired", "found", "shared",
              "described", "cleaned", "wrapped", "measured", "dropped", "admired", "ordered", "explained")
ADVERBS = ("slowly", "carefully", "quickly", "happily", "quietly", "suddenly", "patiently", "proudly", "gladly")
MOODS = ("happy", "tired", "cheerful", "calm", "excited", "hungry", "relieved", "busy")
WEATHER = ("The rain stopped", "The wind picked up", "Snow began to fall", "The sun came out", "Fog rolled in")
PROSE_SENTENCES = (
    "{name} went to the {place} {time} to {activity}.",
    "The {adj} {noun} was near the {place}, so {pronoun} {verb} it {adverb}.",
    "{Time}, {name} and {other} {verb} {a_adj} {noun}.",
    "{weather} as {name} reached the {place}.",
    "Nobody expected the {noun} to be so {adj}.",
    "\"I never thought I would {activity},\" said {name}.",
    "{name} {verb} the {noun} and smiled.",
    "It was {a_adj} day at the {place}, and everyone was {mood}.",
    "Later, {pronoun} wrote down how to {activity} in {a_adj} notebook.",
)


def everyday_prose(rng: random.Random) -> str:
    """A short paragraph of simple narrative sentences, for general English vocabulary."""
    name = rng.choice(NAMES)
    sentences = []
    for template in rng.sample(PROSE_SENTENCES, k=rng.randint(3, 6)):
        time, adj = rng.choice(TIMES), rng.choice(ADJECTIVES)
        sentence = template.format(
            name=name, other=rng.choice(NAMES), pronoun=_pronoun(name), place=rng.choice(PLACES),
            time=time, Time=time[0].upper() + time[1:], activity=rng.choice(ACTIVITIES),
            adj=adj, a_adj=f"{'an' if adj[0] in 'aeiou' else 'a'} {adj}", mood=rng.choice(MOODS), noun=rng.choice(NOUNS),
            verb=rng.choice(VERBS_PAST), adverb=rng.choice(ADVERBS), weather=rng.choice(WEATHER),
        )
        sentences.append(sentence)
    return " ".join(sentences) + "\n"


# --------------------------------------------------------------------------- tool calls

CITIES = ("Paris", "Lagos", "Tokyo", "Lima", "Oslo", "Cairo", "Toronto", "Mumbai", "Sydney", "Berlin")
# name -> (description, {parameter: (json type, description)}, argument sampler, result sampler)
TOOLS: dict[str, tuple[str, dict[str, tuple[str, str]],
                       Callable[[random.Random], dict], Callable[[random.Random], dict]]] = {
    "get_weather": (
        "Get the current weather for a city.",
        {"city": ("string", "City name"), "unit": ("string", "celsius or fahrenheit")},
        lambda r: {"city": r.choice(CITIES), "unit": r.choice(("celsius", "fahrenheit"))},
        lambda r: {"temperature": r.randint(-5, 35), "condition": r.choice(("sunny", "cloudy", "rain", "snow"))},
    ),
    "search_web": (
        "Search the web and return the top results.",
        {"query": ("string", "Search query")},
        lambda r: {"query": f"{r.choice(TOPICS)[0]} {r.choice(('2024', 'tips', 'guide', 'reddit'))}"},
        lambda r: {"results": [{"title": f"Result {i}", "url": f"https://example.com/{r.randint(1, 999)}"}
                               for i in range(1, r.randint(2, 4))]},
    ),
    "read_file": (
        "Read a text file from the workspace.",
        {"path": ("string", "Path relative to the workspace root")},
        lambda r: {"path": f"{r.choice(('src', 'tests', 'docs'))}/{r.choice(('main', 'utils', 'notes'))}"
                           f".{r.choice(('py', 'md', 'txt'))}"},
        lambda r: {"content": r.choice(("def main():\n    pass\n", "# Notes\nTODO: fix the parser\n", "hello world\n"))},
    ),
    "calculator": (
        "Evaluate an arithmetic expression.",
        {"expression": ("string", "Expression such as 12 * (3 + 4)")},
        lambda r: {"expression": f"{r.randint(1, 99)} {r.choice('+-*')} {r.randint(1, 99)}"},
        lambda r: {"result": r.randint(-100, 10000)},
    ),
    "send_email": (
        "Send an email.",
        {"to": ("string", "Recipient address"), "subject": ("string", "Subject line"), "body": ("string", "Message body")},
        lambda r: {"to": f"{r.choice(NAMES).lower()}@example.com", "subject": r.choice(("Meeting", "Hello", "Invoice")),
                   "body": r.choice(("See you tomorrow.", "Thanks for your help!", "Please find the details below."))},
        lambda r: {"status": "sent", "id": f"msg_{r.randint(1000, 9999)}"},
    ),
    "create_event": (
        "Add an event to the calendar.",
        {"title": ("string", "Event title"), "date": ("string", "YYYY-MM-DD"), "time": ("string", "HH:MM")},
        lambda r: {"title": r.choice(("Dentist", "Team sync", "Dinner with Rosa")),
                   "date": f"2025-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
                   "time": f"{r.randint(8, 20):02d}:{r.choice(('00', '30'))}"},
        lambda r: {"created": True, "event_id": r.randint(1, 99999)},
    ),
}


def tool_definition(name: str) -> dict:
    """The OpenAI function-tool dict for one of ``TOOLS``."""
    description, params, _, _ = TOOLS[name]
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object",
                       "properties": {p: {"type": t, "description": d} for p, (t, d) in params.items()},
                       "required": list(params)},
    }}


def tool_snippet(rng: random.Random) -> str:
    """A tools list, a call in the chat template's ``<tool_call>`` format, and the result."""
    names = list(TOOLS)
    name = rng.choice(names)
    _, _, sample_args, sample_result = TOOLS[name]
    shown = rng.sample(names, k=rng.randint(1, 3))
    if name not in shown:
        shown.append(name)
    tools = "\n".join(json.dumps(tool_definition(n), ensure_ascii=False) for n in shown)
    call = json.dumps({"name": name, "arguments": sample_args(rng)}, ensure_ascii=False)
    result = json.dumps(sample_result(rng), ensure_ascii=False)
    return f"<tools>\n{tools}\n</tools>\n<tool_call>\n{call}\n</tool_call>\nResult: {result}\n"


# --------------------------------------------------------------------------- Python code

IDENTIFIERS = ("items", "values", "total", "count", "result", "data", "names", "scores", "line", "row", "user", "config")
FUNCTIONS = ("load_data", "parse_line", "compute_total", "clean_text", "average", "find_user", "save_report", "main")
MODULES = ("os", "sys", "json", "math", "random", "pathlib", "itertools", "collections", "re", "time")


def _code_block(rng: random.Random) -> str:
    a, b = rng.sample(IDENTIFIERS, 2)
    fn = rng.choice(FUNCTIONS)
    n = rng.randint(2, 20)
    return rng.choice((
        f"def {fn}({a}, {b}):\n    return {a} {rng.choice('+-*/')} {b}\n",
        f"def {fn}({a}):\n    \"\"\"Return the {rng.choice(('sum', 'mean', 'largest item'))} of {a}.\"\"\"\n"
        f"    {b} = 0\n    for x in {a}:\n        {b} += x\n    return {b}\n",
        f"for i in range({n}):\n    {a}.append(i * {rng.randint(2, 9)})\n",
        f"{a} = [x for x in {b} if x > {n}]\n",
        f"{a} = {{k: v for k, v in {b}.items() if v}}\n",
        f"with open(\"{rng.choice(('data.csv', 'notes.txt', 'config.json'))}\") as f:\n    {a} = f.read().splitlines()\n",
        f"if {a} is None:\n    {a} = []\nelif len({a}) > {n}:\n    {a} = {a}[:{n}]\n",
        f"try:\n    {a} = int({b})\nexcept ValueError:\n    {a} = 0\n",
        f"class {fn.title().replace('_', '')}:\n    def __init__(self, {a}):\n        self.{a} = {a}\n\n"
        f"    def __repr__(self):\n        return f\"{fn.title().replace('_', '')}({{self.{a}!r}})\"\n",
        f"print(f\"{a} = {{{a}}}\")\n",
    ))


def python_code(rng: random.Random) -> str:
    """A few imports followed by a handful of small, syntactically valid blocks."""
    imports = "".join(f"import {m}\n" for m in sorted(rng.sample(MODULES, rng.randint(1, 3))))
    blocks = "\n".join(_code_block(rng) for _ in range(rng.randint(2, 5)))
    return f"{imports}\n{blocks}"


# --------------------------------------------------------------------------- tracebacks

ERRORS = (
    ("ZeroDivisionError", "division by zero", "you divided by a value that is zero"),
    ("KeyError", "'name'", "the dictionary has no 'name' key"),
    ("TypeError", "unsupported operand type(s) for +: 'int' and 'str'", "a number and a string were added"),
    ("IndexError", "list index out of range", "the list is shorter than the index you used"),
    ("AttributeError", "'NoneType' object has no attribute 'split'", "a function returned None instead of a string"),
    ("FileNotFoundError", "[Errno 2] No such file or directory: 'data.csv'", "the file is not in the working directory"),
    ("ValueError", "invalid literal for int() with base 10: 'abc'", "the text is not a number"),
    ("ModuleNotFoundError", "No module named 'requests'", "the package is not installed"),
)


def traceback_text(rng: random.Random) -> str:
    """A Python traceback with one to three frames, sometimes followed by a plain explanation."""
    error, message, cause = rng.choice(ERRORS)
    root = f"/home/{rng.choice(NAMES).lower()}/{rng.choice(('app', 'project', 'scripts', 'bot'))}"
    frames = []
    for _ in range(rng.randint(1, 3)):
        module, fn = rng.choice(("main", "utils", "loader", "cli")), rng.choice(FUNCTIONS)
        frames.append(f'  File "{root}/{module}.py", line {rng.randint(3, 400)}, in {fn}\n'
                      f"    {_code_block(rng).splitlines()[0].strip()}\n")
    text = "Traceback (most recent call last):\n" + "".join(frames) + f"{error}: {message}\n"
    if rng.random() < 0.6:
        text += f"This {error} means {cause}.\n"
    return text


# --------------------------------------------------------------------------- assembly

# Weights set the mix; word problems dominate because the demo's benchmark is built on them.
GENERATORS: tuple[tuple[Generator, int], ...] = (
    (word_problem, 5),
    (dialogue, 3),
    (everyday_prose, 2),
    (tool_snippet, 2),
    (python_code, 2),
    (traceback_text, 1),
)


def build_corpus(seed: int, target_chars: int = TARGET_CHARS) -> list[str]:
    """Generate documents until their total length reaches ``target_chars``.

    Deterministic: the same ``seed`` (and ``target_chars``) always gives the same list.
    """
    rng = random.Random(seed)
    generators = [g for g, _ in GENERATORS]
    weights = [w for _, w in GENERATORS]
    docs: list[str] = []
    size = 0
    while size < target_chars:
        doc = rng.choices(generators, weights)[0](rng)
        docs.append(doc)
        size += len(doc)
    return docs
