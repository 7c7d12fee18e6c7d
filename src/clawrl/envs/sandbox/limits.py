"""What a sandbox is given and what it gives back: its limits, a command's result, its error.

``SandboxLimits`` holds for the sandbox as a whole through its cgroup (cgroup.py) where the host
allows one, and per process always (``rlimits``, which spawner.py applies before a command's exec);
the package's docstring says what holds where.
"""

from __future__ import annotations

from dataclasses import dataclass

TIMEOUT_EXIT_CODE = 124  # CommandResult.exit_code of a command killed at its timeout, as coreutils timeout


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandbox: the first group holds for all its processes together (with
    a cgroup; see the package's docstring for what holds without one), the rest per process."""

    memory_mb: int = 1024
    """Memory of the sandbox's processes together (a cgroup's; the kernel kills one past it)."""
    disk_mb: int = 256
    """Size of the tmpfs holding the writable layer, /tmp, /root and /dev/shm (charged to the
    sandbox's memory on top of ``memory_mb``)."""
    processes: int = 64
    """Most processes and threads the sandbox may hold at once (stops fork bombs)."""
    cpus: float = 1.0
    """CPU bandwidth of the sandbox in cores (a cgroup's); a command's CPU time is thus at most
    ``cpus`` times its wall clock."""
    cpu_seconds: int = 10
    """RLIMIT_CPU of each process: it gets SIGXCPU (then SIGKILL) past it."""
    address_space_mb: int | None = None
    """RLIMIT_AS of each process (allocations past it fail); None: ``memory_mb``."""
    file_size_mb: int = 64
    """RLIMIT_FSIZE: largest file a command may write (SIGXFSZ / EFBIG past it)."""
    open_files: int = 1024
    """RLIMIT_NOFILE of each process."""
    command_timeout_s: float = 30.0
    """Wall-clock limit of one command; at it the command's whole process tree is killed."""

    def __post_init__(self) -> None:
        names = ("memory_mb", "disk_mb", "processes", "cpus", "cpu_seconds", "file_size_mb", "open_files", "command_timeout_s")
        for name in names + (("address_space_mb",) if self.address_space_mb is not None else ()):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)!r}")

    @property
    def address_space_bytes(self) -> int:
        return (self.address_space_mb or self.memory_mb) * 1024 * 1024


def rlimits(limits: SandboxLimits) -> dict[str, tuple[int, int]]:
    """The rlimits of every process of a command, by spawner.py's names."""
    mb = 1024 * 1024
    return {
        "cpu": (limits.cpu_seconds, limits.cpu_seconds + 1),
        "as": (limits.address_space_bytes, limits.address_space_bytes),
        "nproc": (limits.processes, limits.processes),
        "fsize": (limits.file_size_mb * mb, limits.file_size_mb * mb),
        "nofile": (limits.open_files, limits.open_files),
        "core": (0, 0),
    }


@dataclass
class CommandResult:
    """What one command did. ``exit_code`` is the exit status as a shell reports it (128+N when
    signal N killed the command) and 124 (as coreutils ``timeout``) when the wall-clock limit
    killed it (``timed_out``)."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool


class SandboxError(Exception):
    """The sandbox cannot start or has stopped working."""
