"""Retiring memory notes the weights have learnt (`--memory-retire on`, DESIGN §13, issue 35 item 4).

A note is asked for one thing: to change what the model says. Once the served weights say it
without being told, the note is only cost (its tokens on every prompt), so it is retired: kept in
the record, no longer injected (`store.memory.retire`).

What is checked, for each active note of a user under the version now serving their lineage: their
latest `--memory-retire-turns` main turns that open a conversation and whose prompt carried the note. On each turn's messages with this
note alone (`--memory-retire-sampled told`, the default; `untold`: with no notes) the version samples
`--memory-retire-samples` fresh answers (temperature 1, each as long as the recorded answer, each with
its own seed), which it scores under two prompts: the messages with no notes, and with this note alone.
The note's gap is the mean over all the answers, of all the turns, of log p(the prompt sampled under) -
log p(the other), summed over the answer's tokens. Told, that is the forward KL: how unlikely, in nats
per answer, what the weights say when told is for the weights alone. At most `--memory-retire-gap`
nats per answer, the note is retired.

Why told answers (the fourth criterion). Untold answers measure the reverse KL, the one on-policy
distillation drives down, and it is small whenever what the weights say alone is one of the things
the told model says too: a small model told a note still answers its old way part of the time, so a
note was retired while the weights alone kept the old habit (docs/benchmarks.md, third report). The
forward KL stays large until the weights alone say what the note makes them say. The choices below
were made for untold answers and hold for told ones.

Why these choices. The first criterion (recorded answers, the user's active notes against the same
less this one, nats per token) retired 42 of 44 notes within a version or two while the weights
alone stayed far behind the notes (docs/benchmarks.md); so, too, did a second (recorded answers, the
note alone against none) once notes were durable directives: memory alone reached 0.83 on the
held-out prompts with its notes while the weights alone of the arm that had retired them were at 0.4.
* Fresh answers of the weights alone, not recorded ones. Recorded answers were sampled with the
  notes, so they already say what the notes ask; the told and untold prompts then differ on the few
  tokens where the style is decided, and that is small however much the untold policy would stray.
  What the user would see without the note is what the weights say untold.
* Summed over the answer. A style is a handful of decisions in an answer of fifty tokens: per token,
  a decisive difference reads as noise.
* Several answers per turn (4 by default). One sampled answer's summed log-ratio is an unbiased but
  noisy estimate of the reverse KL: where told and untold differ little on each token, its variance
  is about twice the KL itself, so near the threshold of 1 nat one answer is off by some 1.4 nats,
  and the mean of one answer on each of four turns by some 0.7, most of the threshold; a note near it
  was retired or kept by chance (and, retired too early, taught again: the churn of the second
  report in docs/benchmarks.md). Four answers a turn halve that error, for four times the sampling
  and scoring of a background task; the turns' own spread (which openings the user happened to make)
  remains. The answers are sampled one after another, so the check holds at most one of the
  engine's sequences at a time, as with one.
* Turns that open a conversation. Later in one, the user's own words in it (the correction the note
  was drawn from, often) say what the note says, and the note alone moves little there: on the
  tiny model one note changes an opening answer by about 2.4 nats, and later turns by a fraction of
  a nat. A note is for the answers nothing else steers: the first of each conversation.
* Prompts trained on or not. The second criterion took only turns the checked version was not
  trained on, because the update fits exactly those prompts' told and untold answers on the
  recorded tokens. With fresh answers that matters less, and in a run that keeps training there are
  hardly any such openings: the trainer catches up after each conversation, so each version has at
  most one, and a probe on two tuning seeds never had four. The price: a version may answer a
  prompt it trained on better than one it never saw; the benchmark's held-out score is the check.
* This note alone against no notes. With the other notes left in, a note that repeats another (a
  user says "no bold" in three ways) moves nothing and looked learnt, and so did each of its copies.

When: a lineage's first version seen by the task (the one served when the server starts) is its
start; each note is checked at most once per later version, as soon as the user has enough such
turns, looked at every `--memory-retire-every-s`. It is a background task of the server: store
reads and prompt rendering run on threads, and the sampling and scoring are the engine's, so
requests never wait for it (they share the engine's worker with it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from clawrl.config import ServeConfig
from clawrl.config.serve import RetireSampled
from clawrl.engines.base import Engine, SamplingParams
from clawrl.model.chat import render_prompt
from clawrl.model.notes import with_notes
from clawrl.store import Store
from clawrl.store.memory import NoSuchNote
from clawrl.types import SHARED_LINEAGE, MemoryNote, Turn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NoteCheck:
    """What one check of one note found."""

    user_id: str
    note_id: int
    version: int  # the policy version that scored it
    turns: int  # the turns it was measured on (fewer than --memory-retire-turns: not measured)
    gap: float | None  # nats per answer (`NoteGap.gap`); None when not measured
    retired: bool


@dataclass(frozen=True)
class NoteGap:
    """One measurement of a note: the gap and the fresh answers it was measured on."""

    gap: float  # nats per answer: mean over the answers of log p(sampled under) - log p(the other), summed over tokens
    answers: list[list[int]]  # the answers the version sampled: per turn in order, `samples` of each


class VersionMovedError(RuntimeError):
    """The lineage's version changed while a note was measured under it."""


