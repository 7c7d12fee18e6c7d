"""glibc's allocator, told to give back what the long-lived processes no longer use.

A CPU server and its trainer hold one copy of the model between them (`clawrl.model.weights`); what
else they hold is the allocator's. Two of its defaults make that far more than the processes use:

* every thread that allocates gets an arena of its own (up to eight per core), and an arena keeps
  the memory it once held: `clawrl serve` on a 0.6B model kept 2.2 GB in some forty 60 MB arenas of
  short-lived worker threads, as much as the weights (`limit_malloc_arenas`);
* memory freed in the middle of a heap stays with the process until `malloc_trim` returns it: a
  training step's activations, a finished batch's keys and values (`return_freed_memory`).

Elsewhere than glibc both do nothing.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # glibc's mallopt parameter for the most malloc arenas


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def limit_malloc_arenas(count: int = 2) -> None:
    """At most `count` arenas in this process; call it before threads start."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_ARENA_MAX, count)


def return_freed_memory() -> None:
    """Give the free pages of every arena back to the system (after a step, when serving goes idle)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
