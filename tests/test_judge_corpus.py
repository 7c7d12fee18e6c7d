"""The labelled corpus of replies (issue 27): its split is fixed, and the offline judge is built from the tuning part only.

The two parts are fixed; their digests are pinned here, so moving an item between them, or editing
either, fails this test. Each held-out edition, once its judge errors were read, joined the tuning
part: the first (391 items, split from the same writing as the tuning part), then 416, 420, 420,
420, 420 and 420 replies by a second to a seventh writer did. The held-out part now is the eighth
edition: 420 replies by an eighth writer who saw neither the code nor the corpus, committed sealed
before the judge was improved on the seventh's errors and measured once, after the judge was built
from the other 3,292. The held-out part may be read only by the
evaluation (`benchmarks/judge_replies.py`) and the simulated users (`clawrl.sim.users`): the lexicon
and the classifier must never see it.
"""

from __future__ import annotations

import hashlib
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import clawrl
from clawrl.judge import classifier
from clawrl.judge.classifier import forget_default_model, train_model
from clawrl.judge.corpus import CORPUS_DIR, TUNING, hint_recalled, load_part
from clawrl.judge.rule import judge_by_rules

DIGESTS = {
    "tuning.jsonl": "dd2a2b94385b099696adac06fb650d9ee8b5fbcc3d084052c9ac7a71d82f2f36",
    "held_out.jsonl": "c8b1e57617a3b958b8b8adfb47e7b784263976e1817e2cd622dffe031c22072c",
}
HELD_OUT_READERS = {Path("sim/personas.py")}  # under src/clawrl/; plus benchmarks/judge_replies.py outside it
LANGUAGES = {"en", "es", "fr", "de", "pt", "it", "nl", "zh", "ja", "ru"}


@pytest.mark.parametrize("name", sorted(DIGESTS))
def test_each_part_is_the_one_split_once(name: str) -> None:
    assert hashlib.sha256((CORPUS_DIR / name).read_bytes()).hexdigest() == DIGESTS[name]


def test_the_parts_share_no_item_and_hold_what_was_asked_for() -> None:
    tuning, held_out = load_part(TUNING), load_part("held_out")
    assert (len(tuning), len(held_out)) == (3292, 420)
    assert not {item.id for item in tuning} & {item.id for item in held_out}
    for item in (*tuning, *held_out):
        assert item.language in LANGUAGES and item.role in ("user", "tool") and item.score in (-1, 0, 1)
        assert (item.hint is None) == (item.hint_keywords is None)


def test_nothing_under_src_but_the_simulated_users_names_the_held_out_part() -> None:
    package = Path(clawrl.__file__).parent
    readers = {path.relative_to(package) for path in package.rglob("*.py") if re.search(r"held.?out\.jsonl|\"held_out\"",
                                                                                      path.read_text())}
    assert readers == HELD_OUT_READERS