def sample_seed(version: int, turn_index: int, sample_index: int) -> int:
    """The seed of the `sample_index`-th fresh answer on the `turn_index`-th turn under `version`: the
    same answers each time the same version is checked, a different seed for every (turn, sample) while
    both indices are under 1000 (--memory-retire-turns and --memory-retire-samples are at most 64)."""
    return (version * 1000 + turn_index) * 1000 + sample_index


async def note_gap(engine: Engine, turns: list[Turn], note: MemoryNote, lineage: str, version: int,
                   samples: int = 1, *, sampled: RetireSampled) -> NoteGap:  # fmt: skip
    """The gap of `note` on `turns` under `version`, the version serving `lineage`: on each turn's
    messages with no notes (`sampled` "untold") or with `note` alone ("told"), `samples` fresh answers
    sampled by that version (seeds `sample_seed`), and the mean over all of them of log p(answer | the
    prompt it was sampled under) - log p(answer | the other prompt), summed over the answer's tokens.
    VersionMovedError when `lineage` is served by another version meanwhile (for any of the answers)."""
    if samples < 1:
        raise ValueError(f"samples must be at least 1, not {samples}")
    gaps, answers = [], []
    for index, turn in enumerate(turns):
        untold_ids = await asyncio.to_thread(render_prompt, engine.tokenizer, turn.messages, turn.tools)
        told_ids = await asyncio.to_thread(render_prompt, engine.tokenizer, with_notes(turn.messages, [note]), turn.tools)
        sampled_ids, other_ids = (untold_ids, told_ids) if sampled == "untold" else (told_ids, untold_ids)
        for sample in range(samples):  # one after another: the check holds one of the engine's sequences at most
            sampling = SamplingParams(temperature=1.0, max_tokens=max(1, len(turn.response_token_ids)),
                                      seed=sample_seed(version, index, sample))  # fmt: skip
            stream = engine.generate(sampled_ids, sampling, lineage)
            answer = [step.token_id async for step in stream]
            if stream.policy_version != version or not answer:
                raise VersionMovedError(f"{lineage} is no longer served by version {version}")
            own = await engine.score(sampled_ids, answer, version=version)
            other = await engine.score(other_ids, answer, version=version)
            gaps.append(sum(a - b for a, b in zip(own.logprobs, other.logprobs, strict=True)))
            answers.append(answer)
    return NoteGap(sum(gaps) / len(gaps), answers)


