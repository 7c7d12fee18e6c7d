"""The offline judge's classifier: a reply's score and whether it says how the answer should be.

A logistic regression over sparse features of the reply (what the user typed): its character
n-grams and words (folded, `lexicon.fold`), the counts of the lexicon's cues, where in the reply
those cues stand (first or after a "but"), and how much of the request it repeats. Two heads
share the features: the score (-1, 0, +1; softmax) and the direction (does the reply say how the
answer should have been; sigmoid), which decides whether the judge offers a hint.

It is trained on the tuning part of the labelled corpus and nothing else (`default_model`), by
full-batch gradient descent from zeros: deterministic, no weights file to ship or to drift from the
corpus. Training takes about ten seconds of one CPU core at 3,292 replies (the replies' gram
matrix grows with their square), so the weights are kept in a cache directory under a key made of the
corpus's and this code's digests: any change to either trains anew, and every other process loads
them in milliseconds. Tool outputs are not its business: the rules read those (`rule.py`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from clawrl.judge import lexicon
from clawrl.judge.corpus import TUNING, LabelledReply, corpus_path, parse_part
from clawrl.judge.lexicon import cue_counts, cue_spans, fold

log = logging.getLogger(__name__)

SCORES = (-1, 0, 1)
CHAR_NGRAMS = (2, 3, 4)
CUE_WEIGHT = 3.0  # cue counts weigh more than any one n-gram: they carry over to unseen phrasings
L2 = 0.005  # weight decay: chosen by leaving each writer of the tuning part out in turn (0.003 before the fourth joined)
STEPS = 1000
COMMON_FEATURE_REPLIES = 64  # features in more replies than this go through a dense product (`_gram`)
LEARNING_RATE = 2.0

LEANING_WEIGHT = 1.0  # logit per log-count of a cue, before the classifier's own weights
APPROVAL_AFTER_CONTRAST = 2.0  # in leanings: approval after a "but" outweighs one reservation before it
# in leanings: thanks and then a request with no "but" or "now" asks for more in the same answer
# (141 of the 172 such tuning replies up to the sixth writer are labelled -1); it outweighs the
# thanks and the praise before it
REQUEST_AFTER_APPROVAL = 2.0
SCORE_LEANINGS = {
    "thanks": 1, "praise": 1, "works": 1, "done": 1, "positive_emoji": 1, "negated_complaint": 1, "move_on": 1,
    "complaint": -1, "too": -1, "sarcasm": -1, "negative_emoji": -1, "emphasis": -1, "request_frame": -1,
    "imperative": -1, "this_not_that": -1, "actually": -1, "challenge": -1,
    "hesitation": 0, "self_question": 0, "new_request": 0,
}
DIRECTION_CUES = ("request_frame", "imperative", "too", "emphasis", "this_not_that", "actually", "sarcasm", "challenge")
_SHADOWED_BY = (("complaint", "negated_complaint"), ("too", "negated_complaint"), ("request_frame", "negated_complaint"),
                ("imperative", "negated_complaint"), ("praise", "sarcasm"),
                ("thanks", "sarcasm"), ("thanks", "complaint"))
_CHANGE_CUES = ("request_frame", "imperative", "complaint", "comparative", "too", "challenge")
_SIGNAL_CUES = (*_CHANGE_CUES, "thanks", "praise", "works", "done", "emphasis", "sarcasm", "negated_complaint",
                "positive_emoji", "negative_emoji", "move_on", "this_not_that", "actually")
_WORD = re.compile(r"[^\W\d_]+|\d+|[\u3040-\u30ff\u3400-\u9fff]", re.UNICODE)
_CJK_CHAR = re.compile(r"[\u3040-\u30ff\u3400-\u9fff]")  # a CJK "word" is one character: no count of words to go by


@dataclass(frozen=True)
class ReplyModel:
    """The two heads' weights over a fixed feature vocabulary (features unseen in training count for nothing)."""

    vocabulary: dict[str, int]
    score_weights: np.ndarray  # (features, 3): columns in SCORES order
    direction_weights: np.ndarray  # (features,)

    def score_probabilities(self, reply: str, request: str | None) -> dict[int, float]:
        logits = self._row(reply, request) @ self.score_weights + score_leaning(reply)
        return {score: float(p) for score, p in zip(SCORES, _softmax(logits)[0], strict=True)}

    def direction_probability(self, reply: str, request: str | None) -> float:
        return float(_sigmoid(self._row(reply, request) @ self.direction_weights + direction_leaning(reply)))

    def _row(self, reply: str, request: str | None) -> np.ndarray:
        row = np.zeros(len(self.vocabulary))
        for name, value in reply_features(reply, request).items():
            index = self.vocabulary.get(name)
            if index is not None:
                row[index] = value
        return row


