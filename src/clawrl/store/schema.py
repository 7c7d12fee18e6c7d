"""Tables of the trajectory store (DESIGN §2, loop 2).

Rows never leave the store: `records.py` maps them to the records of `clawrl.types`, whose
fields are named after these columns (the comments on what each holds are there).

Token ids and log-probs are kept exactly as the engine produced them (JSON arrays), so training
never has to re-tokenize. Times are UNIX seconds (float): cheap to compare, same on every backend.
The columns that hold what someone said (text, token ids, log-probs, hints) are `Encrypted*`:
encrypted at rest when the store has a data key (`encryption.py`); hashes and numbers stay plain.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (JSON, Boolean, Exists, Float, ForeignKey, Index, Integer, Select, String, Text, UniqueConstraint, exists, false,
                        select, text, true)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from clawrl.store.encryption import EncryptedJSON, EncryptedText
from clawrl.types import DEFAULT_USER, SHARED_LINEAGE


class Base(DeclarativeBase):
    pass


class Meta(Base):
    """Key/value facts about the database itself, e.g. `schema_version`."""

    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class SessionRow(Base):
    """One conversation. `id_source` says how it was identified: header, body, user, inferred or new."""

    __tablename__ = "sessions"
    id: Mapped[str] = mapped_column(String(256), primary_key=True)
    id_source: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float, index=True)
    done: Mapped[bool] = mapped_column(Boolean, default=False)
    done_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)  # client | idle
    num_turns: Mapped[int] = mapped_column(Integer, default=0)
    # whose conversation it is (set when it starts): its turns, their judgments, samples and feedback
    # and its episode are that user's through it, so no other table repeats it
    user_id: Mapped[str] = mapped_column(String(64), default=DEFAULT_USER, server_default=DEFAULT_USER)
    # False: its first request opted out of training (`X-Clawrl-Train: false`), and with it every later turn
    train: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())

    # a user's sessions, most recent first, in one range of the index however many others there are
    # (it also serves every lookup by user alone)
    __table_args__ = (Index("ix_sessions_user_recent", "user_id", "updated_at"),)


class UserRow(Base):
    """Someone with a key of their own. Only the key's SHA-256 is kept: keys are random (256 bits), so a
    fast hash is as good as a slow one, and a request's key is found by it with one index lookup."""

    __tablename__ = "users"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    key_hint: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    key_created_at: Mapped[float] = mapped_column(Float)
    store: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())  # False: --no-store
    train: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())  # False: --no-train


# A main turn whose answer is nothing: no text, no tool call. Written out once, as SQL, because a
# partial index serves a query only when the query's condition repeats the index's word for word.
EMPTY_ANSWER = "kind = 'main' AND length(trim(response_text)) = 0 AND finish_reason != 'tool_calls'"


