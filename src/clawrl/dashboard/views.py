"""What the dashboard shows, as plain data read from the store (no HTML here).

`overview` is the run at a glance: how much was recorded, judged and trained, the live score
(mean judge verdict) per policy version, the published versions with their step metrics, and the
latest sessions. `session_page` is one conversation, turn by turn, with what the judge and the
trainer made of each turn. Both are what `GET /dashboard/api/overview` and the pages render.
"""

from __future__ import annotations

from typing import Any

from clawrl.messages import content_text, user_typed
from clawrl.store import Store
from clawrl.store.inspect import judgment_view, next_state_view, session_summary
from clawrl.types import SHARED_LINEAGE, Message

# Step metrics shown in the versions table, in this order (StepMetrics field, column title).
VERSION_METRICS = (
    ("num_samples", "samples"),
    ("mean_reward", "reward"),
    ("opd_fraction", "OPD share"),
    ("loss", "loss"),
    ("kl_to_reference", "KL to ref"),
    ("entropy", "entropy"),
    ("mean_staleness", "staleness"),
    ("logprob_drift", "log-prob drift"),
)


def overview(store: Store, user_id: str | None = None, recent_sessions: int = 25, recent_versions: int = 50) -> dict[str, Any]:
    """The run at a glance (newest versions and sessions first): everyone's, or (`user_id`) what is
    that user's alone: their sessions, counts, samples and live score, and the versions of their
    own lineage (none listed while the shared lineage answers them: its versions trained on others too)."""
    training = store.training
    lineage = user_id if user_id is not None and user_id in training.lineages() else SHARED_LINEAGE
    serving = training.serving_version(lineage)
    versions = training.versions(lineage if user_id is not None else None)
    shown = [] if user_id is not None and lineage == SHARED_LINEAGE else versions[-recent_versions:]
    return {
        "user": user_id,
        "lineage": lineage,
        "serving_version": serving,
        "newest_version": versions[-1].version if versions else 0,
        "counts": store.turns.counts(user_id),
        "samples": training.sample_counts(user_id),
        "drop_reasons": training.drop_reasons(user_id),
        "live_score": [
            {"version": row.policy_version, "judged": row.judged, "mean_score": row.mean_score,
             "vote_agreement": row.mean_vote_agreement}
            for row in store.judging.judgment_stats(user_id)
        ],
        "versions": [
            {"version": row.version, "parent": row.parent, "kind": row.kind, "step": row.step,
             "created_at": row.created_at, "serving": row.version == serving,
             "metrics": {name: getattr(row.metrics, name) for name, _ in VERSION_METRICS}}
            for row in reversed(shown)
        ],
        "sessions": [session_summary(session)
                     for session in store.turns.list_sessions(limit=recent_sessions, user_id=user_id)],
    }  # fmt: skip


def session_page(store: Store, session_id: str) -> dict[str, Any] | None:
    """One session's turns, each with its new input, answer, next state, verdict, feedback and sample,
    and whether it may be trained on (`train`) and, where not, who opted it out (`opt_out`)."""
    session = store.turns.session(session_id)
    if session is None:
        return None
    entries = store.turns.session_turns(session_id)
    ids = [entry.turn.id for entry in entries]
    judgments, samples = store.judging.judgments_for(ids), store.training.samples_for(ids)
    turns = []
    for entry in entries:
        turn, sample = entry.turn, samples.get(entry.turn.id)
        turns.append({
            "id": turn.id, "index": turn.index, "kind": turn.kind, "policy_version": turn.policy_version,
            "train": turn.opt_out is None, "opt_out": turn.opt_out,
            "finish_reason": turn.finish_reason, "response_text": turn.response_text, "tool_calls": turn.tool_calls,
            "input": new_input(turn.messages),
            "prompt_tokens": len(turn.prompt_token_ids), "response_tokens": len(turn.response_token_ids),
            "next_state": next_state_view(entry.next_state),
            "judgment": judgment_view(judgments.get(turn.id)),
            "feedback": [{"score": item.score, "text": item.text} for item in entry.feedback],
            "sample": None if sample is None else {
                "status": sample.status, "kind": sample.kind, "reward": sample.reward,
                "drop_reason": sample.drop_reason, "trained_version": sample.trained_version,
            },
        })  # fmt: skip
    return {**session_summary(session), "turns": turns}


def new_input(messages: list[Message]) -> list[dict[str, str]]:
    """The messages of a request after its last assistant message: what this turn answers
    (the whole request for a session's first turn, system prompt aside). User messages show what
    the user typed, without the wrapping their agent added (`messages.user_typed`)."""
    last_assistant = max((i for i, message in enumerate(messages) if message["role"] == "assistant"), default=-1)
    shown = []
    for position in range(last_assistant + 1, len(messages)):
        message = messages[position]
        if message["role"] in ("system", "developer"):
            continue
        if message["role"] == "user":
            earlier = next((m for m in reversed(messages[:position]) if m["role"] == "user"), None)
            text = user_typed(message, earlier)
        else:
            text = content_text(message.get("content"))
        shown.append({"role": message["role"], "content": text})
    return shown
