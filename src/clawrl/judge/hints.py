"""Directive hints from what the user typed: the clauses that say how the answer should have been.

One candidate per sentence that asks for a change, in any of the corpus's languages:

* an English directive trigger ("don't ...", "without ...", "use ...", "please ...", "make it ...")
  starts the clause, which runs to the sentence's end, as the rule judge always did:
  "too AI-like, rewrite it without the bold" gives "Rewrite it without the bold."; "don't", "never",
  "stop" and "use" count only where they open a clause ("I don't know" asks for nothing), and a
  standing phrase ("next time don't ...") leads into one as "but" does; a "please" or "instead"
  that opens no clause closes the request before it ("no emojis please, i use this for work");
* otherwise a request put as a question loses its frame and becomes an imperative: "could you
  make it shorter?" gives "Make it shorter.", "¿puedes hacerlo más corto?" gives "Hacerlo más
  corto.", "would you mind making it more polite?" gives "Make it more polite.";
* otherwise a bare imperative ("ok but drop the last paragraph", "pásamelo en viñetas") starts
  the clause where it opens one (after the sentence's start, a comma or a lead-in such as "but",
  "also", "just"), so a verb in the middle of a question ("does the list have ...") is no directive;
* Chinese and Japanese sentences that ask for a change are kept whole: their request frames come
  at the end ("短くできますか").

Beside them, the whole reply as one hint (`reply_hint`): every directive sentence as its clause,
every other sentence as written except those that only praise or thank. A correction often
lives in more than one sentence ("Could you keep it honest? I contributed, I didn't lead.") or in
none that asks ("its 40x28 not 45x30"); the clauses alone would lose it.

Nothing here decides whether a reply directs at all: the judge offers these candidates only when
its classifier reads the reply as a correction (`rule.py`).

A hint is about one answer; a memory note (`--memory on`) is said again on every later prompt of
the user. `durable_directives` keeps of a hint what would still hold then: the sentences that say
they hold from now on, and the directive clauses less those tied to this task (a number, words
quoted from the conversation, "this one", more content for this answer). "Please
answer this one: Jia travels 33 km ..." is a fine hint for its turn and a harmful note: on later
prompts it asks for another problem's answer.
"""

from __future__ import annotations

import re

from clawrl.judge.lexicon import cue_counts, cue_spans, fold
from clawrl.judge.parsing import MIN_HINT_CHARS
from clawrl.messages import content_text
from clawrl.types import MemoryFrom, Turn

MAX_HINTS = 4  # candidates per turn: each costs the selector two scoring passes
QUOTED_WORDS = 4  # a clause sharing this many consecutive words with the conversation quotes the task

_DIRECTIVE = re.compile(
    r"\b(?:don't|do not|never|avoid|stop|without|use|please|pls|plz|you should|rewrite it|make it|keep it|i meant|"
    r"i prefer|i'?d prefer|i would prefer|i'?d rather|i would rather)\b",
    re.IGNORECASE,
)
# Triggers that direct only where they open a clause: "don't use bold" does, "I don't know" does not.
_CLAUSE_OPENERS_ONLY = frozenset({"don't", "do not", "never", "use", "stop"})
_DIRECTION_CUES = ("complaint", "too", "comparative", "emphasis", "contrast", "request_frame", "imperative", "sarcasm",
                   "challenge")
_APPROVAL_CUES = ("praise", "thanks", "works", "done", "hesitation", "laughter", "positive_emoji")
_POINTS_AT_THE_TASK = re.compile(
    r"\b(?:this|that|the other|the next|the first|the last) (?:one|question|problem|exercise|task)\b|"
    r"\bmy (?:question|problem|numbers|exercise|task|homework|message|file|data|text)\b|"
    r"\b(?:those|these|the) (?:numbers|values)\b",
    re.IGNORECASE,
)
# Words that say a request holds beyond this answer ("from now on", "next time", "always").
_STANDING = (r"(?:from now on|going forward|(?:for|in) (?:the )?future(?: reference)?|next time|always|every time|"
             r"each time|any ?time|whenever|in general|generally|by default|from here on)")