class TurnRow(Base):
    """One request/answer pair: the exact prompt the engine was fed and what it produced."""

    __tablename__ = "turns"
    # The id is chosen when the request arrives (it is also the OpenAI response id and the
    # X-Clawrl-Turn header), because a streamed response sends its headers before the turn exists.
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), index=True)
    index: Mapped[int] = mapped_column(Integer)  # position within the session, from 0
    kind: Mapped[str] = mapped_column(String(8))  # main | side
    created_at: Mapped[float] = mapped_column(Float, index=True)
    model: Mapped[str] = mapped_column(String(256))
    policy_version: Mapped[int] = mapped_column(Integer, index=True)
    messages: Mapped[list[dict[str, Any]]] = mapped_column(EncryptedJSON("turns.messages"))  # the request's messages, normalised
    tools: Mapped[list[dict[str, Any]] | None] = mapped_column(EncryptedJSON("turns.tools"), nullable=True)
    # temperature, top_p, max_tokens, stop, seed and the grammar: the stop strings are the client's and
    # the grammar is compiled from their response_format schema or tools (their words), so encrypted
    sampling: Mapped[dict[str, Any]] = mapped_column(EncryptedJSON("turns.sampling"))
    prompt_token_ids: Mapped[list[int]] = mapped_column(EncryptedJSON("turns.prompt_token_ids"))
    response_token_ids: Mapped[list[int]] = mapped_column(EncryptedJSON("turns.response_token_ids"))
    response_logprobs: Mapped[list[float]] = mapped_column(EncryptedJSON("turns.response_logprobs"))
    response_text: Mapped[str] = mapped_column(EncryptedText("turns.response_text"))
    tool_calls: Mapped[list[dict[str, Any]] | None] = mapped_column(EncryptedJSON("turns.tool_calls"), nullable=True)
    finish_reason: Mapped[str] = mapped_column(String(16))
    # sha256 of the answer as a client would echo it back (text + tool calls): how an unmodified
    # client's next request is matched to this turn. Null for answers no client ever received.
    answer_fingerprint: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    # per-message hashes of the non-system prompt messages, to check that a continuation really
    # follows this turn's conversation (DESIGN §3, session inference)
    message_hashes: Mapped[list[str]] = mapped_column(JSON)
    latency_s: Mapped[float] = mapped_column(Float)
    opt_out: Mapped[str | None] = mapped_column(String(8), nullable=True)  # request | session | user: never judged
    # ids of the memory notes rendered into prompt_token_ids (`--memory on`); null: none was
    memory_note_ids: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)
    __table_args__ = (
        UniqueConstraint("session_id", "index"),
        # Recent main turns answered with nothing, which every request that starts a session looks
        # for (a retry that does not echo the empty answer): a partial index holds only those, so
        # the lookup costs the same whatever the traffic of the last minutes.
        Index("ix_turns_empty_answers", "created_at", sqlite_where=text(EMPTY_ANSWER), postgresql_where=text(EMPTY_ANSWER)),
    )


class NextStateRow(Base):
    """What the next request of the session added after a main turn's answer, with roles."""

    __tablename__ = "next_states"
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"), primary_key=True)
    messages: Mapped[list[dict[str, Any]]] = mapped_column(EncryptedJSON("next_states.messages"))
    source_turn_id: Mapped[str] = mapped_column(String(64))  # the turn whose request carried it
    created_at: Mapped[float] = mapped_column(Float)


class FeedbackRow(Base):
    """Explicit 👍/👎 (and optional text) from a UI for one turn (DESIGN §3)."""

    __tablename__ = "feedback"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"), index=True)
    score: Mapped[int] = mapped_column(Integer)
    text: Mapped[str | None] = mapped_column(EncryptedText("feedback.text"), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)



class MemoryNoteRow(Base):
    """A note of what a user taught (a chosen hint, a feedback text, or typed in), said again in their
    later prompts with `--memory on` (DESIGN §13). A user's few notes are read whole, so the text is
    compared for duplicates after decryption: no hash of it is stored beside it (a hash of a short
    sentence gives it away to anyone who guesses it). `turn_id` has no foreign key: a note outlives
    the turn it came from (retention), it is its user's record, forgotten with them."""

    __tablename__ = "memory_notes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(String(64), index=True)
    text: Mapped[str] = mapped_column(EncryptedText("memory_notes.text"))
    source: Mapped[str] = mapped_column(String(16))  # hint | reply | feedback | user
    turn_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    # when the weights were found to follow it without being told (`--memory-retire`): kept in the
    # record and the export, no longer injected; None while it is active
    retired_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class JudgmentRow(Base):
    """The verdict on one main turn (DESIGN §5). One row per turn: the primary key is what makes
    judging idempotent when several workers share a store."""

    __tablename__ = "judgments"
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"), primary_key=True)
    score: Mapped[int] = mapped_column(Integer)  # +1, -1 or 0
    votes: Mapped[list[int | None]] = mapped_column(JSON)  # each PRM vote; None = unparseable
    vote_agreement: Mapped[float] = mapped_column(Float)  # share of votes equal to the score
    invalid_votes: Mapped[int] = mapped_column(Integer)  # votes the parser could not read
    rationale: Mapped[str | None] = mapped_column(EncryptedText("judgments.rationale"), nullable=True)  # one representative reasoning
    hint: Mapped[str | None] = mapped_column(EncryptedText("judgments.hint"), nullable=True)  # the chosen directive hint
    hint_candidates: Mapped[list[dict[str, Any]]] = mapped_column(EncryptedJSON("judgments.hint_candidates"))  # [{"hint", "overlap"}]
    source: Mapped[str] = mapped_column(String(16))  # prm | rule | feedback
    judge_model: Mapped[str] = mapped_column(String(256))
    latency_s: Mapped[float] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float, index=True)
    worker_id: Mapped[str | None] = mapped_column(String(64), nullable=True)  # who judged it (None before v15)