def score_leaning(reply: str) -> np.ndarray:
    """The lexicon's own reading, as logits the classifier starts from (-1, 0, +1 in SCORES order).

    Each cue leans one way (`SCORE_LEANINGS`) by LEANING_WEIGHT per log-count. A cue the tuning part
    seldom shows ("too long", "kürzer") would earn the classifier almost no weight of its own; the
    leaning keeps what the word means, and the classifier learns where it misleads ("great" in
    "oh great, now ..."). A cue inside a stronger one counts only as the stronger one: "bad" in "not
    bad", "great" in "oh great".
    """
    logits = np.zeros(len(SCORES))
    for name, count in _unshadowed_counts(reply).items():
        leaning = SCORE_LEANINGS.get(name)
        if leaning is not None and count:
            logits[SCORES.index(leaning)] += LEANING_WEIGHT * math.log1p(count)
    if _approves_after_contrast(reply):
        logits[SCORES.index(1)] += APPROVAL_AFTER_CONTRAST * LEANING_WEIGHT * math.log1p(1)
    if _is_bare_word_question(reply):
        logits[SCORES.index(-1)] += LEANING_WEIGHT * math.log1p(1)
    if _order_features(reply).get("approval_then_request"):
        logits[SCORES.index(-1)] += REQUEST_AFTER_APPROVAL * LEANING_WEIGHT * math.log1p(1)
    return logits


def _is_bare_word_question(reply: str) -> bool:
    """"Vegan?", "¿Abdominales?", "grams?": one or two words asked back, with no cue, name what the
    answer lacked (21 of the 23 in the tuning part up to the fifth writer are labelled -1)."""
    stripped = reply.strip()
    words = _WORD.findall(fold(stripped))
    counts = cue_counts(reply)
    return (stripped.endswith(("?", "？")) and 0 < len(words) <= 2 and not _CJK_CHAR.search(stripped)
            and not any(counts[name] for name in (*_SIGNAL_CUES, "question_word")))


def _approves_after_contrast(reply: str) -> bool:
    """The reply's last word is approval: "not what I had in mind, but I love it. Thanks!".

    What stands after the "but" is what the user concluded; a reservation before it ("a bit
    cheesy", "not what I pictured") was given up. Only where nothing after it asks for a change.
    """
    _, tail = _split_at_contrast(reply)
    if not tail:
        return False
    counts = _unshadowed_counts(tail)
    approves = any(counts[name] for name in ("thanks", "praise", "works", "done", "positive_emoji", "negated_complaint"))
    return approves and not any(counts[name] for name in (*_CHANGE_CUES, "sarcasm", "negative_emoji"))


def direction_leaning(reply: str) -> float:
    """The lexicon's reading of whether the reply says how the answer should be, as a logit."""
    counts = _unshadowed_counts(reply)
    return LEANING_WEIGHT * sum(math.log1p(counts[name]) for name in DIRECTION_CUES)


def _unshadowed_counts(reply: str) -> dict[str, int]:
    counts = cue_counts(reply)
    for weak, strong in _SHADOWED_BY:
        strong_spans = cue_spans(reply, strong)
        counts[weak] = sum(not any(a < end and start < b for a, b in strong_spans) for start, end in cue_spans(reply, weak))
    return counts


def reply_features(reply: str, request: str | None) -> dict[str, float]:
    """Sparse features of what the user typed in reply (and of the request it answers)."""
    folded = " ".join(fold(reply).split())
    features: dict[str, float] = {"bias": 1.0}
    features.update(_ngram_features(folded))
    features.update(_cue_features(reply))
    features.update(_shape_features(reply, folded, request))
    return features


