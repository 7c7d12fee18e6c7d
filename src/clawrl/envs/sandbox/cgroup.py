"""A control group per sandbox: memory, process and CPU limits that hold for the whole episode.

rlimits bound one process at a time (four processes under a 1 GB ``RLIMIT_AS`` took 2.5 GB);
a cgroup bounds all of a sandbox's processes together, and the memory it counts includes the
files a sandbox writes to its tmpfs. Both kernel interfaces are spoken:

* **cgroup v2** (one unified tree): a ``clawrl-sandboxes`` group under the runner's own cgroup
  with ``memory``, ``pids`` and ``cpu`` enabled, one child per sandbox. v2 forbids enabling
  controllers in a group that holds processes (other than the root), so this works where the
  runner's cgroup delegates them (the root, a systemd scope with ``Delegate=yes``).
* **cgroup v1** (a tree per controller, as on this project's CI machines): the same layout under
  the runner's own group in each of the ``memory``, ``pids`` and ``cpu`` trees.

Nested under the runner's own group, a sandbox never escapes a limit the runner itself runs
under. Creating groups needs write access to the tree (root, or a delegated subtree); where
there is none, ``create`` raises ``CgroupUnavailable`` with the reason and the sandbox runs with
rlimits alone (the package's docstring says what then holds).

A sandbox's processes join its group from the forked child, before anything runs (``join_fds``:
the child writes ``0``, meaning itself, to each ``cgroup.procs``). Groups are named after the
runner's pid and start time, so that one left behind by a runner killed with SIGKILL (empty: its
processes died with their pid namespace) is removed by the next ``create``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("memory", "pids", "cpu")
BASE_NAME = "clawrl-sandboxes"
_CPU_PERIOD_US = 100_000
_REMOVE_TRIES = 40  # x 50 ms: how long `remove` waits for killed processes to leave the group


class CgroupUnavailable(Exception):
    """No cgroup can be made here; the message says why."""


@dataclass(frozen=True)
class CgroupLimits:
    """What one sandbox may use, all its processes together."""

    memory_bytes: int
    """Resident memory plus tmpfs files plus kernel memory charged to the group."""
    pids: int
    """Processes and threads at once."""
    cpus: float
    """CPU bandwidth in cores (0.5: half of one core's time)."""


@dataclass(frozen=True)
class _Tree:
    version: int
    controllers: tuple[str, ...]
    base: Path  # the clawrl-sandboxes group of this tree


_counter = itertools.count()
_trees_cache: list[list[_Tree] | str] = []


def _runner_tag() -> str:
    """The runner's pid and start time (clock ticks since boot): unique on this boot."""
    return f"{os.getpid()}.{_start_time(os.getpid())}"


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name in parentheses may hold spaces


def _mounts() -> list[tuple[str, Path, set[str]]]:
    """(filesystem type, mount point, super options) of every cgroup mount."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        fstype, options = fields[separator + 1], fields[separator + 3]
        if fstype in ("cgroup", "cgroup2"):
            mounts.append((fstype, Path(fields[4]), set(options.split(","))))
    return mounts


def _own_groups() -> dict[str, str]:
    """The runner's group in each tree: controller list ("" for v2) -> path."""
    groups = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        groups[controllers] = path
    return groups


def _v2_tree(mounts: list[tuple[str, Path, set[str]]], own: dict[str, str]) -> _Tree | str:
    unified = next((point for fstype, point, _ in mounts if fstype == "cgroup2"), None)
    if unified is None or "" not in own:
        return "no cgroup v2 tree"
    parent = unified / own[""].lstrip("/")
    available = set((parent / "cgroup.controllers").read_text().split())
    missing = [name for name in CONTROLLERS if name not in available]
    if missing:
        return f"cgroup v2 at {parent} offers no {', '.join(missing)} controller"
    try:
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        if not set(CONTROLLERS) <= enabled:
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{name}" for name in CONTROLLERS))
        base = parent / BASE_NAME
        base.mkdir(exist_ok=True)
        if not set(CONTROLLERS) <= set((base / "cgroup.subtree_control").read_text().split()):
            (base / "cgroup.subtree_control").write_text(" ".join(f"+{name}" for name in CONTROLLERS))
    except OSError as error:  # EBUSY: the runner's group holds processes; EACCES: not delegated
        return f"cgroup v2 at {parent} cannot delegate {', '.join(CONTROLLERS)} ({error.strerror})"
    return _Tree(2, CONTROLLERS, base)


def _v1_trees(mounts: list[tuple[str, Path, set[str]]], own: dict[str, str]) -> list[_Tree] | str:
    trees, problems = [], []
    for controller in CONTROLLERS:
        point = next((point for fstype, point, options in mounts if fstype == "cgroup" and controller in options), None)
        path = next((path for names, path in own.items() if controller in names.split(",")), None)
        if point is None or path is None:
            problems.append(f"no cgroup v1 {controller} tree")
            continue
        base = point / path.lstrip("/") / BASE_NAME
        try:
            base.mkdir(exist_ok=True)
        except OSError as error:
            problems.append(f"cannot create {base} ({error.strerror})")
            continue
        trees.append(_Tree(1, (controller,), base))
    if not trees:
        return "; ".join(problems)
    return trees


def _trees() -> list[_Tree] | str:
    """Where sandbox groups go here (found once per process), or why nowhere."""
    if not _trees_cache:
        try:
            mounts, own = _mounts(), _own_groups()
        except OSError as error:
            _trees_cache.append(f"cannot read this process's cgroups ({error})")
        else:
            v2 = _v2_tree(mounts, own)
            if isinstance(v2, _Tree):
                _trees_cache.append([v2])
            else:
                v1 = _v1_trees(mounts, own)
                _trees_cache.append(v1 if isinstance(v1, list) else f"{v2}; {v1}")
    return _trees_cache[0]


def _remove_stale(base: Path) -> None:
    """Remove the (empty) groups of runners that are gone; a group still in use refuses rmdir."""
    with contextlib.suppress(OSError):
        for group in base.iterdir():
            pid, _, rest = group.name.partition(".")
            start, _, _ = rest.partition(".")
            if group.is_dir() and pid.isdigit() and _start_time(int(pid)) != start:
                with contextlib.suppress(OSError):
                    group.rmdir()


class SandboxCgroup:
    """One sandbox's group, in the v2 tree or in each v1 tree; see the module docstring."""

    def __init__(self, groups: list[tuple[_Tree, Path]]) -> None:
        self._groups = groups

    @classmethod
    def create(cls, limits: CgroupLimits) -> SandboxCgroup:
        trees = _trees()
        if isinstance(trees, str):
            raise CgroupUnavailable(trees)
        name = f"{_runner_tag()}.{next(_counter)}"
        groups: list[tuple[_Tree, Path]] = []
        try:
            for tree in trees:
                _remove_stale(tree.base)
                group = tree.base / name
                group.mkdir()
                groups.append((tree, group))
                _write_limits(tree, group, limits)
        except OSError as error:
            for _, group in groups:
                with contextlib.suppress(OSError):
                    group.rmdir()
            raise CgroupUnavailable(f"cannot set up a sandbox cgroup: {error}") from None
        return cls(groups)

    @property
    def description(self) -> str:
        version = self._groups[0][0].version
        controllers = sorted(name for tree, _ in self._groups for name in tree.controllers)
        return f"cgroup v{version} ({', '.join(controllers)})"

    @property
    def paths(self) -> list[Path]:
        """The group's directories (one per tree)."""
        return [group for _, group in self._groups]

    def join_fds(self) -> list[int]:
        """Open ``cgroup.procs`` of each group for writing; the caller closes them."""
        return [os.open(group / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) for _, group in self._groups]

    def pids(self) -> set[int]:
        """Host pids of the processes in the group."""
        found: set[int] = set()
        for _, group in self._groups:
            with contextlib.suppress(OSError):
                found |= {int(pid) for pid in (group / "cgroup.procs").read_text().split()}
        return found

    async def remove(self) -> None:
        """Kill whatever is left in the group and remove it (a group that will not empty is left for
        the next runner's ``create`` to remove)."""
        for _ in range(_REMOVE_TRIES):
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            remaining = []
            for tree, group in self._groups:
                try:
                    group.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:  # EBUSY: killed processes not reaped yet
                    remaining.append((tree, group))
            self._groups = remaining
            if not remaining:
                return
            await asyncio.sleep(0.05)


def _write_limits(tree: _Tree, group: Path, limits: CgroupLimits) -> None:
    quota = max(1000, int(limits.cpus * _CPU_PERIOD_US))
    if tree.version == 2:
        (group / "memory.max").write_text(str(limits.memory_bytes))
        if (group / "memory.swap.max").exists():
            (group / "memory.swap.max").write_text("0")
        (group / "pids.max").write_text(str(limits.pids))
        (group / "cpu.max").write_text(f"{quota} {_CPU_PERIOD_US}")
        return
    controller = tree.controllers[0]
    if controller == "memory":
        (group / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
        if (group / "memory.memsw.limit_in_bytes").exists():  # swap too, where swap is accounted
            (group / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_bytes))
    elif controller == "pids":
        (group / "pids.max").write_text(str(limits.pids))
    elif controller == "cpu":
        (group / "cpu.cfs_period_us").write_text(str(_CPU_PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
