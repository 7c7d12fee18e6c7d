"""The store side of judging: which turns can be claimed, exclusive expiring leases, one verdict per turn."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from clawrl.store import Store
from clawrl.store.inspect import session_detail
from tests.helpers import judgment, record, user


def store_with_conversation(tmp_path: Path) -> Store:
    """s1: t1 -> t2 (t1 has a next state), t3 -> t4 (t3 has one); t4 is the session's last turn."""
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("q1")], "a1")
    record(store, "t2", "s1", [user("q2")], "a2", continues_turn_id="t1", next_state=[user("q2")])
    record(store, "t3", "s1", [user("q3")], "a3", continues_turn_id="t2", next_state=[user("q3")])
    record(store, "t4", "s1", [user("q4")], "a4", continues_turn_id="t3", next_state=[user("q4")])
    return store


def test_only_turns_with_a_next_state_or_feedback_are_claimed(tmp_path: Path) -> None:
    store = store_with_conversation(tmp_path)
    assert store.judging.claim_turns_to_judge("w", limit=10, lease_s=60) == ["t1", "t2", "t3"]
    store.turns.add_feedback("t4", -1, "wrong")
    assert store.judging.claim_turns_to_judge("w", limit=10, lease_s=60) == ["t4"]


def test_leases_are_exclusive_and_expire(tmp_path: Path) -> None:
    store = store_with_conversation(tmp_path)
    first = store.judging.claim_turns_to_judge("a", limit=2, lease_s=60, now=1000.0)
    second = store.judging.claim_turns_to_judge("b", limit=10, lease_s=60, now=1001.0)
    assert first == ["t1", "t2"] and second == ["t3"]
    # worker a was killed: after its lease runs out, its turns are claimed again
    assert store.judging.claim_turns_to_judge("c", limit=10, lease_s=60, now=1100.0) == ["t1", "t2", "t3"]


def test_a_turn_is_judged_once(tmp_path: Path) -> None:
    store = store_with_conversation(tmp_path)
    store.judging.claim_turns_to_judge("a", limit=1, lease_s=60)
    assert store.judging.record_judgment(judgment("t1", 1)) is True
    assert store.judging.record_judgment(judgment("t1", -1)) is False
    assert store.judging.judgment("t1").score == 1
    assert "t1" not in store.judging.claim_turns_to_judge("b", limit=10, lease_s=60)


def test_released_lease_is_claimable_at_once(tmp_path: Path) -> None:
    store = store_with_conversation(tmp_path)
    assert store.judging.claim_turns_to_judge("a", limit=1, lease_s=600) == ["t1"]
    store.judging.release_lease("t1", "a")
    assert store.judging.claim_turns_to_judge("b", limit=1, lease_s=600) == ["t1"]


def test_a_dead_workers_leases_are_given_back_together_and_its_verdicts_name_their_worker(tmp_path: Path) -> None:
    store = store_with_conversation(tmp_path)
    assert store.judging.claim_turns_to_judge("dead", limit=2, lease_s=600) == ["t1", "t2"]
    assert store.judging.claim_turns_to_judge("alive", limit=1, lease_s=600) == ["t3"]
    store.judging.release_leases("dead")  # its supervisor saw it die: the others' leases stay
    assert store.judging.claim_turns_to_judge("next", limit=10, lease_s=600) == ["t1", "t2"]
    assert store.judging.record_judgment(dataclasses.replace(judgment("t1", 1), worker_id="next")) is True
    assert store.judging.judgment("t1").worker_id == "next"


def test_two_stores_on_one_file_never_claim_the_same_turn(tmp_path: Path) -> None:
    """Two worker processes share the SQLite file; each opens its own connection pool."""
    store_with_conversation(tmp_path)
    a, b = Store.for_run_dir(tmp_path), Store.for_run_dir(tmp_path)
    claims = [a.judging.claim_turns_to_judge("a", limit=1, lease_s=60), b.judging.claim_turns_to_judge("b", limit=1, lease_s=60),
              a.judging.claim_turns_to_judge("a", limit=1, lease_s=60), b.judging.claim_turns_to_judge("b", limit=1, lease_s=60)]
    flat = [turn for claim in claims for turn in claim]
    assert sorted(flat) == ["t1", "t2", "t3"]


def test_session_detail_shows_each_turns_judgment(tmp_path: Path) -> None:
    store = store_with_conversation(tmp_path)
    store.judging.record_judgment(judgment("t1", -1))
    turns = session_detail(store, "s1")["turns"]
    assert turns[0]["judgment"] == {"score": -1, "votes": [-1], "hint": None, "source": "rule"}
    assert turns[1]["judgment"] is None


def test_a_turn_is_no_longer_claimed_after_max_attempts(tmp_path: Path) -> None:
    store = store_with_conversation(tmp_path)
    for attempt in range(3):  # three claims, each failing and given back
        assert "t1" in store.judging.claim_turns_to_judge(f"w{attempt}", 1, 60.0, max_attempts=3)
        store.judging.release_lease("t1", f"w{attempt}")
    assert store.judging.claim_turns_to_judge("w3", 10, 60.0, max_attempts=3) == ["t2", "t3"]  # t1 is given up, not the others


def test_feedback_after_the_verdict_does_not_bring_the_turn_back(tmp_path: Path) -> None:
    store = store_with_conversation(tmp_path)
    store.judging.record_judgment(judgment("t1", 1))
    store.turns.add_feedback("t1", -1, "actually wrong")
    assert store.judging.claim_turns_to_judge("w", limit=10, lease_s=60) == ["t2", "t3"]


def test_a_hung_up_turn_is_never_judged_even_when_continued(tmp_path: Path) -> None:
    """A cancelled stream's client never saw the whole answer: what it said next does not judge it."""
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("q1")], "a1", finish_reason="cancelled")
    record(store, "t2", "s1", [user("q2")], "a2", continues_turn_id="t1", next_state=[user("q2")])
    store.turns.add_feedback("t1", 1, None)
    assert store.judging.claim_turns_to_judge("w", limit=10, lease_s=60) == []


def test_the_judge_backlog_is_what_waits_for_a_verdict(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    record(store, "t1", "s1", [user("q1")], "a1")
    recorded = time.time()
    assert store.judging.judge_backlog() == (0, 0.0)  # nothing said after it yet
    record(store, "t2", "s1", [user("q2")], "a2", continues_turn_id="t1", next_state=[user("q2")])
    waiting, oldest_age_s = store.judging.judge_backlog(now=recorded + 60.0)
    assert waiting == 1 and 59.0 <= oldest_age_s <= 61.0
    store.judging.record_judgment(judgment("t1", 1))
    assert store.judging.judge_backlog() == (0, 0.0)
