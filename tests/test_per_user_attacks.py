"""Attacks on the per-user lineage boundary (`--adapters per-user`, DESIGN §12, docs/serving.md "A
model of one's own"), each kept as a test. tests/test_users_attacks.py attacks whose *records* a
request reaches; this file attacks whose *weights* a request reaches and whose turns train what.

One real server (the app `clawrl serve` runs, in-process, on a real port, with the rule judge) over
a real SQLite store, answering by lineage as `--adapters per-user --method combine` does, with an
admin key and three users: alice (the victim), bob (the attacker, with a valid key of his own) and
a user called "v1" (a name that looks like a version, an adapter and a directory of versions). A
real trainer (`clawrl.train.trainer.Trainer`, the one `clawrl train` runs) trains the same run
directory, stepped here so that each test knows which versions exist.

The promise under attack: a user's judged turns train only their own lineage, and each version's
manifest (on disk and in the store) names only that user's sample ids; each request is answered by
its caller's current version (`X-Clawrl-Policy-Lineage`, `X-Clawrl-Policy-Version`), whatever the
request claims, and decoded with that version's adapter even in a batch of several users' rows; a
rollback moves one lineage; a removed user's lineage answers nobody; nothing open or reachable by
bob tells him alice's sample ids or versions' files.

Three attacks succeeded when these were written, and were fixed: more users asking at once than
`--max-loaded-adapters` got some of their answers from the base model (v0) instead of their own
version; the reward baseline (`--reward-baseline-samples`) mixed every user's scores into each
user's rewards; and `clawrl versions rollback 0 --lineage ../policy` was taken, after which a
trainer's start deleted the lineage directory of a user named like a version directory ("v7").

Held: every session, feedback, hint, header, body field, `previous_response_id`, echoed answer and
model name bob tried; a rotated key keeps its lineage; a removed user's lineage answers nobody
(their waiting samples still train their own lineage: their records stay, as `users remove` says).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.config import EngineConfig, JudgeConfig, TrainConfig
from clawrl.engines import build_engine
from clawrl.model.scoring import score_response
from clawrl.serve.runner import ServerThread
from clawrl.store import Store
from clawrl.store.users import UserError
from clawrl.train.trainer import Trainer
from clawrl.types import DEFAULT_USER, SHARED_LINEAGE
from clawrl.versions.files import MANIFEST
from tests.helpers import CORRECTION, Conversation, start_server, user, wait_for_judgment, wait_until

ADMIN_KEY = "sk-admin-lineages-" + secrets.token_hex(16)
MODEL = "m"
USERS = ("alice", "bob", "v1")
# a side turn's prompt long enough that the prefix cache keeps it (and a second asker could reuse it)
LONG_PROMPT = "Here is a long shared system prompt that every agent sends first. " * 6


@dataclass
class World:
    server: ServerThread
    store: Store
    run_dir: Path
    model_dir: Path
    keys: dict[str, str]  # alice's, bob's, v1's and the admin's
    trainer: Trainer
    taught: dict[str, list[str]] = field(default_factory=dict)  # lineage -> the turn ids it was taught
    bobs_attack_turns: list[str] = field(default_factory=list)  # turns bob's attacks made (his own)

    @property
    def base(self) -> str:
        return self.server.base_url

    @property
    def root(self) -> str:
        return self.server.base_url.removesuffix("/v1")


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def chat(w: World, key: str | None, messages: list[dict[str, Any]], headers: dict[str, str] | None = None,
         **body: Any) -> httpx.Response:  # fmt: skip
    sent = {"model": MODEL, "messages": messages, "max_tokens": 6} | body
    return httpx.post(f"{w.base}/chat/completions", json=sent, headers=bearer(key) | (headers or {}), timeout=60)


def answered(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return {"role": "assistant", "content": response.json()["choices"][0]["message"].get("content") or ""}


def session_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return urllib.parse.unquote(response.headers["x-clawrl-session"])


def owner_of_turn(store: Store, turn_id: str) -> str | None:
    turn = store.turns.turn(turn_id)
    session = store.turns.session(turn.session_id) if turn is not None else None
    return session.user_id if session is not None else None


def clawrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawrl", *args], capture_output=True, text=True, timeout=120)


def teach_in(w: World, key: str, session: str) -> list[str]:
    """A session named `session` of three main turns (a correction: -1 and a hint; thanks: +1; a 👍
    by /v1/feedback on the last): three samples. Returns its turn ids."""
    messages: list[dict[str, Any]] = []
    turn_ids = []
    for line in ["Write a short note to my team about Friday.", CORRECTION, "thanks, perfect"]:
        messages.append(user(line))
        response = chat(w, key, messages, {"X-Session-Id": session})
        messages.append(answered(response))
        turn_ids.append(response.headers["x-clawrl-turn"])
    given = httpx.post(f"{w.base}/feedback", json={"session_id": session, "score": 1}, headers=bearer(key), timeout=30)
    assert given.status_code == 200, given.text
    return turn_ids


def manifest(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / MANIFEST).read_text())


def train_until_settled(w: World, turn_ids: list[str]) -> None:
    """Wait for the judge's verdicts on `turn_ids`, then step the trainer until no lineage has a batch ready."""
    for turn_id in turn_ids:
        wait_for_judgment(w.store, turn_id)
    w.trainer.run(idle_exit_s=0.3)


