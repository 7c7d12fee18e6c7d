"""The RL vocabulary: the few plain records every loop passes around (DESIGN §2-§6).

One request/answer pair is a `Turn`: the exact prompt token ids the engine was fed, the
response ids and log-probs it produced, and the policy version that produced them. What the
session's next request adds after the answer is the turn's `NextState`; a judge turns both into a
`Judgment`; the trainer turns a judged turn into a `Sample`; one optimizer step consumes
`TrainingExample`s (a sample with its turn) and publishes a `PolicyVersion`.

serve builds the Turn, the store keeps it (mapping rows to and from these records in one place,
`store/records.py`), judge and train read it back; nobody keeps a copy of its fields under other
names. Statuses and kinds are `Literal` aliases, so a typo is a type error, not a silent
no-match in a query.

General agents (DESIGN §9): an environment step is a main `Turn` whose `NextState` is the
environment's observation (tool results); an `Episode` is one session's main turns in order, with
the outcome and per-step environment rewards; a group is the episodes of one task. The judge
scores each step like any main turn, and the group-normalised advantage of a step goes into
`Sample.reward`, so the trainer needs no second shape.

This module imports nothing from clawrl: it is the ground floor every package builds on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Message = dict[str, Any]  # an OpenAI chat message, normalised (role, content, tool_calls, ...)
ToolSpec = dict[str, Any]  # an OpenAI tool definition ({"type": "function", "function": {...}})

TurnKind = Literal["main", "side"]  # side: served and recorded, never judged or trained on
SessionIdSource = Literal["header", "body", "user", "inferred", "new"]
SessionDoneReason = Literal["client", "idle"]
# Why a recorded turn is never judged nor trained on (DESIGN §12, opt-out): its request said so
# (`X-Clawrl-Train: false` / `"train": false`), its session's first request did, or its user is --no-train
OptOut = Literal["request", "session", "user"]
FinishReason = Literal["stop", "length", "tool_calls", "cancelled"]  # cancelled: the client hung up
JudgmentSource = Literal["prm", "rule", "feedback"]  # a language model, the rules, or explicit feedback
SampleStatus = Literal["ready", "held", "dropped", "trained"]  # held: waiting on the at-least-one rule
SampleKind = Literal["combined", "opd", "rl", "at_least_one", "none"]
DropReason = Literal[
    "no_signal", "no_next_state", "untrainable", "too_long", "teacher_too_long", "stale", "non_finite_gradient",
    "failed_episode",  # an episode step whose episode failed (crash, timeout, malformed action)
    "flat_group",  # an episode step whose rewards across its group (at its step index) are all equal
]
Method = Literal["rl", "opd", "combine"]
Teacher = Literal["base", "policy"]  # the OPD teacher: the frozen starting weights or the current ones
WeightsKind = Literal["lora", "full"]
PointerReason = Literal["publish", "rollback"]
AdaptersMode = Literal["shared", "per-user"]  # one lineage for everyone, or one per user (DESIGN §12)
# the lineage everyone's turns train (`--adapters shared`, today the only one); per-user lineages take the user's name
SHARED_LINEAGE = "shared"
# The user whose records are those of a server without users (and every record of a run from before
# users existed): the admin's key, or no key where the server has none, speaks as this user.
DEFAULT_USER = "default"
EpisodeStatus = Literal["running", "finished", "failed"]
# `NextState.source_turn_id` of an episode's final observation: no request carried it, the episode's result did
EPISODE_RESULT_SOURCE = "episode"


@dataclass
class TurnSampling:
    """How a turn's response was sampled: the request's settings after the server's defaults."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    # the llguidance grammar the response was decoded under (JSON outputs, forced tool calls), or None;
    # its log-probs are of the distribution masked to it, and the trainer scores it under the same masks
    grammar: str | None = None


@dataclass
class Session:
    """One conversation; `id_source` says how its requests were recognised as one."""

    id: str
    id_source: SessionIdSource
    created_at: float
    updated_at: float
    done: bool = False
    done_reason: SessionDoneReason | None = None
    num_turns: int = 0
    user_id: str = DEFAULT_USER  # whose conversation it is: their key's user, fixed when it starts
    train: bool = True  # False: its first request opted out of training, and so is every turn of it


@dataclass
class User:
    """Someone with a key of their own (DESIGN §12); the key itself is never stored, only its hash."""

    id: str  # the name given to `clawrl users add`
    key_hint: str  # the key's first characters, to tell keys apart in a listing
    created_at: float
    key_created_at: float
    store: bool = True  # False (`clawrl users set NAME --no-store`): their requests are answered, never recorded
    train: bool = True  # False (`--no-train`): their turns are recorded, never judged nor trained on