class JudgeLeaseRow(Base):
    """A worker's claim on a turn it is judging. Expires, so a killed worker's turns are retried."""

    __tablename__ = "judge_leases"
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"), primary_key=True)
    worker_id: Mapped[str] = mapped_column(String(64))
    expires_at: Mapped[float] = mapped_column(Float)
    attempts: Mapped[int] = mapped_column(Integer, default=1)


class JudgeQueueRow(Base):
    """A main turn waiting for its verdict.

    Queued in the transaction that makes the turn judgeable (its next state or its first feedback
    arrives), removed in the one that records its verdict. Claims read only this table, so their
    cost follows the backlog, not the history: a query over all turns took 133 ms per claim at
    112,000 turns, inside the write lock serving waits on, and the judge fell behind for good.
    """

    __tablename__ = "judge_queue"
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"), primary_key=True)
    turn_created_at: Mapped[float] = mapped_column(Float)  # the turn's arrival: claims go oldest first
    __table_args__ = (Index("ix_judge_queue_order", "turn_created_at", "turn_id"),)


class SampleQueueRow(Base):
    """A judged main turn of a chat waiting for the trainer to make its sample (or drop it).

    Queued with the verdict, removed with the sample row, for the same reason as `JudgeQueueRow`.
    Episode steps are not queued: their samples are made per group, once the group has ended.
    """

    __tablename__ = "sample_queue"
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"), primary_key=True)
    turn_created_at: Mapped[float] = mapped_column(Float)  # the trainer consumes turns in arrival order
    __table_args__ = (Index("ix_sample_queue_order", "turn_created_at", "turn_id"),)


class SampleRow(Base):
    """What the trainer made of one judged main turn (DESIGN §6): a training sample, or why not.

    `id` is the arrival order the trainer consumes samples in. A sample is `ready` until one
    optimizer step uses it (`trained`, with the version that step published) or it is `dropped`
    (`drop_reason`: no_signal, stale, ...). Marking samples trained happens in the same transaction
    that registers the version they produced, so no sample is ever trained twice.
    """

    __tablename__ = "samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"), unique=True)
    status: Mapped[str] = mapped_column(String(8), index=True)  # ready | trained | dropped
    drop_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    kind: Mapped[str] = mapped_column(String(16))  # combined | opd | rl | at_least_one | none
    reward: Mapped[float] = mapped_column(Float)
    hint: Mapped[str | None] = mapped_column(EncryptedText("samples.hint"), nullable=True)
    behaviour_version: Mapped[int] = mapped_column(Integer)  # the turn's policy version, for staleness
    teacher: Mapped[str | None] = mapped_column(String(16), nullable=True)  # "base" or "policy vN"
    teacher_logprobs: Mapped[list[float] | None] = mapped_column(EncryptedJSON("samples.teacher_logprobs"), nullable=True)
    teacher_topk_ids: Mapped[list[list[int]] | None] = mapped_column(EncryptedJSON("samples.teacher_topk_ids"), nullable=True)
    teacher_topk_logprobs: Mapped[list[list[float]] | None] = mapped_column(EncryptedJSON("samples.teacher_topk_logprobs"), nullable=True)
    # the prompt the student is trained under when it is not the one fed (a turn served with memory
    # notes, trained without them: `--memory-train without-notes`); None: the turn's prompt_token_ids
    student_prompt_token_ids: Mapped[list[int] | None] = mapped_column(EncryptedJSON("samples.student_prompt_token_ids"), nullable=True)
    trained_version: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    created_at: Mapped[float] = mapped_column(Float)
    settled_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # when trained or dropped