def _ngram_features(folded: str) -> dict[str, float]:
    """Character n-grams and words, each block scaled to unit length so long replies weigh as short ones."""
    padded = f" {folded} "
    grams = {f"c{n}:{padded[i:i + n]}" for n in CHAR_NGRAMS for i in range(len(padded) - n + 1)}
    words = _WORD.findall(folded)
    tokens = {f"w:{word}" for word in words} | {f"b:{a} {b}" for a, b in zip(words, words[1:])}
    features = {}
    for block in (grams, tokens):
        if block:
            weight = 1.0 / math.sqrt(len(block))
            features.update({name: weight for name in block})
    return features


def _cue_features(reply: str) -> dict[str, float]:
    """Counts of each cue (log-scaled), and the cues that open the reply or follow a "but"."""
    features = {f"cue:{name}": CUE_WEIGHT * math.log1p(count) for name, count in cue_counts(reply).items() if count}
    head, tail = _split_at_contrast(reply)
    features.update({f"first:{name}": CUE_WEIGHT for name, count in cue_counts(_first_clause(reply)).items() if count})
    if tail:
        features.update({f"head:{name}": CUE_WEIGHT for name, count in cue_counts(head).items() if count})
        features.update({f"tail:{name}": CUE_WEIGHT for name, count in cue_counts(tail).items() if count})
    return features


def _shape_features(reply: str, folded: str, request: str | None) -> dict[str, float]:
    words = _WORD.findall(folded)
    features = {f"length:{_length_bucket(len(words))}": 1.0}
    stripped = reply.strip()
    if stripped.endswith(("?", "？")):
        features["ends_with_question"] = 1.0
    elif "?" in stripped or "？" in stripped:
        features["has_question"] = 1.0
    if words == [] and stripped:
        features["symbols_only"] = 1.0  # emoji, punctuation
    if any(len(word) >= 2 and word.isupper() and word.isalpha() for word in re.findall(r"\w+", reply)):
        features["shouting"] = 1.0  # "a SHORT email": stress on what was asked for
    if stripped.startswith(">"):
        features["quotes_answer"] = 1.0
    counts = cue_counts(reply)
    asks = bool(features.get("ends_with_question") or features.get("has_question"))
    if asks and not any(counts[name] for name in _CHANGE_CUES):
        features["plain_question"] = 1.0  # asks about something, asks for no change
    if not any(counts[name] for name in _SIGNAL_CUES):
        features["no_cue_question" if asks else "no_cue_statement"] = 1.0  # "Grams?", "its 40x28 not 45x30"
        if asks and len(words) <= 2:
            features["bare_word_question"] = 1.0  # "grams?", "haiku?": the one thing the answer got wrong
    features.update(_order_features(reply))
    if request:
        overlap = _request_overlap(folded, fold(request))
        features["request_overlap"] = overlap
        if overlap >= 0.5:
            features["repeats_request"] = 1.0
    return features


def _order_features(reply: str) -> dict[str, float]:
    """Where a request stands after approval.

    Moving on before a request ("ok, now write the tests") asks for something new, not a change.
    Thanks or praise and then, with no "but" and no "now", a request ("Thanks! Could you add the
    costs?") most often asks for more in the same answer: what people label a correction.
    """
    requests = cue_spans(reply, "imperative") + cue_spans(reply, "request_frame")
    if not requests:
        return {}
    first_request = min(start for start, _ in requests)
    move_on = cue_spans(reply, "move_on")
    if move_on and move_on[0][0] <= first_request:
        return {"move_on_then_request": 1.0}
    approval = [start for name in ("thanks", "praise", "works") for start, _ in cue_spans(reply, name)]
    if approval and min(approval) < first_request and not cue_spans(reply, "contrast"):
        return {"approval_then_request": 1.0}
    return {}


def _length_bucket(words: int) -> str:
    return "0" if words == 0 else "1" if words == 1 else "2-3" if words <= 3 else "4-8" if words <= 8 else "9+"


