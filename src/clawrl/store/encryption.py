"""Encryption at rest of what people and the model said (DESIGN §12; issue 33, item 5).

With a data key (`--encrypt-key-file` or `CLAWRL_DATA_KEY`), every column that holds conversation
text or token ids is written as `clawrl:enc:<key id>:<base64 of nonce + AES-256-GCM ciphertext>`
and read back in clear, inside the column's type (`EncryptedText`, `EncryptedJSON`), so no query
of the store and nothing above it changes. The column's name is the ciphertext's associated data:
a value moved to another column fails to decrypt instead of reading as something else. The key
id (a hash of the key) travels with each value, so a key ring of several keys reads rows written
under any of them while `clawrl data rotate-key` re-encrypts them under the newest.

The key ring is the engine's: `attach` puts it on the engine's dialect, which SQLAlchemy hands to
every type's processors, so two stores open in one process each use their own keys.

Without a key nothing changes: values are written as before. Blank text stays as it is (it says
nothing, and the index of empty answers, `schema.EMPTY_ANSWER`, reads it in SQL). Plain text that
happens to start with `clawrl:` is written behind `clawrl:txt:` so it never reads as ciphertext.
Reading a ciphertext without its key raises `DataKeyError`: never garbage.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import JSON, Text
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.types import TypeDecorator

ENCRYPTED = "clawrl:enc:"
ESCAPED = "clawrl:txt:"
KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12  # GCM's own size; random per value (2^-32 collision bound far beyond any store's rows)


class DataKeyError(RuntimeError):
    """The data key is missing, wrong or unreadable; the message says which and what to do."""


def new_key() -> str:
    """A fresh random key, as a key file holds it (URL-safe base64 of 32 bytes)."""
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode()


def key_id(secret: bytes) -> str:
    """The id stored beside each value: a hash of the key, which names it without revealing it."""
    return hashlib.sha256(b"clawrl data key\0" + secret).hexdigest()[:16]


def _parse_key(text: str, where: str) -> bytes:
    """One key: 64 hex digits or URL-safe base64 of 32 bytes (what `clawrl data new-key` writes)."""
    text = text.strip()
    try:
        secret = bytes.fromhex(text) if len(text) == 2 * KEY_BYTES else base64.urlsafe_b64decode(text.encode())
    except (ValueError, binascii.Error):
        secret = b""
    if len(secret) != KEY_BYTES:
        raise DataKeyError(f"{where} does not hold a data key (expected 32 bytes as 64 hex digits or base64, "
                           "e.g. what `clawrl data new-key` writes)")
    return secret


class KeyRing:
    """The keys a store reads with; the first one also writes."""

    def __init__(self, secrets: list[bytes]) -> None:
        if not secrets:
            raise DataKeyError("a key ring needs at least one key")
        self.ids = [key_id(secret) for secret in secrets]
        self._ciphers = {key_id(secret): AESGCM(secret) for secret in secrets}

    @classmethod
    def from_text(cls, text: str, where: str) -> KeyRing:
        """Keys one a line (blank lines and `#` comments skipped), the one that writes first."""
        lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
        if not lines:
            raise DataKeyError(f"{where} holds no key")
        return cls([_parse_key(line, where) for line in lines])

    @property
    def current_id(self) -> str:
        return self.ids[0]

    def then(self, older: KeyRing | None) -> KeyRing:
        """This ring's keys first (writing), then `older`'s (reading only): the ring of a rotation."""
        ring = KeyRing.__new__(KeyRing)
        ring.ids = list(dict.fromkeys(self.ids + (older.ids if older else [])))
        ring._ciphers = {**(older._ciphers if older else {}), **self._ciphers}
        return ring

    def encrypt(self, plain: bytes, column: str) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[self.current_id].encrypt(nonce, plain, column.encode())
        return f"{ENCRYPTED}{self.current_id}:{base64.b64encode(nonce + sealed).decode()}"

    def decrypt(self, token: str, column: str) -> bytes:
        wanted, _, body = token[len(ENCRYPTED):].partition(":")
        cipher = self._ciphers.get(wanted)
        if cipher is None:
            raise DataKeyError(f"the store holds {column} encrypted with key id {wanted}, which the key given "
                               f"({', '.join(self.ids)}) is not: give the key it was written with")
        try:
            # a token cut short or not base64 is as altered as one whose tag fails: the same error,
            # never binascii's or AESGCM's own (a traceback in the CLI, a 500 in the API)
            sealed = base64.b64decode(body, validate=True)
            if len(sealed) <= NONCE_BYTES:
                raise InvalidTag
            return cipher.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], column.encode())
        except (InvalidTag, binascii.Error):
            raise DataKeyError(f"a value of {column} under key id {wanted} failed authentication: it was altered "
                               "or moved from another column") from None


def attach(engine: Engine, ring: KeyRing | None) -> None:
    """Make `ring` the keys of every encrypted column read or written through `engine`."""
    engine.dialect._clawrl_key_ring = ring  # type: ignore[attr-defined]


def ring_of(dialect: Dialect) -> KeyRing | None:
    return getattr(dialect, "_clawrl_key_ring", None)


def key_id_of(token: str) -> str:
    """The key id of a stored ciphertext (`is_encrypted` first)."""
    return token[len(ENCRYPTED):].partition(":")[0]


def _open(ring: KeyRing | None, token: str, column: str) -> bytes:
    if ring is None:
        raise DataKeyError(f"the store holds {column} encrypted with key id {key_id_of(token)}, and no key was given: "
                           "give it with --encrypt-key-file or CLAWRL_DATA_KEY")
    return ring.decrypt(token, column)


class EncryptedText(TypeDecorator[str]):
    """A text column that holds what someone said: encrypted when the store has a key."""

    impl = Text
    cache_ok = True

    def __init__(self, column: str) -> None:
        super().__init__()
        self.column = column

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        if value is None or not value.strip():
            return value
        ring = ring_of(dialect)
        if ring is not None:
            return ring.encrypt(value.encode(), self.column)
        return ESCAPED + value if value.startswith("clawrl:") else value

    def process_result_value(self, value: str | None, dialect: Dialect) -> str | None:
        if value is None:
            return None
        if value.startswith(ENCRYPTED):
            return _open(ring_of(dialect), value, self.column).decode()
        return value.removeprefix(ESCAPED)

    @staticmethod
    def stored_key_id(raw: str | None) -> str | None:
        """The key id a stored value (as the database holds it) was encrypted with; None if plain."""
        return key_id_of(raw) if raw is not None and raw.startswith(ENCRYPTED) else None


class EncryptedJSON(TypeDecorator[Any]):
    """A JSON column (messages, token ids, ...) that holds what someone said: with a key, the JSON
    text is encrypted and stored as one JSON string. Plain values of these columns are never bare
    strings (lists, objects, null), so a string is always a ciphertext."""

    impl = JSON
    cache_ok = True

    def __init__(self, column: str) -> None:
        super().__init__()
        self.column = column

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        ring = ring_of(dialect)
        if value is None or ring is None:
            return value
        return ring.encrypt(json.dumps(value, separators=(",", ":")).encode(), self.column)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if isinstance(value, str):
            return json.loads(_open(ring_of(dialect), value, self.column))
        return value

    @staticmethod
    def stored_key_id(raw: str | None) -> str | None:
        """As `EncryptedText.stored_key_id`, for the JSON text the database holds."""
        return key_id_of(raw[1:]) if raw is not None and raw.startswith('"' + ENCRYPTED) else None
