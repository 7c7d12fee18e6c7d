"""Retiring memory notes the weights have learnt (`--memory-retire on`, DESIGN §13, issue 35 item 4).

A note is asked for one thing: to change what the model says. Once the served weights say it
without being told, the note is only cost (its tokens on every prompt), so it is retired: kept in
the record, no longer injected (`store.memory.retire`).

What is checked: for each active note of a user, their latest `--memory-retire-turns` main turns
whose prompt carried it. Each recorded answer (its token ids, never re-tokenized) is scored by the
served policy under two prompts: the turn's messages with the user's active notes (A), and with
those notes less this one (B). The note's gap is the mean over the answer's tokens of
log p_A - log p_B, averaged over the turns: how much the note still moves the current weights
towards what was said under it. At most `--memory-retire-gap` nats per token, the note is retired.
The answers were sampled by older weights (with the note in the prompt), so the gap says whether
the current weights, left without the note, would still find those answers as likely; it does not
sample new ones. Within one user's check, a retired note leaves prompt A for the notes after it, as it
leaves the prompts served next.

When: only a newly served version can make a note redundant, so a check runs when the version
serving a user's lineage has changed since the last check (the version served when the server
starts is the starting point), looked at every `--memory-retire-every-s`. It is a background task of
the server: store reads and prompt rendering run on threads and the scoring is the engine's, so
requests never wait for it (they share the engine's worker with it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from clawrl.config import ServeConfig
from clawrl.engines.base import Engine
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
    gap: float | None  # nats per response token; None when not measured
    retired: bool


async def note_gap(engine: Engine, turns: list[Turn], notes: list[MemoryNote], note: MemoryNote,
                   version: int | None = None) -> float:  # fmt: skip
    """The gap of `note` among `notes` (the user's active notes, `note` one of them) on `turns`: the
    mean over the turns of the mean over each recorded answer's tokens of log p(answer | messages with
    `notes`) - log p(answer | messages with `notes` less `note`), scored by `engine` under `version`
    (None: the current one)."""
    without = [other for other in notes if other.id != note.id]
    gaps = []
    for turn in turns:
        with_ids = await asyncio.to_thread(render_prompt, engine.tokenizer, with_notes(turn.messages, notes), turn.tools)
        without_ids = await asyncio.to_thread(render_prompt, engine.tokenizer, with_notes(turn.messages, without), turn.tools)
        told = await engine.score(with_ids, turn.response_token_ids, version=version)
        untold = await engine.score(without_ids, turn.response_token_ids, version=version)
        gaps.append(sum(a - b for a, b in zip(told.logprobs, untold.logprobs, strict=True)) / len(turn.response_token_ids))
    return sum(gaps) / len(gaps)


class NoteRetirer:
    """The server's retirement task: `run_forever` checks the users' notes after each version change."""

    def __init__(self, engine: Engine, store: Store, config: ServeConfig,
                 lineage_for: Callable[[str], str] = lambda _user: SHARED_LINEAGE) -> None:  # fmt: skip
        self.engine, self.store, self.config, self.lineage_for = engine, store, config, lineage_for
        self.checked: dict[str, int] = {}  # per lineage, the version its users' notes were last checked under

    async def run_forever(self) -> None:
        self.checked.setdefault(SHARED_LINEAGE, self.engine.policy_version)  # what is served at start is the start
        while True:
            await asyncio.sleep(self.config.memory_retire_every_s)
            try:
                await self.check()
            except Exception:  # a busy store must not end the task; the next period tries again
                log.exception("checking memory notes for retirement failed")

    async def check(self) -> list[NoteCheck]:
        """Check the notes of every user whose lineage is served by a version other than at the last
        check; a lineage seen for the first time is only noted (its version is the start)."""
        users = await asyncio.to_thread(self.store.memory.users_with_active_notes)
        checks: list[NoteCheck] = []
        done: dict[str, int] = {}
        failed: set[str] = set()
        for user_id in users:
            lineage = self.lineage_for(user_id)
            version = self.engine.lineage_version(lineage)
            if version is None:  # not held (a per-user adapter evicted): checked once it is served again
                continue
            if lineage not in self.checked:
                self.checked[lineage] = version
                continue
            if self.checked[lineage] == version:
                continue
            try:
                checks += await self.check_user(user_id, version)
            except Exception:  # e.g. the version was swapped out meanwhile: the lineage is checked again
                log.exception("checking %s's memory notes under version %d failed", user_id, version)
                failed.add(lineage)
            else:
                done[lineage] = version
        self.checked.update({lineage: version for lineage, version in done.items() if lineage not in failed})
        return checks

    async def check_user(self, user_id: str, version: int) -> list[NoteCheck]:
        """Check each of `user_id`'s active notes under `version`, retiring those within the gap."""
        wanted = self.config.memory_retire_turns
        notes = await asyncio.to_thread(self.store.memory.injected, user_id, self.config.memory_notes)
        noted = await asyncio.to_thread(self.store.memory.noted_turns, user_id, [note.id for note in notes], wanted)
        checks = []
        for note in list(notes):
            turns = [turn for turn in noted[note.id] if self._fits(turn, notes)]
            if len(turns) < wanted:
                checks.append(NoteCheck(user_id, note.id, version, len(turns), None, False))
                continue
            gap = await note_gap(self.engine, turns, notes, note, version)
            retired = gap <= self.config.memory_retire_gap
            if retired:
                try:
                    await asyncio.to_thread(self.store.memory.retire, user_id, note.id)
                except NoSuchNote:  # removed by its user meanwhile
                    retired = False
                else:
                    notes.remove(note)
                    log.info("retired memory note %d of %s's: gap %.4f nats/token under version %d on %d turns "
                             "(at most --memory-retire-gap %g)", note.id, user_id, gap, version, len(turns),
                             self.config.memory_retire_gap)  # fmt: skip
            checks.append(NoteCheck(user_id, note.id, version, len(turns), gap, retired))
        return checks

    def _fits(self, turn: Turn, notes: list[MemoryNote]) -> bool:
        """Whether the turn's answer after its messages with `notes` fits the engine's context (the
        notes now may be longer than those it was served with); a rough bound, by the recorded prompt."""
        fed = set(turn.memory_note_ids or [])
        extra = sum(len(note.text) + 4 for note in notes if note.id not in fed)  # at most a token per character
        return len(turn.prompt_token_ids) + extra + len(turn.response_token_ids) <= self.engine.max_context_tokens
