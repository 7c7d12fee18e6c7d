"""The people who have keys of their own (DESIGN §12): adding them, their keys, finding a key's user.

A key is shown once, when it is made (`add`, `rotate_key`), and never stored: the table keeps its
SHA-256, and a request's key is found by hashing it and looking the digest up. Keys are 256 random
bits, so a fast hash is as good as a slow one against a stolen table, and a lookup of a digest
tells a timing attacker nothing about the key. A user's records are not removed with the user
(that is forgetting, a separate act: `forget`); they stay the removed user's, seen by the admin
only, and their name is not given to anyone else while they do (a new "dave" would reach them).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

import clawrl.store.records as records
from clawrl.store.database import Database
from clawrl.store.forgetting import ForgetReport, forget_rows, owns_anything
from clawrl.store.schema import UserRow
from clawrl.types import DEFAULT_USER, SHARED_LINEAGE, User

KEY_PREFIX = "sk-clawrl-"
KEY_HINT_CHARS = 14  # the prefix and four characters of the secret part
# A user's name is their id in every table and path (a lineage, a policy directory), so it is a
# plain word: lowercase letters, digits, '.', '_' and '-', starting with a letter or digit.
USER_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")


class UserError(ValueError):
    """A user that cannot be added, changed or found, with a message for the person who asked."""


def key_sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class UserStore:
    """Users and their keys (`store.users`)."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def add(self, name: str) -> tuple[User, str]:
        """A new user called `name` and their key (the only time it is seen)."""
        if not USER_NAME.fullmatch(name):
            raise UserError(f"{name!r} is not a user name: use up to 32 lowercase letters, digits, '.', '_' or '-'")
        if name == DEFAULT_USER:
            raise UserError(f"{DEFAULT_USER!r} is the name of the records made without a user's key; choose another")
        if name == SHARED_LINEAGE:
            raise UserError(f"{SHARED_LINEAGE!r} names the lineage trained on everyone's turns (a user's name is their "
                            "lineage's with --adapters per-user); choose another")
        if self._owns_records(name):
            raise UserError(f"{name!r} was a user whose records are still stored; a new user of that name would get "
                            "them: choose another name")  # fmt: skip
        key, now = new_key(), time.time()
        row = UserRow(id=name, key_sha256=key_sha256(key), key_hint=key[:KEY_HINT_CHARS], created_at=now, key_created_at=now)
        try:
            with self.database.write() as db:
                db.add(row)
        except IntegrityError:
            raise UserError(f"there is already a user called {name!r}") from None
        return self.get(name), key

    def _owns_records(self, name: str) -> bool:
        with self.database.read() as db:
            return owns_anything(db, name)

    def get(self, name: str) -> User:
        with self.database.read() as db:
            row = db.get(UserRow, name)
            if row is None:
                raise UserError(f"there is no user called {name!r}")
            return records.user(row)

    def list(self) -> list[User]:
        with self.database.read() as db:
            return [records.user(row) for row in db.scalars(select(UserRow).order_by(UserRow.id))]

    def remove(self, name: str) -> None:
        """The user and their key are gone at once (the next request with it is refused); their records stay."""
        with self.database.write() as db:
            if db.execute(delete(UserRow).where(UserRow.id == name)).rowcount == 0:
                raise UserError(f"there is no user called {name!r}")

    def forget(self, name: str, remove_account: bool) -> ForgetReport:
        """Delete every record of the user and their lineage's version rows, in one transaction, and
        leave no copy in the database's files (`Database.scrub`); with `remove_account`, the user and
        their key too. The lineage's directories are the caller's to remove (`report.version_paths`).
        A user removed before (`remove`) whose records stay can be forgotten; a name with neither is
        a UserError, as are the names of records that are nobody's: the default user's, the shared
        lineage's."""
        if name in (DEFAULT_USER, SHARED_LINEAGE) or not USER_NAME.fullmatch(name):
            raise UserError(f"{name!r} is no user's name: only a user's records (`clawrl users list`) can be forgotten")
        with self.database.write() as db:
            if db.get(UserRow, name) is None and not owns_anything(db, name):
                raise UserError(f"there is no user called {name!r} and nothing of theirs is stored")
            report = forget_rows(db, name, remove_account)
        report.log_emptied = self.database.scrub()
        return report

    def rotate_key(self, name: str) -> str:
        """A new key for the user; the old one stops working."""
        key = new_key()
        with self.database.write() as db:
            values = {"key_sha256": key_sha256(key), "key_hint": key[:KEY_HINT_CHARS], "key_created_at": time.time()}
            if db.execute(update(UserRow).where(UserRow.id == name).values(**values)).rowcount == 0:
                raise UserError(f"there is no user called {name!r}")
        return key

    def set_opt_outs(self, name: str, store: bool | None = None, train: bool | None = None) -> User:
        """Whether the user's requests are recorded (`store`) and their turns trained on (`train`); None
        leaves a setting as it is. A server follows within a second (`serve/auth.py`); what was
        recorded before stays as it was."""
        values = {key: value for key, value in (("store", store), ("train", train)) if value is not None}
        if values:
            with self.database.write() as db:
                if db.execute(update(UserRow).where(UserRow.id == name).values(**values)).rowcount == 0:
                    raise UserError(f"there is no user called {name!r}")
        return self.get(name)

    def key_owners(self) -> dict[str, User]:
        """Every key's SHA-256 → its user (with their opt-outs): what a server checks requests against
        (`serve/auth.py`)."""
        with self.database.read() as db:
            return {row.key_sha256: records.user(row) for row in db.scalars(select(UserRow))}