_STANDS = re.compile(rf"\b{_STANDING}\b", re.IGNORECASE)
_STANDING_AT_END = re.compile(rf"\b{_STANDING},?\s*$", re.IGNORECASE)
# Words that only close the request before them ("no emojis please", "do lists instead"): where
# they open no clause, the request is what comes before them.
_TAIL = re.compile(r"(?:please|pls|plz|instead)\b", re.IGNORECASE)
# Clauses about this answer alone, unless a standing word says otherwise: more content for it
# ("mention the deadline", "add a column"), a repair of it, a question. Not the answer's purpose:
# "it's for a tweet" is this answer's, "it's for my pupils" (the simulated teacher's) every answer's.
_FOR_THIS_ANSWER = re.compile(
    r"^(?:(?:please|pls|just|also|and|it|this|that|you) )*(?:should )?(?:add|mention|include|insert|fix|translate|correct)\b|"
    r"^(?:what|why|how|which|where|when|who)\b",
    re.IGNORECASE,
)
# A standing complaint about correctness ("you always get this wrong") is no preference.
_ABOUT_CORRECTNESS = re.compile(r"\b(?:wrong|mistake|incorrect|right answer)\b", re.IGNORECASE)
_WORD = re.compile(r"\w+")
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？])|\n+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff]")
# Question frames around a request: what is left once they go is the request itself.
_QUESTION_FRAME = re.compile(
    r"^(?:(?:so|and|but|ok|okay|also|hmm|hey),?\s+)?(?:"
    r"(?:could|can|would|will) (?:you|u|ya)(?: please| maybe| perhaps| also| just)?(?: mind)?|cn u|"
    r"(?:could|can) we(?: maybe| please| also| just)?|do you mind|any chance you could|"
    r"(?:would it be|is it) possible to|i'?d like you to|i (?:want|need) you to|mind|"
    r"(?:me |te |le |nos )?(?:lo |la |los |las )?(?:puedes|podr[ií]as|podr[ií]a|podemos)(?: por favor)?|"
    r"(?:est-ce que )?(?:tu peux|tu pourrais|vous pourriez|vous pouvez|on pourrait|on peut)|pourriez-vous|pourrais-tu|"
    r"peux-tu|pouvez-vous|est-ce qu'on pourrait|"
    r"kannst du|k[öo]nntest du|k[öo]nnten sie|k[öo]nnen sie|k[öo]nnen wir|"
    r"(?:voc[êe] )?(?:pode|podes|poderia|consegue)|d[áa] (?:pra|para)|seria poss[íi]vel|"
    r"(?:mi )?(?:puoi|potresti|potete|riesci a)|"
    r"kun je|kan je|kunt u|zou je|wil je|"
    r"(?:не )?(?:можешь|могли бы вы|мог бы ты|могла бы ты)|можно"
    r")\s+",
    re.IGNORECASE,
)
_ASKED_OF_THE_ANSWER = re.compile(r"(?:can|could|would|will) (it|this|that|the \w+)(?: maybe| please)? ",
                                  re.IGNORECASE)
_GERUNDS = {
    "making": "make", "adding": "add", "writing": "write", "using": "use", "changing": "change", "removing": "remove",
    "dropping": "drop", "putting": "put", "including": "include", "mentioning": "mention", "keeping": "keep",
    "giving": "give", "cutting": "cut", "taking": "take", "rewriting": "rewrite", "shortening": "shorten",
    "explaining": "explain", "moving": "move", "translating": "translate", "switching": "switch", "saying": "say",
    "replacing": "replace", "turning": "turn", "toning": "tone", "trimming": "trim", "sending": "send",
}
# Words that may stand between a clause boundary and the imperative that opens the clause.
_LEAD_INS = frozenset(fold(word) for word in (
    "but", "and", "also", "just", "then", "now", "so", "ok", "okay", "pls", "plz", "please", "wait", "maybe",
    "though", "tho", "only", "oh", "y", "pero", "también", "solo", "ahora", "et", "mais", "aussi", "juste",
    "maintenant", "und", "aber", "auch", "nur", "jetzt", "dann", "bitte", "noch", "e", "mas", "só", "agora",
    "ma", "anche", "adesso", "però", "en", "maar", "ook", "nu", "alleen", "и", "но", "а", "тоже", "только",
    "теперь", "ещё", "еще", "no", "nah", "nope", "hmm", "sí", "si", "oui", "ja", "sim",
))


def directive_hints(text: str) -> list[str]:
    """The directive clause of each sentence of `text` (at least MIN_HINT_CHARS long, no repeats, at most MAX_HINTS)."""
    clauses = [directive_clause(sentence) for sentence in _sentences(text)]
    usable = [clause for clause in clauses if clause and len(clause) >= MIN_HINT_CHARS]
    return list(dict.fromkeys(usable))[:MAX_HINTS]


