"""`clawrl memory`: list, add, edit and remove the memory notes a user's prompts carry (`--memory on`, DESIGN §13).

Without `--user` the notes are the run's: those of the records made without a user's key, which a
server with no users keeps. They are the same notes `/v1/me/memory` shows their owner's key.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from clawrl.cli.common import _print_json, _store
from clawrl.cli.flags import add_config_flags
from clawrl.config import ServeConfig, StoreConfig
from clawrl.store.memory import NoteError
from clawrl.store.users import UserError
from clawrl.types import DEFAULT_USER

DEFAULT_LIMIT = ServeConfig.model_fields["memory_notes"].default


def cmd_memory_list(args: argparse.Namespace) -> int:
    store = _store(args)
    if (refused := _unknown_user(store, args.user)) is not None:
        return refused
    notes = store.memory.notes(args.user)
    if args.json:
        from clawrl.serve.memory_api import note_view

        _print_json([note_view(note) for note in notes])
        return 0
    for note in notes:
        state = "active" if note.retired_at is None else "retired"  # retired: the weights follow it, not injected
        print(f"{note.id:>6}  {note.source:<8}  {state:<7}  {note.text}")
    if not notes:
        print(f"{args.user} has no memory notes", file=sys.stderr)
    return 0


def cmd_memory_add(args: argparse.Namespace) -> int:
    store = _store(args)
    if (refused := _unknown_user(store, args.user)) is not None:
        return refused
    try:
        note = store.memory.remember(args.user, args.text, "user", args.memory_notes)
    except NoteError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(note.id)
    print(f"kept note {note.id} for {args.user} (a server with --memory on says it in their next prompts)", file=sys.stderr)
    return 0


def cmd_memory_edit(args: argparse.Namespace) -> int:
    try:
        note = _store(args).memory.edit(args.user, args.id, args.text)
    except NoteError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"note {note.id} of {args.user}'s now reads: {note.text}", file=sys.stderr)
    return 0


def cmd_memory_remove(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        store.memory.remove(args.user, args.id)
    except NoteError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"removed note {args.id} of {args.user}'s: their next prompts no longer carry it", file=sys.stderr)
    return 0


def _unknown_user(store: Any, name: str) -> int | None:
    """1 (with a message) when `name` is neither a user nor the run's default; else None."""
    if name == DEFAULT_USER:
        return None
    try:
        store.users.get(name)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return None


def add_memory_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    memory = commands.add_parser("memory", help="the notes a user's prompts carry with --memory on: list, add, edit, remove")
    memory_commands = memory.add_subparsers(dest="memory_command", required=True)
    listing = memory_commands.add_parser("list", help="a user's notes, oldest first: id, where it came from, active or retired, text")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=cmd_memory_list)
    add = memory_commands.add_parser("add", help="keep a note for a user (their newest)")
    add.add_argument("text", help="the note: what the model should remember about the user")
    add.add_argument("--memory-notes", type=int, default=DEFAULT_LIMIT,
                     help="how many notes the user keeps: past it the oldest go (the server's --memory-notes)")
    add.set_defaults(handler=cmd_memory_add)
    edit = memory_commands.add_parser("edit", help="say one of a user's notes in other words (it keeps its id)")
    edit.add_argument("id", type=int, help="the note's id (`clawrl memory list`)")
    edit.add_argument("text", help="what the note says now")
    edit.set_defaults(handler=cmd_memory_edit)
    remove = memory_commands.add_parser("remove", help="remove one of a user's notes")
    remove.add_argument("id", type=int, help="the note's id (`clawrl memory list`)")
    remove.set_defaults(handler=cmd_memory_remove)
    for action in (listing, add, edit, remove):
        action.add_argument("--user", default=DEFAULT_USER,
                            help=f"whose notes (default: {DEFAULT_USER!r}, the run's, made without a user's key)")
        add_config_flags(action, StoreConfig)
