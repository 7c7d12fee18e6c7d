"""Who is calling: the admin (`--api-key`), a user with a key of their own (`clawrl users add`), or
nobody where the server is open (DESIGN §3, §12). One check for every route and wire API.

The key comes as `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>`
(Anthropic's); either is accepted everywhere. The admin key is compared in constant time; a user's
key is hashed and its digest looked up (`store/users.py` says why that leaks nothing). A server is
open (every request the default user's, with the admin's reach) only while it has neither an admin
key nor users: once one user exists, a request without a valid key is refused, so adding a user
never leaves an open door beside their key.

The users' keys are read from the store at most once a second (`KEYS_FRESH_S`), not per request: a
key added, rotated or removed with `clawrl users` takes effect within that second, and so does a
user's `--no-store` or `--no-train` (`clawrl users set`), which their `Caller` carries.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass

from clawrl.errors import APIError
from clawrl.store.turns import TurnStore
from clawrl.store.users import UserStore, key_sha256
from clawrl.types import DEFAULT_USER, User

KEYS_FRESH_S = 1.0
NO_KEY = "Missing or invalid API key; send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')."
# A session a user names is stored under their name (`scoped_session_id`): the column holds this much
MAX_SESSION_ID_CHARS = 256
OWNED_NAME_ATTEMPTS = 8  # `~`-marked variants of a name tried when others hold it (`owned_session_id`)


@dataclass(frozen=True)
class Caller:
    """Whose request it is: `user_id` owns what it records; `admin` reaches every user's records;
    `store` and `train` are the user's opt-outs (False: `clawrl users set NAME --no-store`, `--no-train`)."""

    user_id: str
    admin: bool
    store: bool = True
    train: bool = True


ADMIN = Caller(DEFAULT_USER, admin=True)


class KeyChecker:
    """Finds the caller of a request from its key."""

    def __init__(self, admin_key: str | None, users: UserStore) -> None:
        self.admin_key = admin_key
        self.users = users
        self._owners: dict[str, User] = {}
        self._read_at = float("-inf")
        self._reading: asyncio.Lock | None = None

    async def caller(self, headers: Mapping[str, str]) -> Caller:
        """The caller, or APIError 401. `headers` are the request's, names in lowercase. A client may
        send both headers (Anthropic's SDK with a token and a key): either one that holds a valid key
        names the caller, the admin's first."""
        keys = _given_keys(headers)
        if self.admin_key is not None:
            # every key compared, always: how long the check takes says nothing about which was right
            matches = [hmac.compare_digest(key.encode(), self.admin_key.encode()) for key in keys]
            if any(matches):
                return ADMIN
        owners = await self._key_owners()
        for key in keys:
            if (user := owners.get(key_sha256(key))) is not None:
                return Caller(user.id, admin=False, store=user.store, train=user.train)
        if self.admin_key is None and not owners:
            return ADMIN  # an open server: one person, no keys
        raise APIError(401, NO_KEY, "invalid_api_key")

    async def viewer(self, headers: Mapping[str, str]) -> str | None:
        """For the dashboard: None when the caller sees every user's records (the admin), else their user id."""
        caller = await self.caller(headers)
        return None if caller.admin else caller.user_id

    async def _key_owners(self) -> dict[str, User]:
        if time.monotonic() - self._read_at < KEYS_FRESH_S:
            return self._owners
        self._reading = self._reading or asyncio.Lock()
        async with self._reading:  # one read for all the requests that found the keys stale
            if time.monotonic() - self._read_at >= KEYS_FRESH_S:
                self._owners = await asyncio.to_thread(self.users.key_owners)
                self._read_at = time.monotonic()
        return self._owners


def _given_keys(headers: Mapping[str, str]) -> list[str]:
    """The keys a request carries: its bearer token and its `x-api-key`, those it has."""
    authorization = headers.get("authorization", "")
    bearer = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
    return [key for key in (bearer, headers.get("x-api-key", "").strip()) if key]


def scoped_session_id(user_id: str, name: str) -> str:
    """The stored id of a new session a user names: the name itself for the default user (and the
    admin), `USER/name` for a user, so two users who both name a session "work" hold two sessions and
    no user can name their way into another's. A name that already carries the user's prefix (the
    `X-Clawrl-Session` a response sent back) is kept as it is; so is the id of a session of theirs
    that the server named (`s_...`), which `owned_session_id` finds."""
    if user_id == DEFAULT_USER or name.startswith(f"{user_id}/"):
        scoped = name
    else:
        scoped = f"{user_id}/{name}"
    if len(scoped) > MAX_SESSION_ID_CHARS:
        raise APIError(400, f"The session id is longer than {MAX_SESSION_ID_CHARS - len(user_id) - 1} characters", "invalid_session_id")
    return scoped


def owned_session_id(sessions: TurnStore, user_id: str, name: str) -> str:
    """The id of `user_id`'s session called `name`: `name` itself when a session of that id is theirs
    (one the server named, sent back to it), else `scoped_session_id`, unless that id is a session of
    someone else's: the default user may hold any name (the admin names "alice/inbox", or a run from
    before users did), and a user's may be the admin's choice too. Then the next of `~`-marked
    variants that is free or the caller's ("alice/~inbox", "~alice/inbox" for the admin): naming a
    session never joins another's, and the same name keeps finding the same session."""
    if user_id != DEFAULT_USER:
        session = sessions.session(name)
        if session is not None and session.user_id == user_id:
            return name
    scoped = scoped_session_id(user_id, name)
    head = "" if user_id == DEFAULT_USER else f"{user_id}/"
    for _attempt in range(OWNED_NAME_ATTEMPTS):
        session = sessions.session(scoped)
        if session is None or session.user_id == user_id:
            return scoped
        scoped = head + "~" + scoped.removeprefix(head)
        if len(scoped) > MAX_SESSION_ID_CHARS:
            break
    raise APIError(409, f"The session name {name!r} is taken; choose another.", "session_name_taken")


def reaches(sessions: TurnStore, caller: Caller, session_id: str) -> bool:
    """Whether the caller may see the session: the admin any, a user their own (another's is to be
    answered as one that does not exist, so that ids tell nothing)."""
    if caller.admin:
        return True
    session = sessions.session(session_id)
    return session is not None and session.user_id == caller.user_id
