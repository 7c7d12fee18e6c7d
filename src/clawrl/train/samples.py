"""From judged main turns to training samples (DESIGN §6).

Per judged main turn (hint accepted = the judgment carries a hint):

| hint | score | sample                                  |
|------|-------|-----------------------------------------|
| yes  | ±1    | combined: teacher log-probs + reward    |
| yes  | 0     | OPD only (reward 0)                     |
| no   | ±1    | RL only (no teacher term)               |
| no   | 0     | none, except the at-least-one rule      |

The method then keeps what it can learn from: `rl` trains on rewards only (a hint-only turn gives
it nothing), `opd` on teacher log-probs only (a reward-only turn gives it nothing), `combine` on
everything.

At-least-one rule: a session's first judged turn that would give no sample is *held* until the
session either yields another sample (then it is dropped) or ends without one (then it becomes a
sample after all, so every session that was judged contributes at least one). A turn with no next
state (a session's last) is trained on only when it carries explicit feedback.

Reward baseline (`--reward-baseline-samples N`, `centred`): a sample's reward may be the judge's
score minus the mean of its N previous nonzero scores, so that the part of the gradient common
to every answer (the question's numbers, the opener) cancels between praise and complaints. With
a lineage per user (`per_user`) the window is the user's own scores (DESIGN §12: a user's lineage
learns from that user's turns only, and another user's verdicts must not move its rewards).

A turn served with memory notes (`--memory on`) under `--memory-train without-notes` is trained
to answer as the notes asked without them (DESIGN §13): the notes are hindsight hints the serving
prompt already held. Its teacher prompt is the request with its notes (and the judge's hint, when
there is one), so such a turn has a teacher even without a hint (the table's "hint" column reads
"hint or notes"); its student prompt (`Sample.student_prompt_token_ids`) is the request rendered
as the client sent it, with no notes. The behaviour log-probs were taken under the prompt with the
notes, so the update's importance weight is π_old(a | no notes) / π_b(a | notes), truncated as for
any stale sample. The notes are the ones the turn was served with (`Turn.memory_note_ids`) as they
read now: one the user removed since is left out, one they edited says what they say now. Under
`as-served` a note-served turn trains as recorded, notes in the student's prompt.

Teacher log-probs are forced-decoding log-probs of the turn's recorded response token ids under the
teacher prompt (`engines.chat.teacher_prompt_ids`: the recorded request with the hint appended to
its last user message, rendered by the same chat template with the same tools as serving, the
prompt hint selection scored). The response is never re-tokenized; only the teacher's *prompt*
is new text.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from clawrl.model.chat import render_prompt, teacher_prompt_ids
from clawrl.model.notes import with_notes
from clawrl.store.training import JudgedTurn, TrainingStore
from clawrl.messages import teacher_messages
from clawrl.types import DropReason, MemoryNote, Method, Sample, SampleKind, ScoredResponse, Turn

log = logging.getLogger(__name__)

# (prompt ids, response ids, top_k, the grammar the response was decoded under or None) -> teacher-forced
# log-probs, as Engine.score returns them (under the grammar's masks when there is one)
TeacherScorer = Callable[[list[int], list[int], int, str | None], ScoredResponse]
# a user's memory notes, every one still kept (`MemoryStore.notes`)
UserNotes = Callable[[str], list[MemoryNote]]


@dataclass(frozen=True)
class Decision:
    """What a judged turn becomes before the at-least-one rule: a sample kind, or none."""

    kind: SampleKind  # combined, opd, rl or none
    reward: float
    needs_teacher: bool


def decide(score: int, hint: str | None, method: Method, noted: bool = False) -> Decision:
    """The table above, filtered by what `method` can learn from; `noted`: the turn's memory notes
    are trained in (they give a teacher as a hint does)."""
    uses_reward, uses_teacher = method in ("rl", "combine"), method in ("opd", "combine")
    reward = float(score) if uses_reward else 0.0  # `opd` distils only: every sample is OPD-only
    teacher = (hint is not None or noted) and uses_teacher
    if reward != 0:
        return Decision("combined" if teacher else "rl", reward, teacher)
    if teacher:
        return Decision("opd", 0.0, True)
    return Decision("none", 0.0, False)


def centred(reward: float, recent_scores: Sequence[float]) -> float:
    """`reward` minus the mean of `recent_scores` (the judge's earlier nonzero scores); a reward of 0
    (no RL signal) stays 0, and with no earlier score there is no baseline yet."""
    if reward == 0 or not recent_scores:
        return reward
    return reward - sum(recent_scores) / len(recent_scores)


class SampleBuilder:
    """Turns newly judged turns into sample rows, and settles held ones."""

    def __init__(
        self,
        training: TrainingStore,
        tokenizer: PreTrainedTokenizerBase,
        method: Method,
        teacher: TeacherScorer,
        teacher_name: Callable[[], str],
        topk: int = 0,
        max_context_tokens: int | None = None,
        reward_baseline_samples: int = 0,
        per_user: bool = False,
        user_notes: UserNotes | None = None,
    ) -> None:
        self.training, self.tokenizer, self.method = training, tokenizer, method
        self.teacher, self.teacher_name, self.topk = teacher, teacher_name, topk
        self.max_context_tokens = max_context_tokens
        self.reward_baseline_samples = reward_baseline_samples
        self.per_user = per_user  # a lineage per user: each user's own reward baseline window
        self.user_notes = user_notes  # `--memory-train without-notes`: how a note-served turn's notes read now

    def build(self, limit: int = 64) -> int:
        """Give every judged turn (up to `limit`, oldest first) its sample row; returns how many."""
        judged = self.training.judged_turns_without_sample(limit)
        if judged:
            windows: dict[str | None, deque[float]] = {}
            self.training.add_samples([self._sample_for(item, self._window(windows, item.user_id)) for item in judged])
        self._settle_held()
        return len(judged)

    def _window(self, windows: dict[str | None, deque[float]], user_id: str) -> deque[float]:
        """The judge's latest nonzero scores (of this user's samples, per user), oldest first, read
        from the store so that a restarted trainer centres exactly as the one before it would have;
        each new score of this build joins them."""
        owner = user_id if self.per_user else None
        if owner not in windows:
            size = self.reward_baseline_samples
            windows[owner] = deque(self.training.recent_chat_scores(size, owner) if size else [], maxlen=max(size, 1))
        return windows[owner]

    def _sample_for(self, item: JudgedTurn, recent_scores: deque[float]) -> Sample:
        turn, judgment = item.turn, item.judgment
        notes = self._served_notes(item.user_id, turn)
        decision = decide(judgment.score, judgment.hint, self.method, noted=bool(notes))
        reward = decision.reward
        if self.reward_baseline_samples and reward != 0:
            reward = centred(reward, recent_scores)
            recent_scores.append(decision.reward)
        base = Sample(
            turn_id=turn.id,
            status="ready",
            kind=decision.kind,
            reward=reward,
            behaviour_version=turn.policy_version,
            hint=judgment.hint,
        )
        if not (item.has_next_state or item.has_feedback):
            return _dropped(base, "no_next_state")
        if not turn.trainable or not turn.response_token_ids:
            return _dropped(base, "untrainable")
        if self.max_context_tokens is not None and len(turn.prompt_token_ids) + len(turn.response_token_ids) > self.max_context_tokens:
            return _dropped(base, "too_long")  # longer than the trainer's context: never truncated
        if notes is not None:  # trained without the notes it was served with
            base.student_prompt_token_ids = render_prompt(self.tokenizer, turn.messages, turn.tools)
        if decision.kind == "none":
            if item.first_judged_in_session:
                base.status = "held"
                return base
            return _dropped(base, "no_signal")
        if decision.needs_teacher:
            scored = self._teacher_scores(turn, judgment.hint, notes or [])
            if scored is None:
                return _dropped(base, "teacher_too_long")
            base.teacher = self.teacher_name()
            base.teacher_logprobs = scored.logprobs
            if self.topk and not turn.sampling.grammar:
                base.teacher_topk_ids, base.teacher_topk_logprobs = scored.top_token_ids, scored.top_logprobs
        return base

    def _served_notes(self, user_id: str, turn: Turn) -> list[MemoryNote] | None:
        """The notes `turn` was served with, as they read now, when they are to be trained in (oldest
        first, as injected); None when the turn had none or is trained as served."""
        if self.user_notes is None or not turn.memory_note_ids:
            return None
        served = set(turn.memory_note_ids)
        return [note for note in self.user_notes(user_id) if note.id in served]

    def _teacher_prompt(self, turn: Turn, hint: str | None, notes: list[MemoryNote]) -> list[int]:
        """The teacher's prompt: the request with the hint, and with the notes the turn is trained without.
        With the notes unchanged and no hint, this renders exactly the ids the turn was fed."""
        if not notes:
            assert hint is not None
            return teacher_prompt_ids(self.tokenizer, turn, hint)
        messages = teacher_messages(turn.messages, hint) if hint is not None else turn.messages
        return render_prompt(self.tokenizer, with_notes(messages, notes), turn.tools)

    def _teacher_scores(self, turn: Turn, hint: str | None, notes: list[MemoryNote]) -> ScoredResponse | None:
        prompt = self._teacher_prompt(turn, hint, notes)
        if self.max_context_tokens is not None and len(prompt) + len(turn.response_token_ids) > self.max_context_tokens:
            return None
        # under a grammar the teacher scores within its masks too, and gives no top-K: the term would
        # compare the student at tokens the grammar forbade (log 0), so such turns take the token-level term.
        # A lazy grammar (strict tools under `auto`) too: its free text is nearly unmasked, but a call it
        # holds has positions with fewer allowed tokens than K (the name, the keys: often one), and the
        # loss switches the top-K term per turn, not per position; its turns calling no tool could keep
        # it, but which turn calls is known only from its tokens, and one rule for every grammar is simpler
        grammar = turn.sampling.grammar
        return self.teacher(prompt, list(turn.response_token_ids), 0 if grammar else self.topk, grammar)

    def _settle_held(self) -> None:
        held = self.training.held_samples()
        superseded = [item.turn_id for item in held if item.session_has_sample]
        if superseded:
            self.training.drop_samples(superseded, "no_signal", from_status="held")
        ended = [item.turn_id for item in held if item.session_done and not item.session_has_sample]
        if ended:
            self.training.release_held(ended)


def _dropped(sample: Sample, reason: DropReason) -> Sample:
    sample.status, sample.drop_reason = "dropped", reason
    return sample