class NoteRetirer:
    """The server's retirement task: `run_forever` checks each note once under each newly served version."""

    def __init__(self, engine: Engine, store: Store, config: ServeConfig,
                 lineage_for: Callable[[str], str] = lambda _user: SHARED_LINEAGE) -> None:  # fmt: skip
        self.engine, self.store, self.config, self.lineage_for = engine, store, config, lineage_for
        self.started: dict[str, int] = {}  # per lineage, the version served when the task first saw it
        self.measured: dict[tuple[str, int], int] = {}  # (user, note id) -> the version it was last measured under

    async def run_forever(self) -> None:
        self.started.setdefault(SHARED_LINEAGE, self.engine.policy_version)  # what is served at start is the start
        while True:
            await asyncio.sleep(self.config.memory_retire_every_s)
            try:
                await self.check()
            except Exception:  # a busy store must not end the task; the next period tries again
                log.exception("checking memory notes for retirement failed")

    async def check(self) -> list[NoteCheck]:
        """Check the notes not yet measured under the version now serving their user's lineage, where
        that is a version after the lineage's start (a lineage seen for the first time is only noted)."""
        users = await asyncio.to_thread(self.store.memory.users_with_active_notes)
        checks: list[NoteCheck] = []
        for user_id in users:
            lineage = self.lineage_for(user_id)
            version = self.engine.lineage_version(lineage)
            if version is None:  # not held (a per-user adapter evicted): checked once it is served again
                continue
            if self.started.setdefault(lineage, version) == version:
                continue
            try:
                checks += await self.check_user(user_id, version)
            except Exception as error:
                if self.engine.lineage_version(lineage) != version:  # swapped out meanwhile: the next one is checked
                    log.info("version %d was swapped out while %s's memory notes were checked under it (%s)", version,
                             user_id, error)  # fmt: skip
                else:  # e.g. a busy store: the next period tries again
                    log.exception("checking %s's memory notes under version %d failed", user_id, version)
        return checks

    async def check_user(self, user_id: str, version: int) -> list[NoteCheck]:
        """Check each of `user_id`'s active notes not yet measured under `version`, on turns it was not
        trained on, retiring those within the gap; a note with too few such turns waits for more."""
        wanted = self.config.memory_retire_turns
        notes = await asyncio.to_thread(self.store.memory.injected, user_id, self.config.memory_notes)
        notes = [note for note in notes if self.measured.get((user_id, note.id)) != version]
        if not notes:
            return []
        noted = await asyncio.to_thread(self.store.memory.noted_turns, user_id, [note.id for note in notes], wanted, True)
        checks = []
        for note in notes:
            turns = [turn for turn in noted[note.id] if self._fits(turn, note)]
            if len(turns) < wanted:
                checks.append(NoteCheck(user_id, note.id, version, len(turns), None, False))
                continue
            samples = self.config.memory_retire_samples
            gap = (await note_gap(self.engine, turns, note, self.lineage_for(user_id), version, samples,
                                  sampled=self.config.memory_retire_sampled)).gap
            self.measured[(user_id, note.id)] = version
            retired = gap <= self.config.memory_retire_gap
            if retired:
                try:
                    await asyncio.to_thread(self.store.memory.retire, user_id, note.id)
                except NoSuchNote:  # removed by its user meanwhile
                    retired = False
                else:
                    log.info("retired memory note %d of %s's: gap %.4f nats per answer under version %d on %d turns, "
                             "%d answers each (at most --memory-retire-gap %g)", note.id, user_id, gap, version,
                             len(turns), samples, self.config.memory_retire_gap)  # fmt: skip
            else:
                log.info("kept memory note %d of %s's: gap %.4f nats per answer under version %d on %d turns, %d "
                         "answers each", note.id, user_id, gap, version, len(turns), samples)  # fmt: skip
            checks.append(NoteCheck(user_id, note.id, version, len(turns), gap, retired))
        return checks

    def _fits(self, turn: Turn, note: MemoryNote) -> bool:
        """Whether the turn's answer after its messages with `note` fits the engine's context (the note
        may have been edited longer since); a rough bound, by the recorded prompt."""
        extra = len(note.text) + 4  # at most a token per character
        return len(turn.prompt_token_ids) + extra + len(turn.response_token_ids) <= self.engine.max_context_tokens