def reply_hint(text: str) -> str | None:
    """The reply as one hint: directive sentences as their clauses, praise and thanks left out, the rest as written."""
    parts = [directive_clause(sentence) or _as_context(sentence) for sentence in _sentences(text)]
    hint = " ".join(part for part in parts if part)
    return hint if len(hint) >= MIN_HINT_CHARS else None


def durable_directives(hint: str, conversation: list[str]) -> str | None:
    """What of `hint` would hold for the user's later requests, as one note; None when nothing would.

    Each sentence of the hint that says it holds beyond this answer ("from now on", "next time",
    "always": `_STANDS`) is kept whole, since the hint's clause of it may have lost the words that
    said so or, parsed again, its object ("Do lists instead from now on."); of the other sentences
    their directive clauses. Dropped: a clause about this answer alone (more content for it, a
    repair, a question, its purpose: `_FOR_THIS_ANSWER`), one that names a number (unless it
    stands: "always use 24-hour time"), points at the task ("this one", "my numbers") or quotes
    QUOTED_WORDS consecutive words of `conversation` (the texts the answer replied to, and the answer).
    """
    quoted = set()
    for text in conversation:
        words = _WORD.findall(fold(text))
        quoted.update(tuple(words[start : start + QUOTED_WORDS]) for start in range(len(words) - QUOTED_WORDS + 1))

    def durable(clause: str) -> bool:
        stands = _STANDS.search(clause) is not None
        if not stands and (_FOR_THIS_ANSWER.search(clause) or any(char.isdigit() for char in clause)):
            return False
        words = _WORD.findall(fold(clause))
        runs = {tuple(words[start : start + QUOTED_WORDS]) for start in range(len(words) - QUOTED_WORDS + 1)}
        return not _POINTS_AT_THE_TASK.search(clause) and not runs & quoted

    clauses = [_standing_sentence(sentence) or directive_clause(sentence) for sentence in _sentences(hint)]
    usable = [clause for clause in clauses if clause and len(clause) >= MIN_HINT_CHARS and durable(clause)]
    kept = list(dict.fromkeys(usable))[:MAX_HINTS]
    return " ".join(kept) if kept else None


def _standing_sentence(sentence: str) -> str | None:
    """A sentence that says it holds from now on, whole; None for any other, and for a question or a
    standing complaint about correctness, which ask for nothing to keep doing."""
    if not _STANDS.search(sentence) or _ABOUT_CORRECTNESS.search(sentence) or re.match(r"(?:what|why|how|which|who)\b",
                                                                                          sentence, re.IGNORECASE):
        return None
    return _as_sentence(sentence)


def memory_note(turn: Turn, hint: str, memory_from: MemoryFrom) -> str | None:
    """What of `hint`, the judge's chosen hint on `turn`, becomes a note of the turn's user
    (`--memory-from`); None: nothing. The conversation it must not quote is what was asked and
    answered: a system prompt's own wording is no quote of the task."""
    if memory_from == "hints":
        return hint
    return durable_directives(hint, _conversation(turn))


def praise_note(turn: Turn, reply: str, memory_from: MemoryFrom) -> str | None:
    """What of `reply`, a reply the judge read as praise of `turn` (+1, so it has no hint), becomes a
    note of the turn's user: what would hold for later requests, as of a hint ("Thanks! Also, I'm
    colorblind, so please don't rely on red/green" keeps the request). A praise is no hint, since
    nothing in its answer should change, but a standing wish said beside it is still the user's.
    With `--memory-from hints` there is no hint to keep, so nothing."""
    if memory_from == "hints":
        return None
    return durable_directives(reply, _conversation(turn))


def _conversation(turn: Turn) -> list[str]:
    """What a note must not quote: the texts the answer replied to, and the answer."""
    asked = [content_text(message.get("content")) for message in turn.messages if message["role"] in ("user", "assistant")]
    return [*asked, turn.response_text]