class EpisodeRow(Base):
    """One environment episode played through the server (DESIGN §9); its steps are its session's main turns.

    No foreign key to `sessions`: the episode is registered before its first request creates the
    session, so that its turns are never mistaken for a chat's.
    """

    __tablename__ = "episodes"
    session_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    env: Mapped[str] = mapped_column(String(64))
    task: Mapped[str] = mapped_column(String(256))
    group_id: Mapped[str] = mapped_column(String(128), index=True)  # the G rollouts of one task share it
    group_size: Mapped[int] = mapped_column(Integer)  # the group is complete when this many have ended
    seed: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(8), index=True)  # running | finished | failed
    reward: Mapped[float | None] = mapped_column(Float, nullable=True)  # the outcome, once finished
    step_rewards: Mapped[list[float]] = mapped_column(JSON)  # the environment's reward of each step
    error: Mapped[str | None] = mapped_column(EncryptedText("episodes.error"), nullable=True)  # why it failed
    created_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # True: it has ended and every main turn of it has a sample (set with the samples, cleared by a turn
    # that arrives after them), so the trainer's poll reads the groups still waiting, not all of history
    # (`EpisodeStore.groups_to_sample`). False is always safe: it only costs that poll a look.
    sampled: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    __table_args__ = (Index("ix_episodes_waiting", "sampled", "group_id"),)


class PolicyVersionRow(Base):
    """A published policy version: one optimizer step's weights under RUN_DIR/policy/LINEAGE/vN/.

    Version 0 is the base model and has no row. Numbers are unique across lineages, so a number
    alone names a version in an engine's table and in the logs. `sha256` is the digest of the
    version's manifest.json, which itself lists the digest of every weights file; serving checks
    both before loading. `metrics` is the step's StepMetrics.
    """

    __tablename__ = "policy_versions"
    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    lineage: Mapped[str] = mapped_column(String(64), index=True, server_default=SHARED_LINEAGE)
    parent: Mapped[int] = mapped_column(Integer)  # the version it was trained from (0 = base)
    kind: Mapped[str] = mapped_column(String(8))  # lora | full
    path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    step: Mapped[int] = mapped_column(Integer)  # optimizer steps from the base along its lineage
    num_samples: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float, index=True)
    # True: its directory was removed by --keep-versions (the row stays, so lineage and history read on)
    pruned: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # True: `clawrl versions pin`: never pruned, nor its parents back --keep-versions steps
    pinned: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class PolicyPointerRow(Base):
    """Which version of a lineage a consumer should use: `serving` is what the server loads and
    answers with.

    Publishing moves it to the new version; `clawrl versions rollback` moves it back, so a
    rollback is one store write that the server and the trainer both follow.
    """

    __tablename__ = "policy_pointers"
    lineage: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(String(16))  # publish | rollback
    updated_at: Mapped[float] = mapped_column(Float)


def unsampled_step() -> Exists:
    """Whether the episode of the `EpisodeRow` in hand has a main turn with no sample: what its `sampled` says it has not."""
    no_sample = ~exists().where(SampleRow.turn_id == TurnRow.id)
    return exists().where(TurnRow.session_id == EpisodeRow.session_id, TurnRow.kind == "main", no_sample)


def turn_ids_of(user_id: str) -> Select[Any]:
    """The ids of `user_id`'s turns, as a subquery: what a per-user view filters a table's `turn_id` by."""
    return select(TurnRow.id).join(SessionRow, SessionRow.id == TurnRow.session_id).where(SessionRow.user_id == user_id)
