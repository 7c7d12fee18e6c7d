"""The HTTP servers' settings: the OpenAI-compatible server (DESIGN §3) and the standalone dashboard."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from clawrl.config.base import ComponentSettings, with_upstream

RetireSampled = Literal["untold", "told"]  # the prompt a retirement check samples its fresh answers under


class ServeConfig(ComponentSettings):
    """The OpenAI-compatible HTTP server (DESIGN §3)."""

    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(30000, ge=0, le=65535, validation_alias=with_upstream("port", "PORT"), description="TCP port.")
    api_key: str | None = Field(
        None,
        validation_alias=with_upstream("api_key", "SGLANG_API_KEY"),
        description="When set, every /v1 request needs `Authorization: Bearer <key>`.",
    )
    served_model_name: str | None = Field(
        None,
        validation_alias=with_upstream("served_model_name", "SERVED_MODEL_NAME"),
        description="Model id clients use; defaults to the --model value.",
    )
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Larger bodies get 413.")
    keep_alive_s: float = Field(
        75.0, gt=0, description="How long an idle keep-alive connection stays open. Longer than clients keep theirs "
        "(httpx and the openai SDK: 5 s), so that a client never writes a request into a connection the server is "
        "closing at that moment (the request would be lost unread)."
    )
    default_max_tokens: int = Field(512, ge=1, description="Response limit when a request sets none.")
    session_idle_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="A session with no request for this long is closed; its last turn gets no next state.",
    )
    episode_idle_timeout_s: float = Field(
        600.0,
        gt=0,
        description="A registered episode with no request and no result for this long is ended as failed (its "
        "rollout client is gone), so that the rest of its group can train.",
    )
    side_turn_system_regex: str | None = Field(
        None,
        description="Requests whose system prompt matches this regex are side turns (served, never trained on), "
        "besides known agents' housekeeping requests, which always are (OpenClaw's memory flush and compaction "
        "summaries: serve/sessions.py KNOWN_SIDE_SYSTEM_PROMPTS).",
    )
    policy_poll_s: float = Field(
        0.25,
        gt=0,
        description="How often serving looks in the store for a newly published (or rolled back) policy version.",
    )
    retain_days: float | None = Field(
        None,
        gt=0,
        description="Remove turns older than this many days, trained on or not, with all that hangs on them (next "
        "states, verdicts and hints, samples, feedback, queue rows) and the sessions and episodes left with no turn: a "
        "background pass of the server at start and every ten minutes, a few hundred turns per transaction. Unset: "
        "turns are kept until their user is forgotten.",
    )
    memory: Literal["on", "off"] = Field(
        "off",
        description="Memory notes (DESIGN §13): with `on`, the judge's chosen hint of a turn and the text of explicit "
        "feedback become notes of the turn's user (of the run, without users), which are appended to the end of the "
        "system prompt of their later main turns at once, before any training has learnt them. The recorded turn "
        "keeps the exact token ids fed, notes included, and which notes they were. A user sees and edits theirs "
        "with `clawrl memory` and /v1/me/memory.",
    )
    memory_notes: int = Field(
        16,
        ge=1,
        le=256,
        description="With --memory on, how many notes each user keeps (the newest; a note taught again is the newest) "
        "and every prompt of theirs carries: each costs its tokens on every turn.",
    )
    memory_from: Literal["directives", "hints"] = Field(
        "directives",
        description="With --memory on, what of the judge's hint becomes a note: `directives`, its directive clauses "
        "that would hold for later requests (none naming a number, pointing at the task as in 'this one', or quoting "
        "the conversation: `judge.hints.durable_directives`), or nothing when none is left; `hints`, the hint as it "
        "is. A hint is about one answer, a note is said on every later prompt. Explicit feedback text is noted as "
        "given either way.",
    )
    memory_retire: Literal["on", "off"] = Field(
        "off",
        description="With --memory on, retire the notes the served weights follow without being told (DESIGN §13): "
        "each active note is checked once under each newly served policy version, on the user's latest conversation "
        "openings given with it (--memory-retire-turns): the version answers each with the note alone "
        "(--memory-retire-samples times; --memory-retire-sampled), and each answer is scored with no notes and with "
        "the note alone; a note "
        "whose gap is at most --memory-retire-gap is no longer injected (it stays listed, exported and forgettable, and is active again "
        "when taught again). A background task: requests never wait for it.",
    )
    memory_retire_gap: float = Field(
        1.0,
        ge=0,
        le=1000,
        description="With --memory-retire on, the largest gap, in nats per answer (the mean over the fresh answers "
        "of log p under the prompt they were sampled under minus log p under the other, summed over the answer's "
        "tokens; --memory-retire-sampled), at which a note is retired.",
    )
    memory_retire_turns: int = Field(
        4,
        ge=1,
        le=64,
        description="With --memory-retire on, how many of the user's latest main turns served with a note it is "
        "checked on; a note with fewer such turns is kept.",
    )
    memory_retire_samples: int = Field(
        4,
        ge=1,
        le=64,
        description="With --memory-retire on, how many fresh answers the weights give (--memory-retire-sampled) on each of those "
        "turns, each with its own seed; the gap is the mean over all of them. One answer's summed log-ratio is a noisy "
        "estimate: its variance is about twice the gap (told and untold differ little on each token), so near the "
        "default threshold of 1 nat one answer varies by some 1.4 nats, and the mean of one answer on each of four "
        "turns by 0.7, most of the threshold. Four answers a turn halve that, for four times the sampling and "
        "scoring (in the background: requests never wait for it).",
    )
    memory_retire_sampled: RetireSampled = Field(
        "told",
        description="With --memory-retire on, which prompt the check's fresh answers are sampled under, and so which "
        "way the gap measures: `told` (the messages with the note alone: log p told minus log p untold, the forward "
        "KL, large while the weights alone rarely say what the note makes them say, even where what they do say is "
        "something the told model says too) or `untold` (the messages without notes: log p untold minus log p told, "
        "the reverse KL that on-policy distillation drives down; the default before 2026-12-07). `told` was chosen "
        "over it on tuning seeds; the report seeds showed no difference either way (docs/benchmarks.md).",
    )
    memory_retire_every_s: float = Field(
        30.0,
        gt=0,
        description="With --memory-retire on, how often serving looks whether a new policy version is served, and "
        "so checks the notes again: at most one check per period.",
    )
    dashboard: bool = Field(
        True,
        description="Serve the dashboard at /dashboard: sessions, verdicts, samples, policy versions and the live "
        "score, read from the store (protected by --api-key when one is set).",
    )

    @property
    def memory_limit(self) -> int | None:
        """The notes kept per user when memory is on; None when it is off (nothing is noted nor injected)."""
        return self.memory_notes if self.memory == "on" else None

    @property
    def memory_retiring(self) -> bool:
        """Whether notes are checked and retired: memory and retirement both on."""
        return self.memory == "on" and self.memory_retire == "on"

    @field_validator("side_turn_system_regex")
    @classmethod
    def _a_valid_regex(cls, pattern: str | None) -> str | None:
        # refused here, when the settings are read, not by the first request that would use it
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(f"not a regular expression: {error}") from None
        return pattern


class DashboardConfig(ComponentSettings):
    """`clawrl dashboard`: the dashboard alone, over a run's store, while the loops run elsewhere."""

    dashboard_host: str = Field("127.0.0.1", description="Interface to listen on.")
    dashboard_port: int = Field(30080, ge=0, le=65535, description="TCP port of the dashboard.")
    api_key: str | None = Field(
        None,
        validation_alias=with_upstream("api_key", "SGLANG_API_KEY"),
        description="When set, the dashboard needs it: as a Bearer token or as the HTTP Basic password (any user).",
    )
