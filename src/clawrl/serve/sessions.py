"""Which session a request belongs to, what kind of turn it is, and what it tells about the last one.

Identity, in order (DESIGN §3): header `X-Session-Id`, body `session_id`, the OpenAI `user`
field, else inferred from the answers this server gave. Inference never assumes request k+1
starts with request k: agents drop ephemeral context messages between requests. Instead it
looks for an assistant message that equals a recorded answer and checks that the messages
before it come from that turn's conversation (the last one must, and at least half of all).
The newest matching turn wins; its next state is whatever the request adds after the answer.
A message the conversation never held but which quotes it (a compaction summary in place of
the older turns) counts as coming from it; a side request that echoes nothing (the summarizer
itself) joins the recent session whose conversation it quotes.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass

from clawrl.messages import (
    answer_fingerprint,
    content_text,
    conversation_hashes,
    echoed_answers,
    is_agent_retry_note,
    message_hash,
    QUOTE_MIN_CHARS,
    quotable_head,
    quote_text,
    recorded_fingerprint,
    user_typed,
)
from clawrl.errors import APIError
from clawrl.serve.auth import ADMIN, Caller, owned_session_id, scoped_session_id
from clawrl.store import Store
from clawrl.types import DEFAULT_USER, Message, SessionIdSource, Turn, TurnKind

TRUE_WORDS = {"1", "true", "yes", "on"}
# How recent an empty answer must be for a request without an echo to be taken as its retry
RETRY_WINDOW_S = 600.0
# How many of a request's last assistant messages are read for a call written as text (`echoed_answers`
# parses it, a few milliseconds at most each; a request of thousands must not stall serving)
ECHOES_READ = 8
# How many of the most recently active open sessions a side request that echoes nothing is
# compared with (`_quoted_session`)
QUOTED_SESSIONS = 8

# Requests that agents make for themselves rather than for their user, recognised by their system
# prompt whatever --side-turn-system-regex says (a client's X-Turn-Type or turn_type still
# decides). As main turns they would be trained on, and one that echoes the conversation would
# hand its instruction to the user's last turn as that turn's next state.
KNOWN_SIDE_SYSTEM_PROMPTS = re.compile(
    # OpenClaw's compaction summarizer: the conversation quoted as text, "summarize it".
    r"\AYou are a context summarization assistant\b"
    # OpenClaw's pre-compaction memory flush: the agent's own prompt, this paragraph in its
    # conversation context, and the whole conversation with "Pre-compaction memory flush. Store
    # durable memories ..." as the last user message.
    r"|^Pre-compaction memory flush turn\b",
    re.MULTILINE,
)
# The same, recognised by the request's last user message: the agent's own prompt and the whole
# conversation, then its instruction. Claude Code's compaction: "CRITICAL: Respond with TEXT ONLY.
# Do NOT call any tools." and its summary instructions.
# (a line of its own: Claude Code sometimes puts it after the user's message, in the same message)
KNOWN_SIDE_INSTRUCTIONS = re.compile(r"^CRITICAL: Respond with TEXT ONLY\. Do NOT call any tools\.", re.MULTILINE)


@dataclass
class SessionIdentity:
    """The session a request belongs to and, for a main turn, the earlier turn it continues."""

    session_id: str
    id_source: SessionIdSource
    continues_turn_id: str | None = None
    next_state: list[Message] | None = None  # what the request adds after that turn's answer


def explicit_session(
    headers: dict[str, str], body_session_id: str | None, user: str | None, caller: Caller = ADMIN
) -> tuple[str, SessionIdSource] | None:
    """(the session's name, where it came from) when the client named the session; `resolve_session`
    finds the caller's own session of that name (`owned_session_id`). A name too long to store under
    the caller's name is refused here, before the answer starts."""
    header = headers.get("x-session-id", "").strip()
    if len(header) > 256:
        raise APIError(400, "X-Session-Id is longer than 256 characters", "invalid_session_id")
    named: tuple[str, SessionIdSource] | None = None
    if header:
        named = header, "header"
    elif body_session_id:
        named = body_session_id, "body"
    elif user:
        named = f"user:{user}", "user"
    if named is not None:
        scoped_session_id(caller.user_id, named[0])
    return named


def turn_kind(
    headers: dict[str, str], body_turn_type: TurnKind | None, messages: list[Message], side_regex: re.Pattern[str] | None
) -> TurnKind:
    """`main` unless the client, a configured rule or a known agent's system prompt
    (`KNOWN_SIDE_SYSTEM_PROMPTS`) says `side` (DESIGN §3: main by default)."""
    header = headers.get("x-turn-type", "").strip().lower()
    if header and header not in ("main", "side"):
        raise APIError(400, "X-Turn-Type must be 'main' or 'side'", "invalid_turn_type", "X-Turn-Type")
    if header:
        return "main" if header == "main" else "side"
    if body_turn_type:
        return body_turn_type
    system_text = "\n".join(content_text(m.get("content")) for m in messages if m["role"] in ("system", "developer"))
    if KNOWN_SIDE_SYSTEM_PROMPTS.search(system_text) or (side_regex is not None and side_regex.search(system_text)):
        return "side"
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "user" and KNOWN_SIDE_INSTRUCTIONS.search(content_text(last.get("content"))):
        return "side"
    return "main"


def session_done(headers: dict[str, str], body_done: bool) -> bool:
    return body_done or headers.get("x-session-done", "").strip().lower() in TRUE_WORDS


def resolve_session(
    store: Store,
    explicit: tuple[str, SessionIdSource] | None,
    messages: list[Message],
    kind: TurnKind,
    stop: list[str] | None = None,
    user_id: str = DEFAULT_USER,
) -> SessionIdentity:
    """Find the session and, for a main turn, the earlier turn it continues and that turn's next state.

    Side turns (titles, summaries) often quote the whole conversation; they are grouped with
    their session but never supply a next state. `stop` is the request's stop strings: an agent
    may echo an answer with the stop string it ended at (`_answer_positions`). Only `user_id`'s
    sessions are searched: an answer another user was given, echoed, joins nothing of theirs.
    """
    if explicit is not None:
        session_id, source = owned_session_id(store.turns, user_id, explicit[0]), explicit[1]
        identity = SessionIdentity(session_id, source)
        previous = store.turns.last_main_turn(session_id) if kind == "main" else None
        if previous is not None:
            position = _answer_position(messages, previous, stop)
            next_state = messages[position + 1 :] if position is not None else _trailing_messages(messages)
            if next_state:
                identity.continues_turn_id, identity.next_state = previous.id, next_state
        return identity

    positions = _answer_positions(messages, stop)
    quotes = _RequestQuotes(messages)
    for candidate in store.turns.turns_with_answer(list(positions), user_id):
        position, kept_stop = positions[candidate.answer_fingerprint]
        if kept_stop is not None and kept_stop not in _stop_strings(candidate):
            continue  # the echo's ending is no stop string of that turn: a different answer
        if _follows_conversation(messages[:position], candidate, quotes):
            candidate, position = _past_empty_answers(store, messages, candidate, position)
            candidate = _past_agent_follow_up(store, candidate, positions)
            next_state = messages[position + 1 :] if kind == "main" else None
            return SessionIdentity(
                candidate.session_id,
                "inferred",
                continues_turn_id=candidate.id if next_state else None,
                next_state=next_state or None,
            )
    found = _retried_empty_answer(store, messages, user_id) if kind == "main" else _quoted_session(store, quotes, user_id)
    return found or SessionIdentity(f"s_{uuid.uuid4().hex[:20]}", "new")


def _quoted_session(store: Store, quotes: _RequestQuotes, user_id: str) -> SessionIdentity | None:
    """The session a side request that echoes no answer belongs to: the one of the QUOTED_SESSIONS
    most recently active open sessions whose conversation (its newest main turn's prompt and
    answer) the request quotes most, the more recent on a tie.

    A compaction summarizer gets the conversation as text ("[User]: ...", "[Assistant]: ...") in
    one user message, with no assistant message to echo: without this it would be a session of its
    own. Only messages that turn's prompt did not hold are read as quotes. Main requests are never
    placed this way: a new conversation that pastes an answer from another one is not its
    continuation.
    """
    best: tuple[int, str] | None = None
    open_sessions = [session for session in store.turns.list_sessions(4 * QUOTED_SESSIONS, user_id) if not session.done]
    for session in open_sessions[:QUOTED_SESSIONS]:
        newest = store.turns.last_main_turn(session.id)
        if newest is None:
            continue
        quoted = quotes.count_quoted(_quotable_heads(newest), quotes.unknown_to(newest))
        if quoted and (best is None or quoted > best[0]):
            best = (quoted, session.id)
    return SessionIdentity(best[1], "inferred") if best is not None else None


def _retried_empty_answer(store: Store, messages: list[Message], user_id: str) -> SessionIdentity | None:
    """A request that retries a turn which answered with nothing, without echoing the empty answer.

    An agent that got no visible answer may drop it and ask again, adding a message of its own
    (OpenClaw: "The previous attempt did not produce a user-visible answer ..."). No echo finds
    such a request, so it would start a session of its own and leave the empty turn without the
    next state that says it failed. It continues the newest recent empty turn, the newest main
    turn of its session, whose conversation the request keeps up to its first new message; what
    the request adds is that turn's next state.

    A retry keeps at least one message of that conversation before what it adds, so a request of
    one user message (every new conversation's first) is none, and asks the store nothing: this
    lookup was a fifth of the server's own work per request (issue 29, item 9). The one retry that
    passes unseen is of a turn whose prompt held system messages only.
    """
    if sum(message["role"] not in ("system", "developer") for message in messages) < 2:
        return None
    for turn in store.turns.recent_empty_answers(time.time() - RETRY_WINDOW_S, user_id):
        newest = store.turns.last_main_turn(turn.session_id)
        if newest is None or newest.id != turn.id:
            continue  # the session went on: a retry continues the latest turn only
        known = set(turn.message_hashes)
        added = [position for position, message in enumerate(messages)
                 if message["role"] not in ("system", "developer") and message_hash(message) not in known]  # fmt: skip
        if added and _follows_conversation(messages[: added[0]], turn):
            next_state = [messages[position] for position in added]
            return SessionIdentity(turn.session_id, "inferred", continues_turn_id=turn.id, next_state=next_state)
    return None


def _past_empty_answers(store: Store, messages: list[Message], candidate: Turn, position: int) -> tuple[Turn, int]:
    """Move on from the recognised answer to the session's newest turn when that one answered with nothing.

    An empty answer (the model stopped at once) has no fingerprint to be found by, so a request
    that echoes it would otherwise continue the turn before it. If the session's newest main turn
    answered empty and the request echoes an empty assistant message after `position` whose
    conversation is that turn's, the request continues that turn from there.
    """
    empty_answers = [later for later in range(len(messages) - 1, position, -1)
                     if messages[later]["role"] == "assistant" and _assistant_fingerprint(messages[later]) is None]
    if not empty_answers:  # the common case: no store read
        return candidate, position
    newest = store.turns.last_main_turn(candidate.session_id)
    if newest is None or newest.id == candidate.id or newest.response_text.strip() or newest.tool_calls:
        return candidate, position
    for later in empty_answers:
        if _follows_conversation(messages[:later], newest):
            return newest, later
    return candidate, position


def _past_agent_follow_up(store: Store, candidate: Turn, positions: dict[str, tuple[int, str | None]]) -> Turn:
    """Move on from the recognised answer to the agent's own follow-up of it, when the user saw that
    one's answer but the agent never echoes it.

    An agent that could not use an answer may ask the model again in the user's place and show the
    user what that follow-up answered, keeping only the first answer in its memory (smolagents,
    after `max_steps`: the last step's answer stays, then "Error: Reached max steps." where the
    answer the user saw was). The user's next words then arrive after the first answer's echo, but
    they reply to the follow-up's answer. So: when the recognised turn's next state came from the
    session's newest main turn, holds no words of the user (only an agent's retry notes,
    `is_agent_retry_note`), and that newest turn has no next state and is not echoed here, the
    request continues the newest turn.
    """
    newest = store.turns.last_main_turn(candidate.session_id)
    if newest is None or newest.id == candidate.id or newest.answer_fingerprint in positions:
        return candidate
    next_states = store.turns.next_states([candidate.id, newest.id])
    follow_up = next_states.get(candidate.id)
    if follow_up is None or follow_up.source_turn_id != newest.id or newest.id in next_states:
        return candidate
    agents_only = all(
        message["role"] == "user" and is_agent_retry_note(user_typed(message)) for message in follow_up.messages
    )  # fmt: skip
    return newest if agents_only and follow_up.messages else candidate


def _assistant_fingerprint(message: Message) -> str | None:
    return answer_fingerprint(*echoed_answers(content_text(message.get("content")), message.get("tool_calls"))[0])


def _answer_positions(messages: list[Message], stop: list[str] | None = None) -> dict[str, tuple[int, str | None]]:
    """Fingerprint of every assistant message -> (its last position in the request, the stop string
    its echo kept at its end, or None).

    A message is known by each answer it may echo (`echoed_answers`: a call written as text is the
    call, or a CodeAgent's own call of the code in its text is that text). An empty one is known by
    the conversation before it, as the server recorded it: found when the client echoes that
    conversation unchanged (else `_past_empty_answers` may still find it). An agent that ended generation at a stop string may put that string back at the end of the
    answer it keeps (smolagents' CodeAgent adds "</code>" to every answer, cut there or not), and
    the request that echoes it need not carry that stop string (its call for a final answer has
    none): an echo that ends with one of the request's stop strings, or with a closing tag
    (`</code>`), is also known without it, if that is a stop string of the turn found so.
    """
    positions: dict[str, tuple[int, str | None]] = {}
    assistant_positions = [position for position, message in enumerate(messages) if message["role"] == "assistant"]
    read_as_echoes = set(assistant_positions[-ECHOES_READ:])
    for position in assistant_positions:
        message = messages[position]
        content, tool_calls = content_text(message.get("content")), message.get("tool_calls")
        for text, calls in echoed_answers(content, tool_calls) if position in read_as_echoes else [(content, tool_calls)]:
            for kept_stop in _kept_stops(text.strip(), stop or []) if not calls else ():
                fingerprint = answer_fingerprint(text.strip().removesuffix(kept_stop), None)
                if fingerprint is not None:  # a later echo of the same answer wins, as below
                    positions[fingerprint] = (position, kept_stop)
            positions[recorded_fingerprint(text, calls, conversation_hashes(messages[:position]))] = (position, None)
    return positions


_CLOSING_TAG = re.compile(r"</[A-Za-z][\w-]{0,30}>\Z")


def _kept_stops(text: str, stop: list[str]) -> set[str]:
    """The stop strings an echoed answer may have kept at its end: the request's, and a closing tag."""
    kept = {string.strip() for string in stop if string.strip() and text.endswith(string.strip())}
    tag = _CLOSING_TAG.search(text)
    return kept | {tag.group()} if tag else kept


def _stop_strings(turn: Turn) -> set[str]:
    return {string.strip() for string in turn.sampling.stop}


def _answer_position(messages: list[Message], turn: Turn, stop: list[str] | None) -> int | None:
    found = _answer_positions(messages, stop).get(turn.answer_fingerprint) if turn.answer_fingerprint else None
    if found is None or (found[1] is not None and found[1] not in _stop_strings(turn)):
        return None
    return found[0]


def _trailing_messages(messages: list[Message]) -> list[Message]:
    """For a client that names its session but does not echo answers: what follows the last assistant."""
    last_assistant = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    return [m for m in messages[last_assistant + 1 :] if m["role"] not in ("system", "developer")]


def _follows_conversation(prefix: list[Message], turn: Turn, quotes: _RequestQuotes | None = None) -> bool:
    """Do the messages before the echoed answer come from the conversation that produced it?

    A message that turn's prompt did not hold still counts when it quotes that conversation
    (`quotes`, positions in the whole request, of which `prefix` is the start): an agent that
    compacts its history sends a summary of the older turns in their place, and the request after a
    compaction may keep no more than the last answer after it.
    """
    positions = [position for position, m in enumerate(prefix) if m["role"] not in ("system", "developer")]
    if not positions:
        return not turn.message_hashes
    known = set(turn.message_hashes)
    held = {position for position in positions if message_hash(prefix[position]) in known}
    if _mostly(positions, held):
        return True
    if quotes is None:
        return False
    # Only a user or tool message long enough to hold a quote may be one: read the turn's
    # conversation for quotes only where they could make the difference.
    could_quote = {position for position in positions if position not in held and quotes.long_enough(position)}
    if not could_quote or not _mostly(positions, held | could_quote):
        return False
    return _mostly(positions, held | quotes.quoting(_quotable_heads(turn), could_quote))


def _mostly(positions: list[int], found: set[int]) -> bool:
    """The last of these messages is found, and at least half of them are."""
    return positions[-1] in found and 2 * sum(position in found for position in positions) >= len(positions)


def _quotable_heads(turn: Turn) -> set[str]:
    """What a quote of `turn`'s conversation may repeat (`quotable_head`): its answer, the answers
    its prompt echoes, and what its user typed (no agent's retry note: every session has those)."""
    texts = [turn.response_text]
    for message in turn.messages:
        if message["role"] == "assistant":
            texts.append(content_text(message.get("content")))
        elif message["role"] == "user":
            typed = user_typed(message)
            if not is_agent_retry_note(typed):
                texts.append(typed)
    return {head for head in map(quotable_head, texts) if head}


class _RequestQuotes:
    """A request's user and tool messages as quotes are looked for in them (`quote_text`), each
    normalised once, when first needed."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self._texts: dict[int, str] = {}

    def long_enough(self, position: int) -> bool:
        """Could the message at `position` hold a quote (a user or tool message, long enough)?"""
        return self.messages[position]["role"] in ("user", "tool") and len(self.text(position)) >= QUOTE_MIN_CHARS

    def unknown_to(self, turn: Turn) -> list[int]:
        """The user and tool messages that `turn`'s prompt did not hold: a message sent again is no quote."""
        known = set(turn.message_hashes)
        return [position for position, m in enumerate(self.messages)
                if m["role"] in ("user", "tool") and message_hash(m) not in known]  # fmt: skip

    def text(self, position: int) -> str:
        if position not in self._texts:
            self._texts[position] = quote_text(content_text(self.messages[position].get("content")))
        return self._texts[position]

    def quoting(self, heads: set[str], positions: list[int]) -> set[int]:
        """Which of these messages (user or tool messages only) quote at least one of `heads`."""
        if not heads:
            return set()
        return {position for position in positions if self.messages[position]["role"] in ("user", "tool")
                and any(head in self.text(position) for head in heads)}  # fmt: skip

    def count_quoted(self, heads: set[str], positions: list[int]) -> int:
        """How many of `heads` these messages quote."""
        texts = [self.text(position) for position in positions if self.messages[position]["role"] in ("user", "tool")]
        return sum(any(head in text for text in texts) for head in heads)