def serving(w: World, lineage: str) -> int:
    return w.store.training.serving_version(lineage)


def ask(w: World, key: str, **body: Any) -> httpx.Response:
    """A side turn (never trained on) from `key`'s caller."""
    response = chat(w, key, [user("hello")], turn_type="side", **body)
    assert response.status_code == 200, response.text
    return response


def answered_by(response: httpx.Response) -> tuple[str, int]:
    return response.headers["x-clawrl-policy-lineage"], int(response.headers["x-clawrl-policy-version"])


def wait_answered_by(w: World, key: str, lineage: str, version: int) -> None:
    wait_until(lambda: answered_by(ask(w, key)) == (lineage, version), 30, f"{lineage} answered by v{version}", every=0.1)


@pytest.fixture(scope="module")
def world(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    torch.set_num_threads(1)
    run_dir = tmp_path_factory.mktemp("lineages") / "run"
    store = Store.for_run_dir(run_dir)
    keys = {name: store.users.add(name)[1] for name in USERS}
    keys["admin"] = ADMIN_KEY
    judge = JudgeConfig(judge="rule", judge_poll_s=0.05)
    engine = EngineConfig(model=str(tiny_model_dir), device="cpu", cpu_threads=1)
    # a large learning rate, so that one step makes each user's adapter visibly their own
    train = TrainConfig(method="combine", batch_size=3, lr=5e-2, adapters="per-user", train_poll_s=0.05)
    with start_server(tiny_model_dir, run_dir, judge=judge, adapters="per-user", policy_poll_s=0.1,
                      served_model_name=MODEL, api_key=ADMIN_KEY) as server:  # fmt: skip
        trainer = Trainer(train, engine, Store.for_run_dir(run_dir), run_dir)
        trainer.start()
        try:
            yield World(server, store, run_dir, tiny_model_dir, keys, trainer)
        finally:
            trainer.close()


@pytest.fixture(scope="module")
def trained(world: World) -> World:
    """Every user taught a session, bob attacking alice's all the while; then trained until settled."""
    w, alice, bob = world, world.keys["alice"], world.keys["bob"]
    # the admin names a session under alice's prefix first: alice's "inbox" becomes "alice/~inbox"
    w.taught[DEFAULT_USER] = teach_in(w, w.keys["admin"], "alice/inbox")
    w.taught["alice"] = teach_in(w, alice, "inbox")
    w.taught["v1"] = teach_in(w, w.keys["v1"], "inbox")
    alice_sid = w.store.turns.turn(w.taught["alice"][0]).session_id
    assert alice_sid == "alice/~inbox" and w.store.turns.session(alice_sid).user_id == "alice"

    # alice opens a second conversation; its first turn waits for her next message (its next state)
    question = user("Draft the agenda for Monday's meeting.")
    first = chat(w, alice, [question])
    open_sid, open_turn = session_of(first), first.headers["x-clawrl-turn"]
    echo = [question, answered(first), user(CORRECTION)]  # what alice would send next, sent by bob

    attacks: list[httpx.Response] = []
    for headers, body in [
        ({}, {}),  # session inference from the echoed answer
        ({"X-Session-Id": open_sid}, {}),
        ({"X-Session-Id": alice_sid}, {}),
        ({"X-Session-Id": "../alice/~inbox"}, {}),
        ({"X-Session-Id": "~inbox"}, {}),
        ({}, {"session_id": open_sid}),
        ({}, {"user": "alice"}),
        ({"X-Clawrl-Session": open_sid, "X-Clawrl-Policy-Lineage": "alice", "X-Clawrl-Lineage": "alice",
          "X-Clawrl-User": "alice", "X-Clawrl-Adapter": "v1", "X-Clawrl-Policy-Version": "1"}, {}),  # fmt: skip
        ({}, {"user_id": "alice", "lineage": "alice", "adapter": "alice", "metadata": {"user_id": "alice"}}),
    ]:
        response = chat(w, bob, echo, headers, **body)
        assert response.status_code == 200 and w.store.turns.session(session_of(response)).user_id == "bob", (headers, body)
        attacks.append(response)
    # the other wire APIs, echoing alice's conversation and naming her turn
    responses = httpx.post(f"{w.base}/responses", json={"model": MODEL, "input": echo, "max_output_tokens": 4, "user": "alice"},
                           headers=bearer(bob), timeout=60)  # fmt: skip
    messages = httpx.post(f"{w.base}/messages", json={"model": MODEL, "max_tokens": 4, "messages": echo, "metadata": {"user_id": "alice"}},
                          headers={"x-api-key": bob, "X-Session-Id": open_sid}, timeout=60)  # fmt: skip
    for response in (responses, messages):
        assert response.status_code == 200 and w.store.turns.session(session_of(response)).user_id == "bob", response.text
        attacks.append(response)
    for turn_id in (open_turn, *w.taught["alice"]):
        continued = httpx.post(f"{w.base}/responses", json={"model": MODEL, "input": CORRECTION, "previous_response_id": turn_id,
                                                           "max_output_tokens": 4}, headers=bearer(bob), timeout=60)  # fmt: skip
        assert continued.status_code == 404, continued.text
        # her turn is a 404; her sessions' ids and names are his own sessions of those names (bob/s_...,
        # which his attacks above made, or none: a 404), never hers
        for sent in ({"turn": turn_id}, {"session_id": open_sid}, {"session_id": alice_sid}, {"session_id": "inbox"},
                     {"session_id": "~inbox"}, {"turn": turn_id, "session_id": open_sid}):  # fmt: skip
            rated = httpx.post(f"{w.base}/feedback", json={"score": -1, **sent}, headers=bearer(bob), timeout=30)
            assert rated.status_code in (200, 404) and (sent.keys() != {"turn"} or rated.status_code == 404), (sent, rated.text)
            if rated.status_code == 200:
                assert owner_of_turn(w.store, rated.json()["turn"]) == "bob", (sent, rated.text)
    # models that name a lineage, a version or an adapter: not this server's model
    for model in ("alice", "v1", "v12", f"{MODEL}:alice", f"{MODEL}@v1", f"alice/{MODEL}", "default", "shared", "__base__",
                  "../alice", f"{MODEL}/v1"):  # fmt: skip
        refused = chat(w, bob, echo, model=model)
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found", (model, refused.text)
    w.bobs_attack_turns = [response.headers["x-clawrl-turn"] for response in attacks]
    assert open_turn not in w.store.turns.next_states([open_turn])  # bob's echoes continued nothing of hers

    # alice goes on herself: the open session becomes three samples of hers
    messages_so_far = echo[:2]
    open_turns = [open_turn]
    for line in [CORRECTION, "thanks, perfect"]:
        messages_so_far.append(user(line))
        response = chat(w, alice, messages_so_far)
        assert session_of(response) == open_sid, response.text
        messages_so_far.append(answered(response))
        open_turns.append(response.headers["x-clawrl-turn"])
    assert httpx.post(f"{w.base}/feedback", json={"session_id": open_sid, "score": 1}, headers=bearer(alice), timeout=30).status_code == 200
    w.taught["alice"] += open_turns
    w.taught["bob"] = teach_in(w, bob, "alice/inbox")  # stored as bob/alice/inbox: his
    train_until_settled(w, [turn for turns in w.taught.values() for turn in turns])
    return w


# --------------------------------------------------------------------------- what trains what


def test_each_lineage_trains_on_its_users_turns_alone_whatever_bob_sent(trained: World) -> None:
    w, training = trained, trained.store.training
    assert training.versions(SHARED_LINEAGE) == [] and serving(w, SHARED_LINEAGE) == 0  # nobody trains the shared lineage
    seen: set[str] = set()
    for lineage in (*USERS, DEFAULT_USER):
        versions = training.versions(lineage)
        assert versions and serving(w, lineage) == versions[-1].version, lineage
        for version in versions:
            path = Path(version.path)
            assert path == (w.run_dir / "policy" / lineage / f"v{version.version}").resolve(), version.path
            written = manifest(path)
            assert (written["lineage"], written["version"]) == (lineage, version.version)
            ids = written["sample_ids"]
            assert {owner_of_turn(w.store, turn_id) for turn_id in ids} == {lineage}, (lineage, ids)
            assert all(training.sample(turn_id).trained_version == version.version for turn_id in ids)
            seen |= set(ids)
    # alice's lineage holds exactly her six samples: nothing of bob's, the admin's or v1's
    alice_ids = [turn_id for version in training.versions("alice") for turn_id in manifest(version.path)["sample_ids"]]
    assert sorted(alice_ids) == sorted(w.taught["alice"])
    bobs_ids = {turn_id for version in training.versions("bob") for turn_id in manifest(version.path)["sample_ids"]}
    assert not set(w.bobs_attack_turns) & (seen - bobs_ids)  # his attacks trained nobody's lineage but his
    # her turns' next states are her own requests', and bob's -1s never reached them
    for turn_id, state in w.store.turns.next_states(w.taught["alice"]).items():
        assert owner_of_turn(w.store, state.source_turn_id) == "alice", (turn_id, state.source_turn_id)
    for turn_id in w.taught["alice"]:
        assert [item.score for item in w.store.judging.turn_context(turn_id).feedback] in ([], [1]), turn_id
    # the trainer started each lineage from the base: no version's parent is another lineage's
    for version in training.versions():
        assert version.parent == 0 or training.version(version.parent).lineage == version.lineage, version


# --------------------------------------------------------------------------- who is answered by what


def test_each_caller_is_answered_by_their_own_version_whatever_the_request_claims(trained: World) -> None:
    w, bob = trained, trained.keys["bob"]
    current = {lineage: serving(w, lineage) for lineage in (*USERS, DEFAULT_USER)}
    assert len(set(current.values())) == len(current) and 0 not in current.values()  # unique numbers, none at the base
    for name in USERS:
        wait_answered_by(w, w.keys[name], name, current[name])
    wait_answered_by(w, w.keys["admin"], DEFAULT_USER, current[DEFAULT_USER])
    alice_turn = w.taught["alice"][-1]
    alice_sid = w.store.turns.turn(alice_turn).session_id
    claims = [
        {"X-Clawrl-Policy-Lineage": "alice", "X-Clawrl-Policy-Version": str(current["alice"])},
        {"X-Clawrl-Lineage": "alice", "X-Clawrl-Adapter": f"v{current['alice']}", "X-Clawrl-User": "alice"},
        {"X-Clawrl-Session": alice_sid, "X-Session-Id": alice_sid},
        {"X-Session-Id": "../alice"}, {"X-Session-Id": "v1/inbox"}, {"X-Session-Id": "default"},
    ]  # fmt: skip
    bodies = [{}, {"user": "alice"}, {"session_id": alice_sid}, {"user": "v1"}, {"lineage": "alice", "adapter": "v1"}]
    for headers in claims:
        for body in bodies:
            for stream in (False, True):
                response = chat(w, bob, [user("who answers me?")], headers, stream=stream, turn_type="side", **body)
                assert response.status_code == 200, response.text
                assert answered_by(response) == ("bob", current["bob"]), (headers, body, stream)
                assert w.store.turns.turn(response.headers["x-clawrl-turn"]).policy_version == current["bob"]
    wire = [
        ("/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 4, "user": "alice"}),
        ("/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 4, "stream": True}),
        ("/messages", {"model": MODEL, "max_tokens": 4, "messages": [user("hi")], "metadata": {"user_id": "alice"}}),
        ("/messages", {"model": MODEL, "max_tokens": 4, "messages": [user("hi")], "stream": True}),
    ]
    for path, body in wire:
        for headers in ({"Authorization": f"Bearer {bob}"}, {"x-api-key": bob}):
            response = httpx.post(w.base + path, json=body, headers=headers | claims[0] | {"X-Turn-Type": "side"}, timeout=60)
            assert response.status_code == 200 and answered_by(response) == ("bob", current["bob"]), (path, response.text)
    # the admin is the default user's lineage, whoever's session it names
    admin = chat(w, w.keys["admin"], [user("hi")], {"X-Session-Id": alice_sid}, turn_type="side", user="alice")
    assert answered_by(admin) == (DEFAULT_USER, current[DEFAULT_USER])


def _offline_model(model_dir: Path, version_path: str | None) -> Any:
    """A version as its files alone make it, loaded here (None: the base model)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return (PeftModel.from_pretrained(model, version_path) if version_path is not None else model).eval()


def test_rows_of_several_users_in_one_batch_decode_with_their_own_adapters(trained: World) -> None:
    """Four callers (three lineages and the admin's) ask the same long prompt at once, several times
    (so their rows share decode batches and the prefix cache holds the prompt under someone else's
    version): every answer's log-probs are those of the caller's own version, computed offline."""
    w = trained
    callers = {name: w.keys[name] for name in USERS} | {DEFAULT_USER: w.keys["admin"]}
    paths = {lineage: w.store.training.version(serving(w, lineage)).path for lineage in callers}
    for lineage, key in callers.items():
        wait_answered_by(w, key, lineage, serving(w, lineage))

    def one(lineage: str) -> tuple[str, str, list[float], int]:
        response = chat(w, callers[lineage], [{"role": "system", "content": LONG_PROMPT}, user("And now?")], turn_type="side",
                        temperature=0, max_tokens=8, logprobs=True)  # fmt: skip
        assert response.status_code == 200, response.text
        logprobs = [entry["logprob"] for entry in response.json()["choices"][0]["logprobs"]["content"]]
        return lineage, response.headers["x-clawrl-turn"], logprobs, int(response.headers["x-clawrl-policy-version"])

    results = []
    with ThreadPoolExecutor(len(callers)) as pool:
        for _ in range(3):
            results += list(pool.map(one, list(callers)))
    for lineage in ("bob", "alice"):  # one after another too: bob's prompt is cached under alice's version by now
        results.append(one(lineage))
    models = {lineage: _offline_model(w.model_dir, paths[lineage]) for lineage in callers}
    gaps: list[float] = []
    for lineage, turn_id, logprobs, version in results:
        assert version == serving(w, lineage), (lineage, version)
        turn = w.store.turns.turn(turn_id)
        assert turn.policy_version == version and len(turn.response_token_ids) == len(logprobs)
        scored = {other: torch.tensor(score_response(model, turn.prompt_token_ids, turn.response_token_ids, 0).logprobs)
                  for other, model in models.items()}  # fmt: skip
        torch.testing.assert_close(torch.tensor(logprobs), scored[lineage], rtol=0, atol=1e-4,
                                   msg=lambda text, lineage=lineage: f"{lineage}'s answer: {text}")  # fmt: skip
        # and the test can tell the lineages apart: another's adapter gives these tokens other log-probs
        for other, expected in scored.items():
            if other != lineage:
                gap = (expected - torch.tensor(logprobs)).abs().max().item()
                gaps.append(gap)
                assert gap > 1e-3, (lineage, other, gap)
    print(f"smallest gap between two lineages' log-probs of one answer: {min(gaps):.4f}")


def _answers_under_eviction(w: World, rounds: int) -> list[tuple[str, str, int]]:
    """A second server on the run, keeping one idle adapter loaded (`--max-loaded-adapters 1`): the
    four callers ask at once, `rounds` times, so that every load evicts another's adapter. Returns
    (lineage, the lineage it answered with, the version) of the answers that were not the caller's
    current version, as soon as there is one."""
    callers = {name: w.keys[name] for name in USERS} | {DEFAULT_USER: w.keys["admin"]}
    current = {lineage: serving(w, lineage) for lineage in callers}
    engine = build_engine(EngineConfig(model=str(w.model_dir), device="cpu", cpu_threads=1, max_loaded_adapters=1))
    wrong = []
    with start_server(w.model_dir, w.run_dir, engine=engine, adapters="per-user", policy_poll_s=0.1, served_model_name=MODEL,
                      api_key=ADMIN_KEY) as second, ThreadPoolExecutor(len(callers)) as pool:  # fmt: skip
        def one(lineage: str) -> tuple[str, str, int]:
            body = {"model": MODEL, "messages": [user("hello")], "max_tokens": 2, "turn_type": "side"}
            response = httpx.post(f"{second.base_url}/chat/completions", json=body, headers=bearer(callers[lineage]), timeout=60)
            assert response.status_code == 200, response.text
            return (lineage, *answered_by(response))

        for _ in range(rounds):
            wrong += [answer for answer in pool.map(one, list(callers)) if answer[1:] != (answer[0], current[answer[0]])]
            if wrong:
                break  # the first wrong answer is enough
        # no version failed its check or its load: v0 was not the fallback for a broken version
        failures = [line for line in httpx.get(second.base_url.removesuffix("/v1") + "/metrics", timeout=30).text.splitlines()
                    if line.startswith("clawrl_policy_swap_failures_total")]  # fmt: skip
        assert failures == ["clawrl_policy_swap_failures_total 0.0"], failures
    return wrong


# Found by this attack: PolicyFollower.ready() took an adapter evicted by other users' loads, right
# after its own load, for a load that failed, and had the base model (v0) answer in its place.
def test_a_user_is_answered_by_their_own_version_while_others_evict_adapters(trained: World) -> None:
    assert _answers_under_eviction(trained, rounds=30) == []


# --------------------------------------------------------------------------- rollback


def test_a_rollback_of_one_lineage_moves_it_alone_and_names_only_its_own_versions(trained: World) -> None:
    w, training, run = trained, trained.store.training, str(trained.run_dir)
    before = {lineage: serving(w, lineage) for lineage in (*USERS, DEFAULT_USER)}
    alice_versions = [version.version for version in training.versions("alice")]
    # another lineage's version, a shared-lineage or unknown name, a path: refused, nothing moves
    for version, lineage in ((before["bob"], "alice"), (alice_versions[0], "bob"), (before["alice"], SHARED_LINEAGE),
                             (before["alice"], "../alice"), (before["alice"], "ALICE"), (before["v1"], "alice")):  # fmt: skip
        refused = clawrl("versions", "rollback", str(version), "--lineage", lineage, "--run-dir", run)
        assert refused.returncode == 1 and "no policy version" in refused.stderr, (version, lineage, refused.stderr)
    assert {lineage: serving(w, lineage) for lineage in before} == before
    # alice back to her first version, then to the base: only she moves, and the server follows at once
    moved = clawrl("versions", "rollback", f"v{alice_versions[0]}", "--lineage", "alice", "--run-dir", run)
    assert moved.returncode == 0, moved.stderr
    wait_answered_by(w, w.keys["alice"], "alice", alice_versions[0])
    assert clawrl("versions", "rollback", "0", "--lineage", "alice", "--run-dir", run).returncode == 0
    wait_answered_by(w, w.keys["alice"], "alice", 0)
    for lineage in ("bob", "v1"):
        assert answered_by(ask(w, w.keys[lineage])) == (lineage, before[lineage])
    assert answered_by(ask(w, w.keys["admin"])) == (DEFAULT_USER, before[DEFAULT_USER])
    listed = json.loads(clawrl("versions", "list", "--lineage", "alice", "--run-dir", run, "--json").stdout)
    assert [item["version"] for item in listed] == alice_versions and not any(item["serving"] for item in listed)
    assert {item["lineage"] for item in listed} == {"alice"}
    # her next step starts from the base; bob's turns taught meanwhile train bob from where he was
    again = teach_in(w, w.keys["alice"], "after-rollback")
    bobs = teach_in(w, w.keys["bob"], "after-rollback")
    train_until_settled(w, again + bobs)
    newest_alice = training.versions("alice")[-1]
    assert (newest_alice.parent, newest_alice.step) == (0, 1) and sorted(manifest(newest_alice.path)["sample_ids"]) == sorted(again)
    new_bob = [version for version in training.versions("bob") if version.version > before["bob"]]
    assert new_bob and new_bob[0].parent == before["bob"]  # bob goes on from his own version
    bob_trained = [turn_id for version in new_bob for turn_id in manifest(version.path)["sample_ids"]]
    assert {owner_of_turn(w.store, turn_id) for turn_id in bob_trained} == {"bob"} and set(bobs) <= set(bob_trained) | {
        turn_id for turn_id in bobs if training.sample(turn_id).status == "ready"}
    newest_bob = new_bob[-1]
    assert serving(w, "v1") == before["v1"] and serving(w, DEFAULT_USER) == before[DEFAULT_USER]
    wait_answered_by(w, w.keys["alice"], "alice", newest_alice.version)
    wait_answered_by(w, w.keys["bob"], "bob", newest_bob.version)


# --------------------------------------------------------------------------- keys rotated and users removed


def test_a_rotated_key_keeps_its_lineage_and_a_removed_users_lineage_answers_nobody(trained: World) -> None:
    w, store = trained, trained.store
    bob_version = serving(w, "bob")
    old = w.keys["bob"]
    w.keys["bob"] = new = store.users.rotate_key("bob")
    wait_until(lambda: chat(w, old, [user("x")]).status_code == 401, 3, "bob's old key refused", every=0.1)
    assert answered_by(ask(w, new)) == ("bob", bob_version)

    # v1 talks (judged turns waiting to train), then is removed
    v1_version = serving(w, "v1")
    pending = teach_in(w, w.keys["v1"], "last-words")
    for turn_id in pending:
        wait_for_judgment(store, turn_id)
    store.users.remove("v1")
    gone = w.keys["v1"]
    wait_until(lambda: chat(w, gone, [user("x")]).status_code == 401, 3, "v1's key refused", every=0.1)
    time.sleep(1.1)
    for path, body in (("/chat/completions", {"model": MODEL, "messages": [user("x")], "max_tokens": 2}),
                       ("/responses", {"model": MODEL, "input": "x", "max_output_tokens": 2}),
                       ("/messages", {"model": MODEL, "max_tokens": 2, "messages": [user("x")]})):  # fmt: skip
        for headers in (bearer(gone), {"x-api-key": gone}):
            refused = httpx.post(w.base + path, json=body, headers=headers, timeout=30)
            assert refused.status_code == 401 and "x-clawrl-policy-version" not in refused.headers, (path, refused.text)
    with pytest.raises(UserError):  # their name is not given again while their records remain
        store.users.add("v1")
    # nobody else reaches v1's lineage by naming it
    for headers, body in (({"X-Session-Id": "v1/inbox"}, {}), ({}, {"user": "v1"}), ({"X-Clawrl-Policy-Lineage": "v1"}, {}),
                          ({}, {"session_id": "v1/last-words"})):  # fmt: skip
        bobs = chat(w, new, [user("x")], headers, turn_type="side", **body)
        assert answered_by(bobs) == ("bob", bob_version), (headers, body)
        admin = chat(w, w.keys["admin"], [user("x")], headers, turn_type="side", **body)
        assert answered_by(admin) == (DEFAULT_USER, serving(w, DEFAULT_USER)), (headers, body)
    # whatever the trainer does with their waiting samples, it trains no other lineage on them
    w.trainer.run(idle_exit_s=0.3)
    for lineage in ("alice", "bob", DEFAULT_USER):
        for version in store.training.versions(lineage):
            assert not set(manifest(version.path)["sample_ids"]) & set(pending), lineage
    for version in store.training.versions("v1"):
        assert {owner_of_turn(store, turn_id) for turn_id in manifest(version.path)["sample_ids"]} == {"v1"}
    after = serving(w, "v1")
    print(f"removed user v1: serving pointer v{v1_version} -> v{after} after their waiting samples were trained")


def test_no_user_name_can_be_or_reach_another_lineage_or_its_directory(trained: World) -> None:
    """Names that would be another lineage (the shared one, the default user's, PEFT's base row),
    reach outside their policy directory, or look like alice to a person are refused; a name that
    looks like a version is a lineage of its own (v1 above)."""
    store = trained.store
    before = [item.id for item in store.users.list()]
    for name in (SHARED_LINEAGE, DEFAULT_USER, "__base__", "../alice", "alice/..", "..", ".", "alice/", "/alice", "alice\\x",
                 "Alice", "\uff41lice", "\u0430lice", "al\u0131ce", "alice\u200b", "alice\n", " alice", "alice ", ".tmp-v1",
                 "-alice", "alice", "bob", "v1", "", "a" * 33):  # fmt: skip
        with pytest.raises(UserError):
            store.users.add(name)
    assert [item.id for item in store.users.list()] == before
    assert sorted(path.name for path in (trained.run_dir / "policy").iterdir()) == sorted({*USERS, DEFAULT_USER})


# --------------------------------------------------------------------------- what bob can read


def test_nothing_bob_or_a_keyless_caller_reads_names_alices_versions_files_or_samples(trained: World) -> None:
    w, bob = trained, trained.keys["bob"]
    alice_versions = w.store.training.versions("alice")
    alice_sessions = {w.store.turns.turn(turn_id).session_id for turn_id in w.taught["alice"]}
    forbidden = [*w.taught["alice"], *alice_sessions, *(Path(version.path).as_posix() for version in alice_versions),
                 "policy/alice", "alice", w.keys["alice"], str(w.run_dir)]  # fmt: skip
    shown = [httpx.get(w.root + path, timeout=30) for path in ("/healthz", "/readyz", "/metrics", "/openapi.json")]
    for headers in (bearer(bob), {"x-api-key": bob}):
        models = httpx.get(w.base + "/models", headers=headers, timeout=30)
        assert [model["id"] for model in models.json()["data"]] == [MODEL]  # no adapter, lineage or version is listed
        shown.append(models)
    for response in shown:
        for text in forbidden:
            assert text not in response.text and text not in str(response.headers), (str(response.url), text)
    # the dashboard (the admin's, or bob's own pages where it has them): nothing of alice's. Bob's own
    # session names may contain her session names ("bob/alice/~inbox"), so only ids, paths and keys count here
    dashboard = [f"/dashboard/sessions/{urllib.parse.quote(session_id, safe='')}" for session_id in sorted(alice_sessions)]
    for path in ("/dashboard", "/dashboard/api/overview", *dashboard):
        for headers in (bearer(bob), {"x-api-key": bob}, {}):
            read = httpx.get(w.root + path, headers=headers, timeout=30)
            assert read.status_code in (200, 401, 403, 404), (path, read.status_code)
            for text in (*w.taught["alice"], *(Path(version.path).as_posix() for version in alice_versions), "policy/alice",
                         str(w.run_dir), w.keys["alice"]):  # fmt: skip
                assert text not in read.text and text not in str(read.headers), (path, text)
    # alice's sessions by any spelling: the answer for a session nobody has, or bob's own session of
    # that name (he named sessions after hers above: bob/s_..., bob/~inbox), never hers
    for session_id in alice_sessions:
        for spelled in (session_id, urllib.parse.quote(session_id, safe=""), session_id.removeprefix("alice/")):
            read = httpx.get(f"{w.base}/sessions/{spelled}", headers=bearer(bob), timeout=30)
            if read.status_code == 200:
                page = read.json()
                assert page["user"] == "bob" and page["id"].startswith("bob/"), (spelled, page["id"])
                assert {turn["id"] for turn in page["turns"]}.isdisjoint(w.taught["alice"])
                continue
            missing = httpx.get(f"{w.base}/sessions/{spelled}-none", headers=bearer(bob), timeout=30)
            assert read.status_code == missing.status_code == 404, (spelled, read.text)
            assert read.text.replace(spelled, "ID") == missing.text.replace(spelled + "-none", "ID")
    # bob's own sessions: his alone (some are named after hers), and their pages name his versions only
    bobs_versions = {version.version for version in w.store.training.versions("bob")}
    listed = httpx.get(w.base + "/sessions?limit=1000", headers=bearer(bob), timeout=30).json()["data"]
    assert listed and all(w.store.turns.session(item["id"]).user_id == "bob" for item in listed)
    for item in listed:
        page = httpx.get(f"{w.base}/sessions/{urllib.parse.quote(item['id'], safe='')}", headers=bearer(bob), timeout=30).json()
        assert {turn["id"] for turn in page["turns"]}.isdisjoint(w.taught["alice"])
        trained_versions = {turn["sample"]["trained_version"] for turn in page["turns"] if turn.get("sample")} - {None}
        assert trained_versions <= bobs_versions, item["id"]
        assert {turn["policy_version"] for turn in page["turns"]} <= bobs_versions | {0}, item["id"]


# --------------------------------------------------------------------------- found


# Found by this attack: the reward baseline's window held every user's scores, so bob's verdicts
# moved alice's rewards (and bob could read the others' mean in his own samples' rewards).
def test_another_users_scores_never_change_a_users_rewards_under_a_reward_baseline(tiny_model_dir: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    run_dir = tmp_path / "run"
    store = Store.for_run_dir(run_dir)
    talk = Conversation(store, AutoTokenizer.from_pretrained(tiny_model_dir))

    def session(name: str, scores: tuple[int, int]) -> list[str]:
        ids = [f"{name}-{index}" for index in range(3)]
        talk.turn(ids[0], f"{name}/s", "Write a short note to my team about Friday.", "Team, Friday is off.", user_id=name)
        talk.turn(ids[1], f"{name}/s", "and again", "Team, Friday is off!", after=ids[0], user_id=name)
        talk.turn(ids[2], f"{name}/s", "thanks", "You are welcome.", after=ids[1], done=True, user_id=name)
        talk.judge(ids[0], scores[0])
        talk.judge(ids[1], scores[1])
        return ids[:2]

    session("bob", (-1, -1))  # bob complains first
    alice = session("alice", (1, 1))
    engine = EngineConfig(model=str(tiny_model_dir), device="cpu", cpu_threads=1)
    train = TrainConfig(method="rl", batch_size=2, lr=1e-2, adapters="per-user", reward_baseline_samples=8)
    trainer = Trainer(train, engine, store, run_dir)
    trainer.start()
    trainer.builder.build()
    # alice alone: no baseline for her first score, then her own mean (1): rewards 1 and 0
    assert [store.training.sample(turn_id).reward for turn_id in alice] == [1.0, 0.0]


# Found by this attack: `clawrl versions rollback 0 --lineage ../policy` was accepted, and the next
# trainer start discarded "unregistered versions" of RUN_DIR/policy/../policy, i.e. every user's.
def test_a_lineage_named_with_a_path_never_reaches_outside_its_own_directory(tiny_model_dir: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    run_dir = tmp_path / "run"
    store = Store.for_run_dir(run_dir)
    store.users.add("v7")
    talk = Conversation(store, AutoTokenizer.from_pretrained(tiny_model_dir))
    ids = [f"v7-{index}" for index in range(3)]
    talk.turn(ids[0], "v7/s", "Write a short note to my team about Friday.", "Team, Friday is off.", user_id="v7")
    talk.turn(ids[1], "v7/s", "and again", "Team, Friday is off!", after=ids[0], user_id="v7")
    talk.turn(ids[2], "v7/s", "thanks", "You are welcome.", after=ids[1], done=True, user_id="v7")
    talk.judge(ids[0], -1)
    talk.judge(ids[1], 1)
    engine = EngineConfig(model=str(tiny_model_dir), device="cpu", cpu_threads=1)
    trainer = Trainer(TrainConfig(method="rl", batch_size=2, lr=1e-2, adapters="per-user"), engine, store, run_dir)
    trainer.start()
    assert trainer.run(max_steps=1) == 1
    (version,) = store.training.versions("v7")
    assert Path(version.path).is_dir()
    rolled = clawrl("versions", "rollback", "0", "--lineage", "../policy", "--run-dir", str(run_dir))
    assert rolled.returncode == 1 and "no lineage '../policy'" in rolled.stderr, rolled.stderr
    assert clawrl("versions", "rollback", "0", "--lineage", "v7", "--run-dir", str(run_dir)).returncode == 0  # a user's: yes
    assert clawrl("versions", "rollback", f"v{version.version}", "--lineage", "v7", "--run-dir", str(run_dir)).returncode == 0
    restarted = Trainer(TrainConfig(method="rl", batch_size=2, lr=1e-2, adapters="per-user"), engine, Store.for_run_dir(run_dir), run_dir)
    restarted.start()  # what `clawrl train` does first after a restart
    assert Path(version.path).is_dir(), (rolled.returncode, rolled.stdout, rolled.stderr)
    restarted.run(max_steps=0)
    assert store.training.serving_version("v7") == version.version