def _request_overlap(folded_reply: str, folded_request: str) -> float:
    """Share of the reply's words (of three letters or more) that the request also has."""
    reply_words = {word for word in _WORD.findall(folded_reply) if len(word) >= 3}
    if not reply_words:
        return 0.0
    request_words = set(_WORD.findall(folded_request))
    return len(reply_words & request_words) / len(reply_words)


def _first_clause(reply: str) -> str:
    return re.split(r"[.!?;,:\n。！？，、]", reply.strip(), maxsplit=1)[0]


def _split_at_contrast(reply: str) -> tuple[str, str]:
    """The reply before and after its first "but" (in any of the languages); no "but": (reply, "")."""
    spans = cue_spans(reply, "contrast")
    if not spans:
        return reply, ""
    start, end = spans[0]
    return reply[:start], reply[end:]


# --------------------------------------------------------------------------- training


def train_model(items: Iterable[LabelledReply]) -> ReplyModel:
    """Both heads fitted to the users' replies among `items` (tool outputs are left to the rules)."""
    replies = [item for item in items if item.role == "user"]
    rows = [reply_features(item.reply, item.request) for item in replies]
    vocabulary = {name: index for index, name in enumerate(sorted({name for row in rows for name in row}))}
    scores = np.eye(len(SCORES))[[SCORES.index(item.score) for item in replies]]
    directions = np.array([1.0 if item.hint_keywords else 0.0 for item in replies])
    score_offsets = np.array([score_leaning(item.reply) for item in replies])
    direction_offsets = np.array([direction_leaning(item.reply) for item in replies])
    # One BLAS thread: the fit is thousands of small matrix products, and a second thread only helps
    # on an idle machine (1.2 s against 1.6). Beside serving, whose threads keep the cores busy, the
    # two threads waiting on each other took 12 s (and over a minute beside vLLM's CPU server).
    with threadpool_limits(limits=1, user_api="blas"):
        gram = _gram(rows, vocabulary)
        score_mix, direction_mix = _fit(gram, scores, score_offsets, directions, direction_offsets)
    return ReplyModel(vocabulary, _weights(rows, vocabulary, score_mix), _weights(rows, vocabulary, direction_mix))


_DEFAULT_MODEL_LOCK = threading.Lock()
_default: list[ReplyModel] = []  # the process's classifier, once built or loaded


def default_model(cache_dir: Path | None = None) -> ReplyModel:
    """The classifier trained on the corpus's tuning part: what the offline judge uses.

    Built once per process. The judge worker judges several turns at once in threads; without the
    lock each of them would train its own copy at the same time (seconds each, on the one CPU the
    background loops get), and the first turns would wait for all of them. With `cache_dir` the
    weights are loaded from there when this corpus and code trained them before, and kept there
    when they had to be trained.
    """
    with _DEFAULT_MODEL_LOCK:
        if not _default:
            _default.append(_cached_or_trained(cache_dir))
        return _default[0]


def forget_default_model() -> None:
    """Drop the process's classifier: the next `default_model()` loads or trains it again."""
    with _DEFAULT_MODEL_LOCK:
        _default.clear()


def _cached_or_trained(cache_dir: Path | None) -> ReplyModel:
    corpus = corpus_path(TUNING).read_text(encoding="utf-8")
    if cache_dir is None:
        return train_model(parse_part(corpus))
    path = cache_dir / "judge" / f"reply-model-{_model_key(corpus)}.npz"
    if path.exists():
        try:
            return _load(path)
        except (OSError, ValueError, KeyError) as error:  # a torn or foreign file: train again, overwrite it
            log.warning("the judge's cached classifier %s is unreadable (%s); training it again", path, error)
    log.info("training the offline judge's classifier on %s (once for this corpus and code; kept in %s)",
             corpus_path(TUNING).name, path.parent)
    model = train_model(parse_part(corpus))
    _save(path, model)
    return model


def _model_key(corpus: str) -> str:
    """What the weights depend on: the tuning part and the code that turns replies into features and fits them."""
    digest = hashlib.sha256(corpus.encode())
    for module_file in (__file__, lexicon.__file__):
        digest.update(Path(module_file).read_bytes())
    return digest.hexdigest()[:16]