@dataclass
class Turn:
    """One request and the answer the engine produced, token for token (DESIGN §4: never re-tokenize).

    The id is chosen when the request arrives (it is the OpenAI response id and the X-Clawrl-Turn
    header). `index` and `created_at` are set by the store when the turn is recorded.
    """

    id: str
    session_id: str
    kind: TurnKind
    model: str
    policy_version: int  # the version that produced the response (pi_behaviour)
    messages: list[Message]  # the request's messages
    tools: list[ToolSpec] | None
    sampling: TurnSampling  # how the response was sampled
    prompt_token_ids: list[int]  # exactly what the engine was fed
    response_token_ids: list[int]  # exactly what it produced (including any stop-string tokens)
    response_logprobs: list[float]  # the engine's raw log-probs of those tokens
    response_text: str  # what the client was shown (cut at a stop string, tool calls parsed out)
    tool_calls: list[dict[str, Any]] | None
    finish_reason: FinishReason
    # sha256 of the answer as a client echoes it (text and tool calls): how an unmodified client's
    # next request is matched to this turn. None for an answer no client received.
    answer_fingerprint: str | None = None
    message_hashes: list[str] = field(default_factory=list)  # of the prompt's non-system messages
    latency_s: float = 0.0
    index: int = -1  # position within the session, from 0
    created_at: float = 0.0
    opt_out: OptOut | None = None  # why it is never judged nor trained on; None: it may be
    # the user's memory notes rendered into `prompt_token_ids` (`--memory on`), oldest first; None: none
    memory_note_ids: list[int] | None = None

    @property
    def trainable(self) -> bool:
        """A main turn the client received in full and nobody opted out of training: a side turn, a
        hang-up or an opted-out turn is never trained on."""
        return self.kind == "main" and self.finish_reason != "cancelled" and self.opt_out is None


@dataclass
class NextState:
    """What the session's next request added after a main turn's answer, with roles (DESIGN §3)."""

    turn_id: str  # the turn it follows
    messages: list[Message]
    source_turn_id: str  # the turn whose request carried it, or EPISODE_RESULT_SOURCE
    created_at: float = 0.0


@dataclass
class Episode:
    """One environment episode played through the server (DESIGN §9): the session holding its steps.

    Registered (`running`) before its first step, so its turns are never taken for a chat; ended
    `finished` with the outcome or `failed` (kept out of training). Its steps are the session's
    main turns in order; `step_rewards[t]` is the environment's reward for step t.
    """

    session_id: str
    env: str
    task: str
    group_id: str  # the G rollouts of one task share it (GRPO's group)
    group_size: int  # how many episodes the group has: it is complete when all have ended
    seed: int
    status: EpisodeStatus = "running"
    reward: float | None = None  # the outcome, once finished
    step_rewards: list[float] = field(default_factory=list)
    error: str | None = None  # why it failed
    created_at: float = 0.0
    ended_at: float | None = None


@dataclass
class Feedback:
    """Explicit 👍/👎 (and optional text) for one turn; outranks the judge's score (DESIGN §5)."""

    turn_id: str
    score: int  # +1 or -1
    text: str | None = None
    created_at: float = 0.0


# the judge's chosen hint, a standing wish in a reply read as praise, a feedback text, typed in
MemoryNoteSource = Literal["hint", "reply", "feedback", "user"]
MemoryFrom = Literal["directives", "hints"]  # what of a judge's hint becomes a note (`--memory-from`)


@dataclass
class MemoryNote:
    """Something a user taught, kept to be said again in their later prompts (`--memory on`, DESIGN §13)."""

    id: int
    user_id: str
    text: str
    source: MemoryNoteSource
    turn_id: str | None  # the turn it was taught on; None for a note the user added
    created_at: float  # when it was first taught
    updated_at: float  # when it was last taught (a note taught again is the newest): what "newest kept" ranks by
    retired_at: float | None = None  # when the weights were found to follow it unprompted; None: active


@dataclass
class TurnContext:
    """A turn with what came after it: what a judge reads."""

    turn: Turn
    next_state: NextState | None
    feedback: list[Feedback]  # oldest first

    @property
    def next_messages(self) -> list[Message]:
        return self.next_state.messages if self.next_state is not None else []


@dataclass
class HintCandidate:
    """A directive hint a judge proposed, with its top-k overlap when hints were compared."""

    hint: str
    overlap: int | None = None


@dataclass
class Judgment:
    """The verdict on one main turn (DESIGN §5): a score in {+1, -1, 0} and perhaps a hint."""

    turn_id: str
    score: int
    votes: list[int | None]  # each PRM vote; None = unreadable
    vote_agreement: float  # share of votes equal to the judge's score
    invalid_votes: int
    rationale: str | None
    hint: str | None  # the chosen hint (overlap-guided), None when no judge gave one
    hint_candidates: list[HintCandidate]
    source: JudgmentSource
    judge_model: str
    latency_s: float
    created_at: float = 0.0
    worker_id: str | None = None  # the judge worker that wrote it (a `clawrl judge`, the server's, a Ray actor's)


@dataclass
class ScoredResponse:
    """Teacher-forced log-probs of a given response under a given prompt."""

    logprobs: list[float]  # log p(response[t] | prompt, response[:t]) for every t
    top_token_ids: list[list[int]]  # per position, the top_k most likely ids (empty lists when top_k=0)
    top_logprobs: list[list[float]]  # their log-probs, aligned with top_token_ids


