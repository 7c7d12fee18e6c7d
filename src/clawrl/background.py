"""Serving first: the trainer and the standalone judge step back from the CPU.

On a machine that serves and trains at once, the two compete for the same cores. A person is
waiting on every served token; a training step or a verdict that lands a few milliseconds later
costs nothing. So the background processes lower their own CPU priority (the kernel's scheduler
then gives serving the core whenever both want it), pin themselves to their own cores where the
machine has more than one, and size torch's thread pool, and numpy's BLAS pool beside it, to those
cores so that they never run more busy threads than they have cores. The BLAS pool matters as much
as torch's: OpenBLAS starts one spinning thread per core of the machine when numpy is imported, and
once they are all pinned to one core they wait on each other; the judge's classifier (numpy
matrix products) took 17 s instead of 1.2 s to build that way.

Each process applies this to itself, first thing, to every thread it already has (a thread made
later inherits it): `clawrl serve` starts the trainer as `clawrl train`, which calls
`step_back(...)` before it loads anything.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from threadpoolctl import threadpool_limits

from clawrl.config import BackgroundConfig, parse_cpu_list

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Posture:
    """What a background process runs with: its nice value, its CPUs and its torch threads."""

    nice: int
    cpus: tuple[int, ...]
    threads: int


def choose_cpus(setting: str, available: set[int]) -> set[int]:
    """The CPUs `--background-cpus` gives the background processes, out of those this process may use."""
    if setting == "all":
        return set(available)
    if setting == "auto":
        ordered = sorted(available)
        return set(ordered[len(ordered) // 2 :])  # the upper half; all of them when there is one
    return parse_cpu_list(setting) & available  # not empty: `BackgroundConfig` refuses a list without a usable CPU


def choose_threads(config: BackgroundConfig, cpu_threads: int | None, cpus: set[int], available: set[int]) -> int:
    """torch threads: as configured, else one per CPU of their own, else half of a machine they share with serving."""
    if config.background_threads:
        return config.background_threads
    if cpu_threads:
        return cpu_threads
    return len(cpus) if cpus != available else max(1, len(cpus) // 2)


def step_back(config: BackgroundConfig, cpu_threads: int | None = None) -> Posture:
    """Lower this process's CPU priority, pin it and size its torch threads; return what it now runs with."""
    available = os.sched_getaffinity(0)
    cpus = choose_cpus(config.background_cpus, available)
    for thread_id in _thread_ids():
        os.setpriority(os.PRIO_PROCESS, thread_id, min(19, os.getpriority(os.PRIO_PROCESS, thread_id) + config.background_nice))
        os.sched_setaffinity(thread_id, cpus)
    threads = choose_threads(config, cpu_threads, cpus, available)
    torch.set_num_threads(threads)
    threadpool_limits(limits=threads, user_api="blas")  # for the whole process, from now on
    posture = Posture(os.getpriority(os.PRIO_PROCESS, 0), tuple(sorted(cpus)), threads)
    log.info("running behind serving: nice %d, CPUs %s, %d torch thread(s)", posture.nice, _cpu_list(cpus), threads)
    return posture


def _thread_ids() -> list[int]:
    # Linux keeps priority and affinity per thread: every existing one is set, new ones inherit
    return [int(name) for name in os.listdir("/proc/self/task")]


def _cpu_list(cpus: set[int]) -> str:
    return ",".join(map(str, sorted(cpus)))