def _save(path: Path, model: ReplyModel) -> None:
    """Written beside and renamed into place: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    names = np.array(sorted(model.vocabulary, key=model.vocabulary.__getitem__))
    with open(staging, "wb") as file:
        np.savez(file, names=names, score_weights=model.score_weights, direction_weights=model.direction_weights)
    os.replace(staging, path)


def _load(path: Path) -> ReplyModel:
    with np.load(path, allow_pickle=False) as stored:
        names = stored["names"].tolist()
        return ReplyModel({name: index for index, name in enumerate(names)}, stored["score_weights"],
                          stored["direction_weights"])


def _gram(rows: list[dict[str, float]], vocabulary: dict[str, int]) -> np.ndarray:
    """The replies' gram matrix (features @ features.T).

    Most n-grams occur in one reply only and add to that reply's diagonal entry alone; most of the
    rest occur in a handful, and add their few products where those replies meet. Only the features
    many replies share (the bias, common letters, the cues) go through a dense matrix product: a
    dense product over every shared feature took most of the classifier's training time.
    """
    columns: dict[int, tuple[list[int], list[float]]] = {}
    for i, row in enumerate(rows):
        for name, value in row.items():
            replies, values = columns.setdefault(vocabulary[name], ([], []))
            replies.append(i)
            values.append(value)
    gram = np.zeros((len(rows), len(rows)))
    common = [entry for entry in columns.values() if len(entry[0]) > COMMON_FEATURE_REPLIES]
    for replies, values in columns.values():
        if 1 < len(replies) <= COMMON_FEATURE_REPLIES:
            vector = np.array(values)
            gram[np.ix_(replies, replies)] += np.outer(vector, vector)
        elif len(replies) == 1:
            gram[replies[0], replies[0]] += values[0] * values[0]
    if common:
        dense = np.zeros((len(rows), len(common)))
        for column, (replies, values) in enumerate(common):
            dense[replies, column] = values
        gram += dense @ dense.T
    return gram


def _fit(gram: np.ndarray, scores: np.ndarray, score_offsets: np.ndarray, directions: np.ndarray,
         direction_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How much of each reply's features each head's weights hold (`mix`): two regularised logistic
    models (softmax over the scores, sigmoid for the direction) over fixed offsets (the lexicon's
    leanings), fitted by full-batch gradient descent from zeros.

    There are far more features than replies, so the descent runs in the replies' space: every
    gradient is a combination of the feature rows, hence the weights are `features.T @ mix` at every
    step, and the logits `gram @ mix` with the replies' gram matrix (replies x replies). The same
    steps as in the features' space, at a small fraction of the cost. Both heads step together, one
    product with the gram matrix per step: reading that matrix is the cost, not the four columns.
    """
    # The product in single precision: reading the gram matrix is the cost, and the logits need no
    # more than six digits; the descent itself is kept in double precision.
    gram = gram.astype(np.float32)
    mix = np.zeros((len(gram), len(SCORES) + 1))
    for _ in range(STEPS):
        logits = (gram @ mix.astype(np.float32)).astype(np.float64)
        error = np.column_stack([_softmax(logits[:, :-1] + score_offsets) - scores,
                                 _sigmoid(logits[:, -1] + direction_offsets) - directions])
        mix -= LEARNING_RATE * (error / len(gram) + L2 * mix)
    return mix[:, :-1], mix[:, -1]


def _weights(rows: list[dict[str, float]], vocabulary: dict[str, int], mix: np.ndarray) -> np.ndarray:
    """features.T @ mix, row by row: the weights `_fit` describes."""
    weights = np.zeros((len(vocabulary), *mix.shape[1:]))
    for row, share in zip(rows, mix, strict=True):
        columns = [vocabulary[name] for name in row]
        values = np.array(list(row.values()))
        weights[columns] += values.reshape(-1, *([1] * (mix.ndim - 1))) * share
    return weights


def _softmax(logits: np.ndarray) -> np.ndarray:
    logits = np.atleast_2d(logits)
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def _sigmoid(values: np.ndarray | float) -> np.ndarray | float:
    return 1.0 / (1.0 + np.exp(-values))
