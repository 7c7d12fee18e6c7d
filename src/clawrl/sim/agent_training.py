"""Training a tiny agent (`agents.py` says why): drills for the one skill each family's solving
habit needs beside the format (copying names, copying grep's line numbers, finding an element by
its label), then imitation of the demonstrations with a few drills in every batch.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from clawrl.envs.terminal.env import SYSTEM_PROMPT
from clawrl.envs.terminal.tasks import EVAL_WORDS, WORDS, made_up_task
from clawrl.envs.web.env import SYSTEM_PROMPT as WEB_SYSTEM_PROMPT
from clawrl.envs.web.page import PageElement, PageSnapshot, render
from clawrl.sim.agents import (
    SWE_DEMONSTRATION_LINES,
    SWE_FIND,
    TERMINAL_MICRO,
    WEB_MICRO,
    AgentConfig,
    Demonstrations,
    Habit,
    _call,
    _draw_habit,
    made_up_name,
    renumbered,
    swe_fix_command,
)
from clawrl.sim.pretrain import PretrainConfig, learning_rate, pad_batch
from clawrl.types import Message, ToolSpec

log = logging.getLogger(__name__)

COPY_DRILLS_VERSION = 5  # bump when `copy_drill` changes


def encode_episode(tokenizer: PreTrainedTokenizerFast, messages: list[Message], tools: list[ToolSpec],
                   max_tokens: int) -> tuple[list[int], list[int]]:
    """Token ids of the rendered episode (with its tools), and labels keeping only the assistant tokens."""
    encoded = tokenizer.apply_chat_template(messages, tools=tools, return_dict=True, return_assistant_tokens_mask=True)
    ids = encoded["input_ids"][:max_tokens]
    labels = [token if keep else -100 for token, keep in zip(ids, encoded["assistant_masks"][:max_tokens], strict=True)]
    return ids, labels


_EXTENSIONS = (".txt", ".key", ".sh", ".conf", ".csv", ".log", ".md")
_FILLER = ("please", "the", "file", "directory", "in", "workspace", "so", "that", "only", "its", "owner", "can", "to",
           "keep", "with", "and", "make", "copy", "set", "write", "a", "new", "of", "each", "every", "under", "into",
           "named", "line", "for", "me", "then", "called", "from", "holding", "whose", "is")  # fmt: skip
_VERBS = ("chmod 600", "chmod u+x", "gzip", "cp", "mkdir -p", "cat", "rm", "touch", "echo", "mv", "ls -l", "wc -l", ">")


def copy_drill(tokenizer: PreTrainedTokenizerFast, rng: random.Random) -> tuple[list[int], list[int]]:
    """A user message quoting names among filler words, answered by a shell call that repeats them: a short episode.

    Terminal tasks are solved by repeating the instruction's names in a command. The chat model never
    had to copy an arbitrary word from its context, and episodes alone did not teach it: fine-tuned on
    them, the agent wrote well-formed commands about names it made up. These drills carry nothing
    else to learn: the filler and the command words are random, so only the names (in the order the
    message quotes them, each after a random command word) can be predicted, and only by finding them
    in the user's message. Every name is new (made up for this drill): drawn from a fixed list of 600,
    they were learnt by heart, and a name's first letters were then enough to finish it, so copying
    never appeared; new names made it appear after about 750 steps (docs/notes.md). Names are bare,
    as the tasks write them (`terminal_tasks.bare_names`). They cost a seventh of an episode each (no system prompt,
    no tools). Real models learn copying in pre-training; this is the tiny model's share of it.
    """
    names = []
    for _ in range(rng.randint(1, 3)):
        while (name := made_up_name(rng, letters=rng.random() < 0.5)) in WORDS:
            pass
        shape = rng.random()
        if shape < 0.15:
            name = name.upper()
        elif shape < 0.75:
            name += rng.choice(_EXTENSIONS)
        names.append(name)
    sentence = [rng.choice(_FILLER) for _ in range(rng.randint(3, 12))]
    for name in names:  # in order, at random places
        sentence.insert(rng.randint(0, len(sentence)), "\0")
    if sentence[0] != "\0":  # a sentence starts with a capital letter, a name stays as it is
        sentence[0] = sentence[0].capitalize()
    quoted = iter(names)
    text = " ".join(next(quoted) if word == "\0" else word for word in sentence)
    command = rng.choice((" ", "\n")).join(f"{rng.choice(_VERBS)} {name}" for name in names)
    messages = [{"role": "user", "content": text + "."}, _call("shell", {"command": command})]
    return encode_episode(tokenizer, messages, [], 256)


_COMPARISONS = ("<", ">", "<=", ">=", "==", "!=", "in", "is")
LINE_DRILLS_VERSION = 1  # bump when `line_drill` changes


def line_drill(tokenizer: PreTrainedTokenizerFast, rng: random.Random) -> tuple[list[int], list[int]]:
    """grep's answer `path:NN:    if not (a < b):`, then the fix of line NN: copying a number from a tool result.

    The SWE agent's solving habit writes the line number grep printed into its `sed`; imitating the
    episodes alone, it copied the number only sometimes (the units digit, or a number it had seen
    before). The same thing as `copy_drill` does for the terminal's names: everything but the
    number (the path, the names, the test) is random, so the one thing left to predict is the
    number, and only the tool result holds it; drawn from 2-499, a number seldom comes back. The
    first call is the habit's own (always the same). No system prompt and no tools: a tenth of an
    episode's tokens.
    """
    line = rng.randint(2, 499)
    path = "/".join(made_up_name(rng, letters=rng.random() < 0.5) for _ in range(rng.randint(1, 3))) + ".py"
    left, right = (made_up_name(rng, letters=rng.random() < 0.5) for _ in range(2))
    code = f"{' ' * rng.choice((4, 8, 12))}if not ({left} {rng.choice(_COMPARISONS)} {right}):"
    find = _call("shell", {"command": SWE_FIND})
    shown = {"role": "tool", "content": f"{path}:{line}:{code}", "tool_call_id": find["tool_calls"][0]["id"]}
    return encode_episode(tokenizer, [find, shown, _call("shell", {"command": swe_fix_command(line)})], [], 256)


# each web micro family's instruction, page title, the role of the element it names, and the roles beside it
_LOOKUP_PAGES = {
    "click-button": ('Click on the "{label}" button.', "Click Button Task", "button", ("button", "textbox")),
    "click-link": ('Click on the link "{label}".', "Click Link Task", "clickable", ("clickable",)),
    "click-option": ("Select {label} and click Submit.", "Click Option Task", "radio", ("radio",)),
}
LOOKUP_DRILLS_VERSION = 1  # bump when `lookup_drill` changes


def lookup_drill(tokenizer: PreTrainedTokenizerFast, rng: random.Random) -> tuple[list[int], list[int]]:
    """A web micro task's first prompt on a made-up page, answered by a habit's reply: finding an element by its label.

    The web agent's solving habit clicks the element whose label the instruction quotes; imitating
    the episodes, it clicked that element no more often than chance (the first or the last would do
    as well), so RL had no habit that solves to select. Here every page is new: labels made up
    (never the benchmark's words), two to seven elements in a random order, so that the quoted
    label's id can only be found by looking it up in the listing. The reply is a habit drawn with
    the demonstrations' weights (`_draw_habit`), so the habits keep their shares. The system
    prompt is the real one; no tools: a third of an episode's tokens.
    """
    family = rng.choice(WEB_MICRO)
    instruction, title, role, roles_beside = _LOOKUP_PAGES[family]
    labels: list[str] = []
    count = rng.randint(2, 7)
    while len(labels) < count:
        label = made_up_name(rng, letters=rng.random() < 0.5)
        label = rng.choice((label, label.capitalize(), label + ".", "".join(rng.choice((c, c.upper())) for c in label)))
        if label not in labels and label != "Submit":
            labels.append(label)
    target = rng.randrange(len(labels))
    elements = []
    for index, label in enumerate(labels):
        element_role = role if index == target else rng.choice(roles_beside)
        elements.append(PageElement(id=index + 1, role=element_role, label="" if element_role == "textbox" else label,
                                    value="" if element_role == "textbox" else None,
                                    checked=False if element_role == "radio" else None))  # fmt: skip
    if family == "click-option":
        elements.append(PageElement(id=len(elements) + 1, role="button", label="Submit"))
    page = render(PageSnapshot(title=title, nextId=len(elements) + 1, elements=elements))
    messages: list[Message] = [{"role": "system", "content": WEB_SYSTEM_PROMPT},
                               {"role": "user", "content": f"{instruction.format(label=labels[target])}\n\n{page}"}]  # fmt: skip
    reply = Habit("web", _draw_habit("web", rng), family)._web(messages)
    return encode_episode(tokenizer, [*messages, reply], [], 512)


Drill = Callable[[PreTrainedTokenizerFast, random.Random], tuple[list[int], list[int]]]
DRILLS: dict[str, Drill] = {"terminal": copy_drill, "swe": line_drill, "web": lookup_drill}


def opening_drill(tokenizer: PreTrainedTokenizerFast, rng: random.Random, tools: list[ToolSpec], max_tokens: int) -> tuple[list[int], list[int]]:
    """The opening of a micro task made up on the spot, on new made-up names, and a habit's first step.

    Copy drills teach copying in short messages; in a task's real prompt (the system prompt, the
    tools, then the instruction) the agent copied far less. These are that prompt with a new set of
    names every time, so that no name can be recalled instead of copied, answered by the first step
    of a habit drawn with the demonstrations' weights (so the habits keep their shares): the step
    where the solving habit, and the typo habit, copy. The benchmark's names (`WORDS`) never appear.
    """
    words: list[str] = []
    while len(words) < len(EVAL_WORDS):  # a pool as large as one split's
        if (name := made_up_name(rng, letters=rng.random() < 0.5)) not in WORDS and name not in words:
            words.append(name)
    spec = made_up_task(TERMINAL_MICRO, rng, words)
    first_step = Habit("terminal", _draw_habit("terminal", rng), spec.solution)._terminal(0)
    opening = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": spec.instruction.strip() + "\n"}]
    return encode_episode(tokenizer, [*opening, first_step], tools, max_tokens)


# --------------------------------------------------------------------------- training


def train_agent(base_dir: Path, demonstrations: Demonstrations, out_dir: Path, seed: int, config: AgentConfig) -> list[float]:
    """Fine-tune the model in `base_dir` on the demonstrations' assistant tokens; write it to `out_dir`.

    Terminal, SWE and web agents first drill what their solving habit needs (`config.copy_steps`
    steps of the family's `DRILLS` alone: copying names, copying grep's line numbers, finding an
    element by its label), then imitate the episodes with a few drills in every batch so that the
    skill is not forgotten. Returns the
    episode loss of every episode step.
    """
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    rows = [encode_episode(tokenizer, record.messages, demonstrations.tools, config.max_tokens) for record in demonstrations.episodes]
    cut_off = sum(all(label == -100 for label in labels) for _ids, labels in rows)
    if cut_off:  # a batch of such rows has no token to learn from: its loss is 0/0
        raise ValueError(f"{cut_off} of {len(rows)} demonstrations have no assistant token within max_tokens={config.max_tokens}")
    copies = demonstrations.family in DRILLS
    rng = random.Random(seed)

    def drills(count: int) -> dict[str, torch.Tensor]:
        drill = DRILLS[demonstrations.family]
        return pad_batch([drill(tokenizer, rng) for _ in range(count)], tokenizer.pad_token_id)

    def openings(count: int) -> dict[str, torch.Tensor]:
        return pad_batch([opening_drill(tokenizer, rng, demonstrations.tools, config.max_tokens) for _ in range(count)],
                         tokenizer.pad_token_id)  # fmt: skip

    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    losses: list[float] = []
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
            model.train()
            if copies and config.copy_steps:
                drill_losses = _train(model, config, config.copy_steps, lambda: model(**drills(config.copy_batch_size)).loss)
                log.info("tiny agent: copy drills, final loss %.3f", sum(drill_losses[-20:]) / len(drill_losses[-20:]))

            def episode_batch() -> dict[str, torch.Tensor]:
                if demonstrations.family != "swe":
                    return pad_batch(rng.sample(rows, config.batch_size), tokenizer.pad_token_id)
                # a new line number every time an episode is used (`renumbered`), so that it can only be copied
                records = [renumbered(record, rng.randint(*SWE_DEMONSTRATION_LINES))
                           for record in rng.sample(demonstrations.episodes, config.batch_size)]  # fmt: skip
                encoded = [encode_episode(tokenizer, record.messages, demonstrations.tools, config.max_tokens) for record in records]
                return pad_batch(encoded, tokenizer.pad_token_id)

            def episode_loss() -> torch.Tensor:
                loss = model(**episode_batch()).loss
                losses.append(loss.item())
                if copies and config.copy_drills:
                    loss = loss + model(**drills(config.copy_drills)).loss
                if demonstrations.family == "terminal" and config.copy_openings:
                    loss = loss + model(**openings(config.copy_openings)).loss
                return loss

            _train(model, config, config.steps, episode_loss)
    finally:
        torch.set_num_threads(threads)
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return losses


def _train(model: torch.nn.Module, config: AgentConfig, steps: int, batch_loss: Callable[[], torch.Tensor]) -> list[float]:
    """`steps` AdamW steps on `batch_loss()` with warm-up and cosine decay (a fresh optimizer per phase)."""
    schedule = PretrainConfig(steps=steps, lr=config.lr, warmup_steps=config.warmup_steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.01)
    losses: list[float] = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(schedule, step)
        loss = batch_loss()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if (step + 1) % 100 == 0:
            log.info("tiny agent: step %d/%d, loss %.3f", step + 1, steps, losses[-1])
    return losses
