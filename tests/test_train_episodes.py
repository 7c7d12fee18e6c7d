"""Training from episodes (DESIGN §9): step rewards, group-normalised advantages and drops as pure
functions on hand-computed values; the episode records and group reads on SQLite and PostgreSQL;
and a real trainer making an optimizer step (`--method rl`) from the samples of a recorded group.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy import case, func, select, update
from transformers import AutoTokenizer

from clawrl.config import EngineConfig, TrainConfig
from clawrl.store import Store
from clawrl.store.episodes import StepCountError
from clawrl.store.migrations import SCHEMA_VERSION
from clawrl.store.retention import remove_older_than
from clawrl.store.schema import EpisodeRow, Meta, TurnRow, unsampled_step
from clawrl.train.episodes import EpisodeSampleBuilder, group_advantages, step_rewards
from clawrl.train.trainer import Trainer
from clawrl.types import EPISODE_RESULT_SOURCE, Episode, Sample
from tests.helpers import Conversation, judgment, record, user

TOOL_RESULT = [{"role": "tool", "tool_call_id": "c", "content": "1"}]


# --- pure functions -----------------------------------------------------------------------------


def test_step_rewards_discount_the_outcome_and_add_the_judge_term() -> None:
    # T = 4: the outcome discounted by 0.9^3 ... 0.9^0; the judge's +1, none, -1 weighted 0.3, and the last step's
    # score (the judge read only "the task is being checked") left out: the outcome is its verdict
    assert step_rewards(1.0, [1, None, -1, 1], gamma=0.9, judge_coef=0.3) == pytest.approx([0.729 + 0.3, 0.81, 0.9 - 0.3, 1.0])
    assert step_rewards(0.0, [1, 1], gamma=0.5, judge_coef=0.0) == [0.0, 0.0]
    assert step_rewards(2.0, [1], gamma=0.5, judge_coef=1.0) == [2.0]
    # quitting at once is worth the outcome, 0; a step that worked, then quitting, is worth more at step 0
    quit_now, worked_then_quit = step_rewards(0.0, [1], 0.9, 0.3), step_rewards(0.0, [1, 1], 0.9, 0.3)
    assert quit_now == [0.0] and worked_then_quit[0] == pytest.approx(0.3)


def test_group_advantages_normalise_per_step_index() -> None:
    # index 0 over [1, 3, 1]: mean 5/3, population std sqrt(8/9); index 1 over [2, 2]: no spread
    advantages = group_advantages([[1.0, 2.0], [3.0], [1.0, 2.0]], eps=0.0)
    std = math.sqrt(8 / 9)
    assert advantages[0][0] == pytest.approx((1 - 5 / 3) / std) == pytest.approx(-1 / math.sqrt(2))
    assert advantages[1][0] == pytest.approx((3 - 5 / 3) / std) == pytest.approx(math.sqrt(2))
    assert advantages[0][1] is None and advantages[2][1] is None
    # eps keeps the division finite: (r - mean) / (std + eps)
    assert group_advantages([[1.0], [0.0]], eps=0.5)[0][0] == pytest.approx(0.5 / 1.0)


def test_groups_without_spread_give_no_advantage() -> None:
    assert group_advantages([[0.5, 1.0], [0.5, 1.0]]) == [[None, None], [None, None]]
    assert group_advantages([[1.0, 0.0]]) == [[None, None]]  # one episode: nothing to compare with
    assert group_advantages([]) == []


# --- the store ----------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path / 'clawrl.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    opened = Store(url)
    yield opened
    opened.close()


def play(store: Store, session: str, group: str, outcome: float | None, steps: int, size: int = 2, seed: int = 0) -> list[str]:
    """Record an episode of `steps` steps as the server would: registered, its turns (each step's
    request carrying the previous tool result), and its result (`outcome` None: failed)."""
    episodes = store.episodes
    episodes.start(Episode(session, "toolcall", "task-1", group, size, seed))
    turn_ids = [f"{session}-t{index}" for index in range(steps)]
    for index, turn_id in enumerate(turn_ids):
        previous = turn_ids[index - 1] if index else None
        record(store, turn_id, session, [user("q")], f"a{index}", continues_turn_id=previous, next_state=TOOL_RESULT, id_source="header")
    if outcome is None:
        episodes.end(session, "failed", None, [], "RuntimeError: the sandbox went away", [])
    else:
        episodes.end(session, "finished", outcome, [0.0] * (steps - 1) + [outcome], None, TOOL_RESULT)
    return turn_ids


def test_an_episode_is_recorded_and_its_final_observation_is_the_last_steps_next_state(store: Store) -> None:
    turn_ids = play(store, "e1", "g", 1.0, steps=2)
    episode = store.episodes.episode("e1")
    assert episode is not None and episode.status == "finished" and episode.reward == 1.0 and episode.step_rewards == [0.0, 1.0]
    last = store.judging.turn_context(turn_ids[-1]).next_state
    assert last is not None and last.messages == TOOL_RESULT and last.source_turn_id == EPISODE_RESULT_SOURCE
    assert store.judging.turn_context(turn_ids[0]).next_state.source_turn_id == turn_ids[1]
    assert store.turns.session("e1").done
    store.episodes.start(Episode("e2", "toolcall", "task-1", "g", 2, 1))
    record(store, "e2-t0", "e2", [user("q")], "a", id_source="header")
    with pytest.raises(StepCountError):  # one recorded step, two step rewards
        store.episodes.end("e2", "finished", 1.0, [0.0, 1.0], None, [])


def test_a_group_waits_for_all_its_episodes_and_its_turns_are_no_chat(store: Store) -> None:
    episodes, training = store.episodes, store.training
    first = play(store, "e1", "g", 1.0, steps=2)
    assert store.judging.record_judgment(judgment(first[0]))
    assert episodes.groups_to_sample(10) == []  # one of two episodes has ended
    assert training.judged_turns_without_sample(10) == []  # an episode's turn is never a chat's
    play(store, "e2", "g", 0.0, steps=2, seed=1)
    (group,) = episodes.groups_to_sample(10)
    assert group.group_id == "g" and [len(episode.steps) for episode in group.episodes] == [2, 2]
    assert group.episodes[0].steps[0].judge_score == 1 and group.episodes[0].steps[1].judge_score is None


def test_an_abandoned_episode_ends_failed_and_its_group_goes_on(store: Store) -> None:
    episodes = store.episodes
    play(store, "e1", "g", 1.0, steps=2)
    episodes.start(Episode("e2", "toolcall", "task-1", "g", 2, 1))  # its client dies after one step
    record(store, "e2-t0", "e2", [user("q")], "a", id_source="header")
    stepped = store.turns.session("e2").updated_at
    assert episodes.fail_abandoned(idle_s=60, now=stepped + 59) == 0 and episodes.groups_to_sample(10) == []
    assert episodes.fail_abandoned(idle_s=60, now=stepped + 61) == 1
    abandoned = episodes.episode("e2")
    assert abandoned is not None and abandoned.status == "failed" and "abandoned" in (abandoned.error or "")
    (group,) = episodes.groups_to_sample(10)
    assert sorted(episode.episode.status for episode in group.episodes) == ["failed", "finished"]
    episodes.start(Episode("e3", "toolcall", "task-2", "h", 1, 2))  # registered, never stepped: idle since then
    assert episodes.fail_abandoned(idle_s=60, now=episodes.episode("e3").created_at + 61) == 1
    assert episodes.fail_abandoned(idle_s=60, now=stepped + 10_000) == 0  # an ended episode stays as it ended


def test_samples_wait_for_the_judge_and_drop_failed_episodes_and_flat_steps(store: Store) -> None:
    training = store.training
    builder = EpisodeSampleBuilder(store.episodes, training, "rl", gamma=0.5, judge_coef=1.0)
    good, bad = play(store, "e1", "g", 1.0, steps=2, size=3), play(store, "e2", "g", 0.0, steps=2, size=3, seed=1)
    crashed = play(store, "e3", "g", None, steps=1, size=3, seed=2)
    assert builder.build() == 0  # every step has a next state and none is judged yet
    for turn_id, score in zip(good + bad, [1, 1, 1, -1]):
        assert store.judging.record_judgment(judgment(turn_id, score))
    assert builder.build() == 5
    samples = training.samples_for(good + bad + crashed)
    # index 0: r = 1*0.5 + 1 = 1.5 and 0*0.5 + 1 = 1.0, equal judge terms but not equal rewards
    # index 1: r = 1 + 1 = 2.0 and 0 - 1 = -1.0
    assert samples[good[0]].reward == pytest.approx(1.0, abs=1e-4) and samples[bad[0]].reward == pytest.approx(-1.0, abs=1e-4)
    assert samples[good[1]].reward == pytest.approx(1.0, abs=1e-4) and samples[bad[1]].reward == pytest.approx(-1.0, abs=1e-4)
    assert all(samples[turn_id].status == "ready" and samples[turn_id].kind == "rl" for turn_id in good + bad)
    assert samples[crashed[0]].status == "dropped" and samples[crashed[0]].drop_reason == "failed_episode"
    assert builder.build() == 0  # built once

    flat = EpisodeSampleBuilder(store.episodes, training, "rl", gamma=0.5, judge_coef=0.0)
    same = play(store, "f1", "flat", 1.0, steps=1) + play(store, "f2", "flat", 1.0, steps=1, seed=1)
    assert flat.build() == 2
    assert {sample.drop_reason for sample in training.samples_for(same).values()} == {"flat_group"}


def test_a_step_longer_than_the_trainers_context_is_dropped_not_truncated(store: Store) -> None:
    training = store.training
    fits = play(store, "e1", "g", 1.0, steps=1) + play(store, "e2", "g", 0.0, steps=1, seed=1)
    too_long = play(store, "e3", "h", 1.0, steps=1, seed=2) + play(store, "e4", "h", 0.0, steps=1, seed=3)
    length = max(len(turn.prompt_token_ids) + len(turn.response_token_ids) for turn in map(store.turns.turn, fits + too_long))
    builder = EpisodeSampleBuilder(store.episodes, training, "rl", 0.5, 0.0, max_context_tokens=length)
    assert builder.build(limit=1) == 2  # group g: its steps fit exactly
    builder.max_context_tokens = length - 1
    assert builder.build() == 2  # group h: one token over
    samples = training.samples_for(fits + too_long)
    assert [(samples[turn_id].status, samples[turn_id].drop_reason) for turn_id in fits] == [("ready", None)] * 2
    assert [(samples[turn_id].status, samples[turn_id].drop_reason) for turn_id in too_long] == [("dropped", "too_long")] * 2


def old_group_ids(store: Store, limit: int = 10) -> list[str]:
    """What `groups_to_sample` answered up to schema v12, over every episode: the poll must answer the same."""
    ended = func.sum(case((EpisodeRow.status != "running", 1), else_=0))
    query = (
        select(EpisodeRow.group_id)
        .group_by(EpisodeRow.group_id)
        .having(ended >= func.min(EpisodeRow.group_size))
        .having(func.max(case((unsampled_step(), 1), else_=0)) == 1)
        .order_by(func.min(EpisodeRow.created_at))
        .limit(limit)
    )
    with store.read() as db:
        return list(db.scalars(query))


def polled(store: Store) -> list[str]:
    """The poll's group ids, checked against the old query's."""
    group_ids = [group.group_id for group in store.episodes.groups_to_sample(10)]
    assert group_ids == old_group_ids(store)
    return group_ids


def flags(store: Store) -> dict[str, bool]:
    with store.read() as db:
        return {session: bool(sampled) for session, sampled in db.execute(select(EpisodeRow.session_id, EpisodeRow.sampled))}


def test_an_episode_is_sampled_once_every_step_has_a_sample_and_a_late_step_makes_it_wait_again(store: Store) -> None:
    builder = EpisodeSampleBuilder(store.episodes, store.training, "rl", gamma=0.5, judge_coef=0.0)
    play(store, "e1", "g", 1.0, steps=2)
    store.episodes.start(Episode("e2", "toolcall", "task-1", "g", 2, 1))
    record(store, "e2-t0", "e2", [user("q")], "a", id_source="header")
    assert polled(store) == [] and flags(store) == {"e1": False, "e2": False}  # e2 still runs
    assert builder.build() == 0
    store.episodes.end("e2", "failed", None, [], "RuntimeError", [])
    assert polled(store) == ["g"]
    assert builder.build() == 3 and polled(store) == [] and flags(store) == {"e1": True, "e2": True}
    # the failed episode's request that was under way when it ended is recorded after its samples
    record(store, "e2-t1", "e2", [user("q")], "b", continues_turn_id="e2-t0", next_state=TOOL_RESULT, id_source="header")
    assert flags(store)["e2"] is False and polled(store) == ["g"]
    (group,) = store.episodes.groups_to_sample(10)
    assert [step.has_sample for step in group.episodes[1].steps] == [True, False]
    assert builder.build() == 1 and store.training.sample("e2-t1").drop_reason == "failed_episode"
    assert polled(store) == [] and flags(store)["e2"] is True
    # registered and ended without a step: nothing of it waits (nor did it before)
    store.episodes.start(Episode("e3", "toolcall", "task-2", "h", 1, 0))
    assert polled(store) == [] and flags(store)["e3"] is False
    store.episodes.end("e3", "failed", None, [], "RuntimeError", [])
    assert polled(store) == [] and flags(store)["e3"] is True
    # a chat's samples leave the episodes as they are
    record(store, "c1", "chat", [user("q")], "a")
    store.judging.record_judgment(judgment("c1"))
    store.training.add_samples([Sample("c1", "ready", "rl", 1.0, 0)])
    assert flags(store) == {"e1": True, "e2": True, "e3": True}


def test_a_group_waiting_for_its_judge_stays_polled_until_its_steps_are_sampled(store: Store) -> None:
    builder = EpisodeSampleBuilder(store.episodes, store.training, "rl", gamma=0.5, judge_coef=1.0)
    first = play(store, "e1", "g", 1.0, steps=2) + play(store, "e2", "g", 0.0, steps=2, seed=1)
    waiting = play(store, "e3", "h", 1.0, steps=1, seed=2) + play(store, "e4", "h", 0.0, steps=1, seed=3)
    assert polled(store) == ["g", "h"]
    for turn_id in waiting:
        store.judging.record_judgment(judgment(turn_id))
    assert builder.build() == 2  # h's steps are judged; g's wait for the judge
    assert polled(store) == ["g"] and flags(store) == {"e1": False, "e2": False, "e3": True, "e4": True}
    for turn_id in first:
        store.judging.record_judgment(judgment(turn_id))
    assert builder.build() == 4 and polled(store) == [] and all(flags(store).values())
    assert set(store.training.samples_for(first + waiting)) == set(first + waiting)


def test_forgetting_and_retention_leave_the_poll_as_the_old_query_had_it(store: Store) -> None:
    builder = EpisodeSampleBuilder(store.episodes, store.training, "rl", gamma=0.5, judge_coef=0.0)
    for session, seed, owner in (("a1", 0, "alice"), ("a2", 1, "alice"), ("b1", 0, "bob")):
        store.episodes.start(Episode(session, "toolcall", "task-1", f"g-{owner}", 2 if owner == "alice" else 1, seed))
        record(store, f"{session}-t0", session, [user("q")], "a", id_source="header", user_id=owner)
        store.episodes.end(session, "finished", float(seed), [float(seed)], None, [])
    assert builder.build() == 3 and polled(store) == [] and all(flags(store).values())
    record(store, "a2-t1", "a2", [user("q")], "late", id_source="header", user_id="alice")  # alice's group waits again
    assert polled(store) == ["g-alice"]
    store.users.forget("alice", remove_account=False)
    assert polled(store) == [] and flags(store) == {"b1": True}
    old = play(store, "o1", "old", 1.0, steps=2, size=1)  # sampled, then its first step is removed by retention
    assert builder.build() == 2 and polled(store) == []
    with store.write() as db:
        db.execute(update(TurnRow).where(TurnRow.id == old[0]).values(created_at=0.0))
    assert remove_older_than(store, days=1)["samples"] == 1
    assert polled(store) == [] and flags(store)["o1"] is True
    waiting = play(store, "w1", "wait", 1.0, steps=2, size=1)  # unsampled: its first step goes, its second still waits
    with store.write() as db:
        db.execute(update(TurnRow).where(TurnRow.id == waiting[0]).values(created_at=0.0))
    remove_older_than(store, days=1)
    assert polled(store) == ["wait"]
    assert builder.build() == 1 and polled(store) == [] and flags(store)["w1"] is True


def _as_version_12(url: str) -> None:
    """The store at `url` as clawrl wrote it before episodes were marked sampled (schema v12)."""
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as db:
        for statement in ("DROP INDEX ix_episodes_waiting", "ALTER TABLE episodes DROP COLUMN sampled",
                          "UPDATE meta SET value='12' WHERE key='schema_version'"):  # fmt: skip
            db.execute(sqlalchemy.text(statement))
    engine.dispose()


def test_a_version_12_store_marks_its_sampled_episodes_in_place(store: Store) -> None:
    builder = EpisodeSampleBuilder(store.episodes, store.training, "rl", gamma=0.5, judge_coef=0.0)
    play(store, "s1", "sampled", 1.0, steps=2) + play(store, "s2", "sampled", 0.0, steps=2, seed=1)
    assert builder.build() == 4
    play(store, "w1", "waiting", 1.0, steps=1, size=1)
    store.episodes.start(Episode("r1", "toolcall", "task-1", "running", 1, 0))
    record(store, "r1-t0", "r1", [user("q")], "a", id_source="header")
    store.episodes.start(Episode("n1", "toolcall", "task-1", "never", 1, 0))
    store.episodes.end("n1", "failed", None, [], "RuntimeError", [])
    url = store.url
    store.close()
    _as_version_12(url)
    upgraded = Store(url)
    try:
        assert flags(upgraded) == {"s1": True, "s2": True, "w1": False, "r1": False, "n1": True}
        assert polled(upgraded) == ["waiting"]
        with upgraded.read() as db:
            indexes = {index["name"]: index["column_names"] for index in sqlalchemy.inspect(db.connection()).get_indexes("episodes")}
            assert indexes["ix_episodes_waiting"] == ["sampled", "group_id"]
            assert db.scalar(select(Meta.value).where(Meta.key == "schema_version")) == str(SCHEMA_VERSION) == "15"
        builder = EpisodeSampleBuilder(upgraded.episodes, upgraded.training, "rl", gamma=0.5, judge_coef=0.0)
        assert builder.build() == 1 and polled(upgraded) == [] and flags(upgraded)["w1"] is True
    finally:
        upgraded.close()


# --- the trainer --------------------------------------------------------------------------------


def test_the_trainer_makes_a_step_from_a_recorded_group(tiny_model_dir: Path, tmp_path: Path) -> None:
    store = Store.for_run_dir(tmp_path)
    chat = Conversation(store, AutoTokenizer.from_pretrained(tiny_model_dir))
    episodes = store.episodes
    for session, outcome, seed in (("e1", 1.0, 0), ("e2", 0.0, 1)):
        episodes.start(Episode(session, "toolcall", "task-1", "g", 2, seed))
        chat.turn(f"{session}-t0", session, "What is 6 * 7?", "<tool_call>python</tool_call>")
        chat.turn(f"{session}-t1", session, "42", f"\\boxed{{{42 if outcome else 41}}}", after=f"{session}-t0")
        episodes.end(session, "finished", outcome, [0.0, outcome], None, [])
    config = TrainConfig(method="rl", batch_size=4, lr=1e-2, train_poll_s=0.1, episode_gamma=0.5, step_judge_coef=0.0)
    trainer = Trainer(config, EngineConfig(model=str(tiny_model_dir), device="cpu", cpu_threads=1), store, tmp_path)
    trainer.start()
    assert trainer.run_once()  # no judge term: the samples need no judgment
    version = store.training.version(1)
    assert version is not None and version.num_samples == 4
    samples = store.training.samples_for(["e1-t0", "e1-t1", "e2-t0", "e2-t1"])
    # outcome 1 vs 0, discounted by 0.5 at the first step: each index normalises to +1 / -1
    assert [round(samples[turn].reward, 4) for turn in ("e1-t0", "e1-t1", "e2-t0", "e2-t1")] == [1.0, 1.0, -1.0, -1.0]
    assert all(sample.status == "trained" and sample.trained_version == 1 for sample in samples.values())
    trainer.close()