@dataclass
class Sample:
    """What the trainer made of one judged main turn (DESIGN §6): training signal, or why not."""

    turn_id: str
    status: SampleStatus
    kind: SampleKind
    reward: float  # r in {-1, 0, +1} (minus the baseline with --reward-baseline-samples); 0 for OPD-only samples
    behaviour_version: int  # the turn's policy version, for staleness
    hint: str | None = None
    drop_reason: DropReason | None = None
    teacher: str | None = None  # "base" or "policy vN": who scored the teacher log-probs
    teacher_logprobs: list[float] | None = None  # log pi_T of the turn's response tokens under the hinted prompt
    teacher_topk_ids: list[list[int]] | None = None  # --opd-topk K: the teacher's top-K ids per response position
    teacher_topk_logprobs: list[list[float]] | None = None  # their log-probs, aligned with teacher_topk_ids
    # the prompt the student is scored and trained under, when not the turn's prompt_token_ids: a turn
    # served with memory notes, trained without them (`--memory-train without-notes`)
    student_prompt_token_ids: list[int] | None = None
    trained_version: int | None = None  # the version whose step used it
    created_at: float = 0.0


@dataclass
class TrainingExample:
    """A ready sample with its turn: the exact ids and log-probs plus the signal, for one update step."""

    turn: Turn
    sample: Sample
    # for a turn decoded under a grammar: [R, W] int32 masks of the tokens each position could be sampled
    # from (`model.constraints.allowed_bits`, a torch tensor), set by the trainer; None: unconstrained
    allowed_bits: Any = None

    @property
    def prompt_token_ids(self) -> list[int]:
        """The prompt the student is scored and trained under: the ids fed, unless the sample names another."""
        return self.sample.student_prompt_token_ids or self.turn.prompt_token_ids


@dataclass
class StepMetrics:
    """What one update on a batch did. Means are over response tokens unless the name says samples, each
    token weighted as in the loss (`LossConfig.loss_agg`: equally, except under `seq-mean`, where
    every response weighs the same). Every field is a plain number, so `dataclasses.asdict` gives a
    JSON record for the store, `/metrics` and TensorBoard. With several optimizer steps per batch (`ppo_epochs`,
    `mini_batches`), the loss, the token means and `grad_norm` are the means over the steps of each
    step's figure (under its mini-batch's weights)."""

    loss: float = 0.0  # the optimised objective (its tokens aggregated as `loss_agg` says)
    clip_fraction: float = 0.0  # share of tokens whose ratio was clipped (gradient stopped)
    approx_kl: float = 0.0  # k3 estimate of KL(pi_old || pi_theta): mean of (rho - 1) - log rho
    entropy: float = 0.0  # mean entropy of the policy over response positions (nats)
    kl_to_reference: float = 0.0  # k3 estimate of KL(pi_theta || pi_ref); 0 when kl_beta is 0 (not computed)
    topk_reverse_kl: float = 0.0  # mean top-K reverse KL to the teacher; 0 unless opd_topk is set
    mean_advantage: float = 0.0  # mean per-token advantage
    mean_reward: float = 0.0  # mean reward over samples
    opd_fraction: float = 0.0  # share of samples that carried teacher log-probs
    logprob_drift: float = 0.0  # mean |log pi_old - log pi_behaviour| over response tokens
    mean_is_weight: float = 0.0  # mean truncated importance weight min(pi_old / pi_behaviour, cap)
    mean_staleness: float = 0.0  # trainer version minus behaviour version, mean over samples (set by the trainer)
    num_samples: int = 0
    num_tokens: int = 0  # response tokens trained on
    grad_norm: float = 0.0  # global gradient norm before clipping
    skipped_step: int = 0  # 1 when every gradient was non-finite and the weights were left unchanged
    optimizer_steps: int = 0  # optimizer steps taken on the batch: ppo_epochs x mini_batches, less non-finite ones
    step_seconds: float = 0.0  # wall time of the whole update step
    tokens_per_s: float = 0.0  # num_tokens / step_seconds


@dataclass
class PolicyVersion:
    """A published policy: one optimizer step's weights under RUN_DIR/policy/LINEAGE/vN/ (v0 = the base model)."""

    version: int
    parent: int  # the version it was trained from
    kind: WeightsKind
    path: str
    sha256: str  # of the version's manifest.json, which lists the digest of every other file
    step: int  # optimizer steps from the base along its lineage
    metrics: StepMetrics  # what the step that made it did
    num_samples: int = 0
    created_at: float = 0.0
    lineage: str = SHARED_LINEAGE  # the line of versions it belongs to: one shared by everyone, or one per user
    pruned: bool = False  # its directory was removed (--keep-versions): the record stays, the weights are gone
    pinned: bool = False  # kept whatever --keep-versions says (`clawrl versions pin`)