def directive_clause(sentence: str) -> str | None:
    """The part of one sentence that asks for a change, as an imperative sentence; None when it asks for none."""
    if _CJK.search(sentence):
        return _as_sentence(sentence) if _asks_for_change(sentence) else None
    english = _english_trigger(sentence)
    start = _request_start(sentence)
    if english is not None and (start is None or english <= start):
        begin, clause = english, sentence[english:]
    elif start is not None:
        begin, clause = start, _imperative(sentence[start:])
    else:
        return None
    negation = re.search(r"\bno\s+$", sentence[:begin], re.IGNORECASE)  # "no need to ...": "no" denies, it leads in nothing
    if negation is not None:
        begin, clause = negation.start(), f"{negation.group()}{clause}"
    tail = _TAIL.match(sentence, begin)
    if tail is not None and not _opens_clause(sentence[:begin]):
        # "no emojis please, i use this for work", "always cite sources please": the request is before it
        ends = not sentence[tail.end():].strip(" .!?")
        clause = sentence[_segment_start(sentence, begin) : begin if ends else None]
        begin = _segment_start(sentence, begin)
    standing = _STANDING_AT_END.search(sentence[:begin])  # "going forward can you keep it short": keep the first words
    return _as_sentence(f"{standing.group().rstrip(', ')} {clause}" if standing else clause)


def _english_trigger(sentence: str) -> int | None:
    """Where the first English directive trigger that directs here starts."""
    for match in _DIRECTIVE.finditer(sentence):
        if match.group().lower() not in _CLAUSE_OPENERS_ONLY or _opens_clause(sentence[: match.start()]):
            return match.start()
    return None


def _asks_for_change(sentence: str) -> bool:
    return any(cue_spans(sentence, name) for name in ("request_frame", "imperative", "too", "comparative", "emphasis"))


def _as_context(sentence: str) -> str | None:
    """A sentence that asks for nothing, kept unless it only praises, thanks or hesitates ("Boa, funcionou!")."""
    counts = cue_counts(sentence)
    approves_only = any(counts[name] for name in _APPROVAL_CUES) and not any(counts[name] for name in _DIRECTION_CUES)
    if approves_only or not re.search(r"\w", sentence):
        return None
    return _as_sentence(sentence)


def _request_start(sentence: str) -> int | None:
    """Where the request opens: at a request frame anywhere, or at an imperative that opens a clause."""
    frames = [start for start, _ in cue_spans(sentence, "request_frame")]
    verbs = [start for start, _ in cue_spans(sentence, "imperative") if _opens_clause(sentence[:start])]
    starts = frames + verbs
    return min(starts) if starts else None


def _opens_clause(before: str) -> bool:
    """Whether a word after `before` opens a clause: nothing, a punctuation mark or up to two lead-ins
    (a standing phrase such as "next time" among them) before it."""
    for _ in range(3):
        before = before.rstrip()
        if not before or before[-1] in ",;:—–-(¿¡\"'«>":
            return True
        standing = _STANDING_AT_END.search(before)
        if standing is not None:
            before = before[: standing.start()]
            continue
        words = before.split()
        if fold(words[-1].strip(",.!")) not in _LEAD_INS:
            return False
        before = before[: len(before) - len(words[-1])]
    return False


def _segment_start(sentence: str, end: int) -> int:
    """Where the stretch of `sentence` that ends at `end` starts: after the last comma, semicolon or
    colon before it, past the lead-ins ("so", "but") that open it."""
    start = max(sentence.rfind(mark, 0, end) for mark in ",;:") + 1
    words = list(re.finditer(r"\S+", sentence[start:end]))
    for word in words:
        lead_in = fold(word.group().strip(",.!"))
        if lead_in not in _LEAD_INS or lead_in == "no" or word is words[-1]:  # "no emojis please": "no" is the request
            return start + word.start()
    return start


def _imperative(clause: str) -> str:
    """A request without its question frame: "could you make it shorter" -> "make it shorter"."""
    clause = clause.lstrip("¿¡ ")
    subject = _ASKED_OF_THE_ANSWER.match(clause)
    if subject is not None:  # "can it be shorter" -> "it should be shorter"
        return f"{subject[1]} should {clause[subject.end():]}"
    unframed = _QUESTION_FRAME.sub("", clause, count=1)
    if unframed == clause or not unframed:
        return clause
    first, _, rest = unframed.partition(" ")
    return " ".join(part for part in (_GERUNDS.get(first.lower(), first), rest) if part)


def _sentences(text: str) -> list[str]:
    return [sentence.strip() for sentence in _SENTENCE_END.split(text) if sentence.strip()]


def _as_sentence(clause: str) -> str | None:
    clause = clause.strip().lstrip("¿¡").rstrip(".!?;,:。！？ ")
    if not clause:
        return None
    end = "。" if _CJK.search(clause[-1]) else "."
    return clause[0].upper() + clause[1:] + end