def test_building_and_running_the_offline_judge_reads_the_tuning_part_only(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    original = Path.read_text

    def recording(path: Path, *args: object, **kwargs: object) -> str:
        read.append(path.name)
        return original(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", recording)
    forget_default_model()
    try:
        verdict = judge_by_rules([{"role": "user", "content": "Write a note."}], [{"role": "user", "content": "thanks!"}])
    finally:
        forget_default_model()  # the next caller builds it again, unrecorded
    assert verdict == (1, [])
    assert read == ["tuning.jsonl"]


# Training on the whole tuning part takes about ten seconds (quadratic in the replies); the tests of
# how the classifier is built and kept train on this many of them.
FEW = 400


def test_the_classifier_is_trained_deterministically() -> None:
    items = load_part(TUNING)[:FEW]
    first, second = train_model(items), train_model(items)
    assert first.vocabulary == second.vocabulary
    assert (first.score_weights == second.score_weights).all()
    assert (first.direction_weights == second.direction_weights).all()


def test_the_classifier_learns_what_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trained on replies that call one nonsense word praise and another a complaint, it reads them so."""
    monkeypatch.setattr(classifier, "LEANING_WEIGHT", 0.0)  # the words only, no lexicon
    items = [item for item in load_part(TUNING) if item.role == "user"][:40]
    taught = [replace(item, reply=word, score=score, hint=None, hint_keywords=None)
              for item in items for word, score in (("blorptastic", 1), ("zwonkish", -1))]
    model = train_model(taught)
    assert max(model.score_probabilities("blorptastic", None).items(), key=lambda pair: pair[1])[0] == 1
    assert max(model.score_probabilities("zwonkish", None).items(), key=lambda pair: pair[1])[0] == -1


@pytest.mark.parametrize(
    ("hint", "keywords", "recalled"),
    [
        ("Add that I already called twice.", (("called",), ("twice", "two times")), True),
        ("Add that I already CALLED two times.", (("called",), ("twice", "two times")), True),
        ("Add that I called.", (("called",), ("twice", "two times")), False),
        (None, (("called",),), False),
    ],
)
def test_a_hint_is_recalled_when_every_keyword_group_matches(
    hint: str | None, keywords: tuple[tuple[str, ...], ...], recalled: bool
) -> None:
    assert hint_recalled(hint, keywords) is recalled


def test_judges_in_several_threads_build_the_classifier_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The judge worker judges turns in threads: they wait for one build instead of each training its own."""
    builds: list[int] = []
    original = classifier.train_model

    def counting(items: list) -> classifier.ReplyModel:
        builds.append(1)
        return original(items[:FEW])

    monkeypatch.setattr(classifier, "train_model", counting)
    forget_default_model()
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            models = list(pool.map(lambda _: classifier.default_model(), range(4)))
    finally:
        forget_default_model()
    assert len(builds) == 1 and all(model is models[0] for model in models)


def test_the_trained_classifier_is_kept_and_loaded_again_unless_the_corpus_or_code_changed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Training takes seconds of the serving process's GIL; a cache keyed by the corpus's and the code's digests."""
    original = classifier.train_model
    monkeypatch.setattr(classifier, "train_model", lambda items: original(items[:FEW]))
    forget_default_model()
    try:
        trained = classifier.default_model(tmp_path)
        forget_default_model()

        def refuse(items: list) -> classifier.ReplyModel:
            raise AssertionError("trained again although this corpus and code were trained before")

        monkeypatch.setattr(classifier, "train_model", refuse)
        loaded = classifier.default_model(tmp_path)
    finally:
        forget_default_model()
    assert loaded.vocabulary == trained.vocabulary
    assert (loaded.score_weights == trained.score_weights).all() and (loaded.direction_weights == trained.direction_weights).all()
    assert [path.name for path in (tmp_path / "judge").iterdir()] == [f"reply-model-{classifier._model_key(load_text())}.npz"]
    assert classifier._model_key(load_text() + "\n") != classifier._model_key(load_text())


def load_text() -> str:
    return (CORPUS_DIR / f"{TUNING}.jsonl").read_text(encoding="utf-8")


def test_the_gram_matrix_equals_the_dense_product_of_the_features() -> None:
    """`_gram` adds rare features' products where their replies meet and common ones densely; a float64 reference."""
    items = [item for item in load_part(TUNING) if item.role == "user"][:300]
    rows = [classifier.reply_features(item.reply, item.request) for item in items]
    vocabulary = {name: index for index, name in enumerate(sorted({name for row in rows for name in row}))}
    dense = np.zeros((len(rows), len(vocabulary)))
    for i, row in enumerate(rows):
        for name, value in row.items():
            dense[i, vocabulary[name]] = value
    gram = classifier._gram(rows, vocabulary)
    assert np.allclose(gram, dense @ dense.T, rtol=1e-12, atol=1e-12)
    assert sum(count > classifier.COMMON_FEATURE_REPLIES for count in (dense != 0).sum(axis=0)) > 0  # both paths ran
