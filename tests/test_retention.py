"""Retention (issue 33, item 3; DESIGN §12): `clawrl serve --retain-days N` removes turns older than N
days, trained on or not, with their next states, verdicts and hints, samples, feedback, and the
sessions and episodes they leave empty, in the server's background while it answers; nothing of
them stays in SQLite's files. On SQLite and PostgreSQL; a real server on a real port."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from clawrl.store import Store
from clawrl.store.schema import EpisodeRow
from clawrl.store.retention import DAY_S, remove_older_than
from clawrl.types import Episode, NextState
from tests.helpers import judgment, ready_sample, start_server, turn, user, wait_until

CANARY = "canary-retention-7f3a9c"


def old_and_new(store: Store, now: float) -> None:
    """Session "old": two turns three days old (judged, sampled, with feedback and a hint naming the
    canary); session "mixed": a turn three days old and one of now; an episode registered three days
    ago and never played."""
    three_days_ago = now - 3 * DAY_S
    store.turns.record_turn(turn("o1", "old", [user(f"say {CANARY}")], f"{CANARY} said"), "header", now=three_days_ago)
    store.turns.record_turn(turn("o2", "old", [user("thanks")], "ok"), "header", NextState("o1", [user(CANARY)], "o2"),
                            now=three_days_ago + 60)  # fmt: skip
    store.judging.record_judgment(judgment("o1", -1, f"Say {CANARY} less often."))
    store.training.add_samples([ready_sample("o1")])
    store.turns.add_feedback("o2", 1, f"more {CANARY}")
    store.turns.record_turn(turn("m1", "mixed", [user(CANARY)], "old answer"), "header", now=three_days_ago)
    store.turns.record_turn(turn("m2", "mixed", [user("hello")], "new answer"), "header", NextState("m1", [user("hello")], "m2"),
                            now=now)  # fmt: skip
    store.episodes.start(Episode("ep-old", "toolcall", "task", "group", 1, 0))
    with store.write() as db:  # registered three days ago
        db.execute(update(EpisodeRow).where(EpisodeRow.session_id == "ep-old").values(created_at=three_days_ago))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_turns_older_than_the_retention_go_with_all_that_hangs_on_them(backend: str, tmp_path: Path,
                                                                        request: pytest.FixtureRequest) -> None:  # fmt: skip
    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else f"sqlite:///{tmp_path / 'clawrl.db'}"
    store, now = Store(url), time.time()
    old_and_new(store, now)
    removed = remove_older_than(store, 2, now=now)
    assert removed == {"turns": 3, "next_states": 2, "judgments": 1, "samples": 1, "feedback": 1, "sessions": 1,
                       "episodes": 1, "judge_queue": 2}  # fmt: skip
    assert [store.turns.turn(t) is None for t in ("o1", "o2", "m1", "m2")] == [True, True, True, False]
    assert store.turns.session("old") is None and store.turns.session("mixed") is not None
    assert store.episodes.episode("ep-old") is None
    assert remove_older_than(store, 2, now=now) == {}  # nothing left to remove
    assert remove_older_than(store, 2, now=now + 3 * DAY_S) == {"turns": 1, "sessions": 1}
    store.close()


def test_a_turn_continuing_a_removed_turn_is_recorded_without_its_next_state(tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    store.turns.record_turn(turn("t2", "s", [user("again")], "a"), "header", NextState("gone", [user("again")], "t2"))
    assert store.turns.turn("t2") is not None and store.turns.next_states(["gone"]) == {}


def test_the_server_removes_expired_turns_in_the_background_and_leaves_no_copy_on_disk(tiny_model_dir: Path,
                                                                                       run_dir: Path) -> None:  # fmt: skip
    store = Store.for_run_dir(run_dir)
    old_and_new(store, time.time())
    store.close()
    with start_server(tiny_model_dir, run_dir, retain_days=2, served_model_name="tiny") as server, httpx.Client(base_url=server.base_url, timeout=60) as http:
        store = Store.for_run_dir(run_dir)
        wait_until(lambda: store.turns.turn("o1") is None, 60, "the retention pass")
        body = {"model": "tiny", "messages": [user("hello")], "max_tokens": 4}
        answered = http.post("/chat/completions", json=body, headers={"X-Session-Id": "live"})
        assert answered.status_code == 200
        assert store.turns.turn(answered.headers["x-clawrl-turn"]) is not None
        assert store.turns.session("old") is None and store.turns.turn("m2") is not None
        on_disk = b"".join(path.read_bytes() for path in run_dir.glob("clawrl.db*"))
        assert CANARY.encode() not in on_disk
    store.close()
