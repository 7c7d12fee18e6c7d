"""A sandbox without Docker: fresh Linux namespaces, an overlay over a read-only task image, a
cgroup, rlimits and a system-call filter.

Threat model (DESIGN §9, issue 26; docs/environments.md says the same for users): the code a
command runs is hostile, and RL finds every shortcut. It must not reach the host (files,
terminal, keyring, processes, network), another sandbox, the runner's own machinery, or the
verifier; the limits hold for the whole sandbox, not per process.

* **Two levels of namespaces.** ``start`` runs ``unshare --user --mount --pid --net --ipc --uts``
  as the sandbox's *base*: its pid 1 (``_INIT_SCRIPT``) builds the root and then only waits. The
  base user namespace maps the sandbox's root (uid 0) to an outer uid of its own, leased for the
  sandbox's life from ``OUTER_ID_BASE`` upwards when the runner is root (``_OuterId``), so no
  sandbox can signal another's processes or a host process. A command never runs at the base
  level: the sandbox's *spawner* (spawner.py, a small process started on the host) forks, enters
  the base namespaces and, before anything of the command runs, nests a user namespace, a mount
  namespace and a pid namespace of the command's own inside them, mounts that pid namespace's
  /proc, and nests one more user, mount and cgroup namespace. The command is root only there: it
  holds no capability over the base mount namespace (``nsenter`` into it fails), every mount it
  inherited is locked (it cannot uncover the base /proc under its own), and it sees only its own
  processes.
* **Nothing the runner runs is resolved through the agent's mounts.** All of the above is the
  spawner's own (forked) code, with the id maps written through a descriptor of the host's /proc
  opened before entering; the only thing executed inside is the command itself. (A process of its
  own, not a fork of the runner: forking a runner that holds PyTorch costs 60 MB and 80 ms a
  command.)
* **No terminal, no keyring.** Every command is in a session of its own with no controlling
  terminal; /dev has no tty; ``TIOCSTI``/``TIOCLINUX`` are refused by the seccomp filter
  (seccomp.py), which also refuses keyrings, mounts, namespaces and other kernel surface. The
  sandbox's init and every command join a fresh anonymous session keyring.
* **Filesystem.** The init builds a new root on a tmpfs that exists only in the base mount
  namespace: read-only binds of /usr, /bin, /sbin, /lib* (symlinks where the host has merged
  /usr), a generated /etc, a fresh /proc, a /dev of null/zero/full/random/urandom, and
  ``WORKDIR`` = overlayfs (lower = the image, bound read-only from a descriptor; upper = a fresh
  directory). Upper layer, /tmp, /root, /dev/shm and any ``writable_dirs`` live on a second tmpfs
  of ``disk_mb`` megabytes. Then ``pivot_root`` and a lazy unmount of the old root.
* **Limits per sandbox.** A cgroup per sandbox (cgroup.py: memory = ``memory_mb + disk_mb``,
  ``processes``, ``cpus``) where the host allows it, as root does. Without one (the sandbox logs
  that once and ``confinement`` says it), what still holds per sandbox is ``processes``
  (RLIMIT_NPROC, counted in the base user namespace) and ``disk_mb`` (no mount can add a tmpfs);
  memory is then bounded per process only. Per process, always: ``address_space_mb``,
  ``cpu_seconds``, ``file_size_mb``, ``open_files``, no core dumps; per command: the wall clock.
* **Commands end completely.** Killing the command's outermost process (what the timeout does)
  kills, through parent-death signals, the command's pid 1, and the kernel then kills every
  process of its pid namespace, also children that ``setsid`` or ignore SIGTERM. A
  ``ShellSession`` is one long-lived command of that kind.
* **Cleanup without us.** Every process we start carries ``PR_SET_PDEATHSIG(SIGKILL)``; the
  ``unshare`` that owns the namespaces kills the sandbox's pid 1 when it dies, and pid 1 also
  exits when its stdin (a pipe from this process) reaches EOF. When pid 1 dies the kernel kills
  the whole pid namespace (commands' nested ones too), and the mounts go with their last process.
  Nothing is written to the host's disk but the (empty) cgroup directory, which the next sandbox
  removes if the runner was killed. (The parent-death signal follows the thread that started a
  process: start sandboxes from a thread that outlives them, as an event loop's thread does.)

When the caller is root, the image is attached through an idmapped mount (Linux >= 5.12 and a
filesystem that supports it), so that the host root's files in it belong to the sandbox's root;
without one, they appear as owned by ``nobody`` and only their mode decides what the sandbox may
do with them. Files of other host users always appear as ``nobody``'s. A runner that is not root
can map only its own uid: its sandboxes then share that uid (they still cannot see each other's
processes), and the logs say so once.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import json
import ctypes
import logging
import os
import random
import re
import shlex
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from clawrl.envs import seccomp
from clawrl.envs.cgroup import CgroupLimits, CgroupUnavailable, SandboxCgroup

log = logging.getLogger(__name__)

WORKDIR = "/workspace"
OUTER_ID_BASE = 0x70000000  # the first outer uid/gid a root runner leases to a sandbox's root
OUTER_ID_COUNT = 65536  # how many it may lease at once
OUTPUT_LIMIT = 8 * 1024 * 1024  # bytes kept of each output stream; the rest is read and dropped
START_TIMEOUT_S = 20.0
TIMEOUT_EXIT_CODE = 124  # CommandResult.exit_code of a command killed at its timeout, as coreutils timeout
_KILL_GRACE_S = 5.0  # how long to wait for pipes to close after a kill before giving up on them
_SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_REQUIRED_TOOLS = ("unshare", "setpriv", "mount", "umount", "pivot_root", "ip", "bash")
_NAMESPACES = (  # the order matters: the user namespace first, it grants the rights for the rest
    ("user", 0x10000000),
    ("mnt", 0x00020000),
    ("net", 0x40000000),
    ("ipc", 0x08000000),
    ("uts", 0x04000000),
    ("pid_for_children", 0x20000000),
)
_PR_SET_PDEATHSIG = 1
_KEYCTL_JOIN_SESSION_KEYRING = 1
# idmapped mounts (Linux >= 5.12); these syscall numbers are the same on every architecture
_SYS_OPEN_TREE, _SYS_MOUNT_SETATTR = 428, 442
_AT_FDCWD, _AT_EMPTY_PATH, _OPEN_TREE_CLONE = -100, 0x1000, 1
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_IDMAP = 0x1, 0x00100000
_WRITABLE_DIR = re.compile(r"/[A-Za-z0-9_.-]+")  # a directory at the root, e.g. /tests or /logs


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandbox: the first group holds for all its processes together (with
    a cgroup; see the module docstring for what holds without one), the rest per process."""

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


# pid 1 of a sandbox. Stage one runs as the unmapped caller (``--keep-caps`` keeps its rights in
# the new user namespace across exec): it says it is in its namespaces and waits for the host to
# write the uid/gid maps; then it becomes the sandbox's root (setpriv also re-arms the
# parent-death signal, which a change of uid clears) and builds the root in stage two.
_INIT_SCRIPT = r"""
set -eu
echo unshared
read -r go
[ "$go" = go ] || exit 1
exec setpriv --reuid=0 --regid=0 --keep-groups --pdeathsig=KILL -- /bin/bash -c "$CLAWRL_SETUP"
"""

# The image arrives as a descriptor (CLAWRL_IMAGE_FD, or CLAWRL_IMAGE_MOUNT_FD for an idmapped
# mount): no host path is ever named inside, and both are closed before anything else can run.
_SETUP_SCRIPT = r"""
set -eu
R=/tmp  # any directory will do: the tmpfs mounted on it is seen only in this mount namespace
mount -n --make-rprivate /
mount -n -t tmpfs -o size=16m,mode=0755 clawrl-root "$R"
mkdir "$R/.rw"
mount -n -t tmpfs -o "size=${CLAWRL_DISK_MB}m,mode=0755" clawrl-rw "$R/.rw"
mkdir -m 0755 "$R/.rw/upper" "$R/.rw/work" "$R/.rw/lower" "$R/.rw/home" "$R/.rw/extra"
mkdir -m 1777 "$R/.rw/tmp" "$R/.rw/shm"
for d in usr bin sbin lib lib32 lib64 libx32; do
  if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$R/$d"
  elif [ -d "/$d" ]; then mkdir "$R/$d"; mount -n --bind -o ro "/$d" "$R/$d"; fi
done
mkdir -m 0755 "$R/etc" "$R/dev" "$R/proc" "$R/tmp" "$R/root" "$R/workspace"
printf 'root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$R/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$R/etc/group"
printf '127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost ip6-loopback\n' >"$R/etc/hosts"
printf 'passwd: files\ngroup: files\nhosts: files\n' >"$R/etc/nsswitch.conf"
echo sandbox >"$R/etc/hostname"
: >"$R/etc/resolv.conf"
for f in ld.so.cache ld.so.conf localtime; do if [ -e "/etc/$f" ]; then cp -L "/etc/$f" "$R/etc/$f"; fi; done
if [ -d /etc/alternatives ]; then
  mkdir "$R/etc/alternatives"; mount -n --bind -o ro /etc/alternatives "$R/etc/alternatives"
fi
for n in null zero full random urandom; do touch "$R/dev/$n"; mount -n --bind "/dev/$n" "$R/dev/$n"; done
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"; ln -s /proc/self/fd/1 "$R/dev/stdout"; ln -s /proc/self/fd/2 "$R/dev/stderr"
mkdir "$R/dev/shm"; mount -n --bind "$R/.rw/shm" "$R/dev/shm"
mount -n --bind "$R/.rw/tmp" "$R/tmp"
mount -n --bind "$R/.rw/home" "$R/root"
for d in $CLAWRL_WRITABLE_DIRS; do
  mkdir -m 0755 "$R/.rw/extra$d" "$R$d"; mount -n --bind "$R/.rw/extra$d" "$R$d"
done
if [ -n "$CLAWRL_IMAGE_MOUNT_FD" ]; then
  mount -n --no-canonicalize --move "/proc/self/fd/$CLAWRL_IMAGE_MOUNT_FD" "$R/.rw/lower"
  eval "exec $CLAWRL_IMAGE_MOUNT_FD<&-"
elif [ -n "$CLAWRL_IMAGE_FD" ]; then
  mount -n --no-canonicalize --bind -o ro "/proc/self/fd/$CLAWRL_IMAGE_FD" "$R/.rw/lower"
  eval "exec $CLAWRL_IMAGE_FD<&-"
fi
unset CLAWRL_IMAGE_FD CLAWRL_IMAGE_MOUNT_FD
# userxattr: overlayfs in a user namespace keeps whiteouts and opaque directories in user.*
# xattrs (tmpfs has them from Linux 6.6); without them it still mounts, but deleting a directory
# of the image fails
layers="lowerdir=$R/.rw/lower,upperdir=$R/.rw/upper,workdir=$R/.rw/work"
mount -n -t overlay clawrl-workspace -o "$layers,userxattr" "$R/workspace" 2>/dev/null \
  || mount -n -t overlay clawrl-workspace -o "$layers" "$R/workspace"
mount -n -t proc proc "$R/proc"
cd "$R"
mkdir .old
pivot_root . .old
umount -n -l /.old
rmdir /.old
umount -n -l /.rw  # what was mounted from it stays; the upper directory itself is out of reach
rmdir /.rw
mount -n -o remount,bind,ro /
ip link set lo up
if command -v hostname >/dev/null; then hostname sandbox; fi
echo ready
# pid 1 reaps orphans (bash does that for any child) and ends when the host closes our stdin
while read -r _; do :; done
"""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _die_with_parent(parent_pid: int) -> None:
    """In a child before exec: get SIGKILL when the process that started us dies."""
    if _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(126)
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os._exit(126)


def _join_fresh_keyring() -> None:
    """Leave the runner's session keyring for a new, empty, anonymous one."""
    libc = _libc()
    keyctl = seccomp.syscall_number("keyctl")
    if libc.syscall(keyctl, _KEYCTL_JOIN_SESSION_KEYRING, None, 0, 0, 0) < 0 and ctypes.get_errno() != errno.ENOSYS:
        raise OSError(ctypes.get_errno(), "keyctl(KEYCTL_JOIN_SESSION_KEYRING)")  # ENOSYS: a kernel without keyrings


def _init_preexec(cgroup_fds: list[int]) -> Callable[[], None]:
    """The sandbox's init, before exec: in the sandbox's cgroup, no host groups, a keyring of its own."""
    parent = os.getpid()
    is_root = os.geteuid() == 0

    def enter() -> None:
        for fd in cgroup_fds:
            os.write(fd, b"0")  # 0: the writing process itself; its children follow it
        if is_root:
            os.setgroups([])
        _join_fresh_keyring()
        _die_with_parent(parent)

    return enter


def _rlimits(limits: SandboxLimits) -> dict[str, tuple[int, int]]:
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


class _Command:
    """A command the spawner started: its pipes as asyncio streams, its exit status (the
    interface of ``asyncio.subprocess.Process`` that this module uses)."""

    def __init__(self, spawner: _Spawner, command_id: int, stdin: asyncio.StreamWriter,
                 stdout: asyncio.StreamReader, stderr: asyncio.StreamReader) -> None:  # fmt: skip
        self._spawner = spawner
        self._id = command_id
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode: int | None = None
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def _exit(self, status: int) -> None:
        self.returncode = status
        self.stdin.close()  # nothing reads it any more
        if not self._exited.done():
            self._exited.set_result(status)

    async def wait(self) -> int:
        """The exit status once the command's outermost process has ended (not its pipes)."""
        return await asyncio.shield(self._exited)

    def kill(self) -> None:
        if self.returncode is None:
            self._spawner.kill(self._id)


class _Spawner:
    """The client of one sandbox's spawner process (spawner.py; why a process: its docstring)."""

    def __init__(self, process: asyncio.subprocess.Process, channel: socket.socket) -> None:
        self._process = process
        self._channel = channel
        self._ids = itertools.count()
        self._commands: dict[int, _Command] = {}
        self._started: dict[int, asyncio.Future[None]] = {}
        asyncio.get_running_loop().add_reader(channel.fileno(), self._receive)

    @classmethod
    async def start(cls) -> _Spawner:
        """Start the process; it serves once `configure` has told it which sandbox."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", str(Path(__file__).with_name("spawner.py")), str(os.getpid()), str(theirs.fileno()),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, cwd="/",
                start_new_session=True, pass_fds=[theirs.fileno()],
            )  # fmt: skip
        finally:
            theirs.close()
        return cls(process, ours)

    def configure(self, config: dict[str, Any], fds: list[int]) -> None:
        """The sandbox's configuration and descriptors (spawner.py's ``main`` says which)."""
        socket.send_fds(self._channel, [json.dumps(config).encode()], fds)

    def _receive(self) -> None:
        try:
            data = self._channel.recv(1 << 16)
        except OSError:
            data = b""
        if not data:  # the spawner died: so did every command it held
            self._stop_receiving()
            return
        message = json.loads(data)
        if "started" in message:
            started = self._started.pop(message["started"], None)
            if started is not None and not started.done():
                started.set_result(None)
        elif "exited" in message:
            command = self._commands.pop(message["exited"], None)
            if command is not None:
                command._exit(message["status"])

    def _stop_receiving(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self._channel.fileno())
        for started in self._started.values():
            if not started.done():
                started.set_exception(SandboxError("the sandbox's spawner has stopped"))
        for command in self._commands.values():
            command._exit(-signal.SIGKILL)
        self._started.clear()
        self._commands.clear()

    async def spawn(self, argv: list[str], cwd: str, env: dict[str, str]) -> _Command:
        if self._channel.fileno() < 0 or self._process.returncode is not None:
            raise SandboxError("the sandbox's spawner has stopped")
        loop = asyncio.get_running_loop()
        stdin_read, stdin_write = os.pipe()
        stdout_read, stdout_write = os.pipe()
        stderr_read, stderr_write = os.pipe()
        command_id = next(self._ids)
        # the command is known before it is asked for: a quick one may end before `spawn` returns
        stdout, stdout_pipe = await _read_stream(stdout_read)
        stderr, stderr_pipe = await _read_stream(stderr_read)
        command = _Command(self, command_id, await _write_stream(stdin_write), stdout, stderr)
        self._commands[command_id] = command
        started = self._started[command_id] = loop.create_future()
        try:
            request = json.dumps({"spawn": command_id, "argv": argv, "cwd": cwd, "env": env}).encode()
            socket.send_fds(self._channel, [request], [stdin_read, stdout_write, stderr_write])
        except OSError as error:
            self._commands.pop(command_id, None)
            self._started.pop(command_id, None)
            command.stdin.close()
            stdout_pipe.close()
            stderr_pipe.close()
            raise SandboxError(f"cannot run a command in the sandbox: {error}") from None
        finally:
            for fd in (stdin_read, stdout_write, stderr_write):
                os.close(fd)
        await started
        return command

    def kill(self, command_id: int) -> None:
        with contextlib.suppress(OSError):
            self._channel.send(json.dumps({"kill": command_id}).encode())

    async def close(self) -> None:
        """End the spawner; what it still runs dies with it (parent-death signals down the chain)."""
        self._stop_receiving()
        self._channel.close()
        if self._process.returncode is None:
            self._process.kill()
        await self._process.wait()


async def _read_stream(fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 16)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0))
    return reader, transport


class _WriteProtocol(asyncio.streams.FlowControlMixin):
    """What a StreamWriter needs of its protocol: flow control (``drain``)."""

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


async def _write_stream(fd: int) -> asyncio.StreamWriter:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(_WriteProtocol, os.fdopen(fd, "wb", buffering=0))
    return asyncio.StreamWriter(transport, protocol, None, loop)


def _write_maps(pid: int, uid: int, gid: int) -> None:
    proc = Path(f"/proc/{pid}")
    (proc / "setgroups").write_text("deny")  # required before gid_map when not root; harmless as root
    (proc / "gid_map").write_text(f"0 {gid} 1")
    (proc / "uid_map").write_text(f"0 {uid} 1")


class _OuterId:
    """The host uid (= gid) of one sandbox's root, leased while the sandbox lives.

    A root runner takes a free id from ``OUTER_ID_BASE .. +OUTER_ID_COUNT``; the lease is an
    abstract Unix socket named after the id, so it is shared by every runner on the host (in one
    network namespace) and ends by itself when its holder dies. Any other runner can map only its
    own uid and gid.
    """

    def __init__(self) -> None:
        self._lease: socket.socket | None = None
        if os.geteuid() != 0:
            self.uid, self.gid = os.geteuid(), os.getegid()
            return
        first = random.randrange(OUTER_ID_COUNT)
        for step in range(OUTER_ID_COUNT):
            candidate = OUTER_ID_BASE + (first + step) % OUTER_ID_COUNT
            lease = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            try:
                lease.bind(f"\0clawrl-sandbox-id-{candidate}")
            except OSError:
                lease.close()
                continue
            self._lease, self.uid, self.gid = lease, candidate, candidate
            return
        raise SandboxError(f"all {OUTER_ID_COUNT} sandbox ids from {OUTER_ID_BASE} are in use")

    def release(self) -> None:
        if self._lease is not None:
            self._lease.close()
            self._lease = None


def _userns_mapping(outer_id: int) -> int:
    """An fd of a new user namespace whose root is ``outer_id`` (for an idmapped mount)."""
    holder = subprocess.Popen(
        ["unshare", "--user", "--", "/bin/sh", "-c", "echo; exec cat"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={"PATH": _HOST_PATH}, cwd="/",
    )  # fmt: skip
    assert holder.stdin and holder.stdout
    try:
        holder.stdout.readline()
        _write_maps(holder.pid, outer_id, outer_id)
        return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        holder.stdin.close()
        holder.wait()


def _idmapped_mount(image_fd: int, outer_id: int) -> int | None:
    """A detached read-only mount of the image on which host root's files belong to the sandbox's root.

    Without it, the sandbox's root could not modify an image's root-owned files (their owner is not
    mapped). Needs a kernel and filesystem with idmapped mounts; None where they are missing, and the
    image is bound as it is.
    """
    libc = _libc()
    tree = libc.syscall(_SYS_OPEN_TREE, image_fd, b"", _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_EMPTY_PATH)
    if tree < 0:
        return None
    userns = _userns_mapping(outer_id)
    try:
        attr = struct.pack("QQQQ", _MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY, 0, 0, userns)
        if libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, attr, len(attr)) != 0:
            os.close(tree)
            return None
    finally:
        os.close(userns)
    return tree


class _Capture:
    """Bytes read from a stream, the first `limit` of them kept."""

    def __init__(self, limit: int = OUTPUT_LIMIT) -> None:
        self.data = bytearray()
        self.dropped = 0
        self.limit = limit

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        self.data += chunk[:room]
        self.dropped += max(0, len(chunk) - room)

    def text(self) -> str:
        note = f"\n[clawrl: {self.dropped} more bytes dropped]" if self.dropped else ""
        return self.data.decode("utf-8", errors="replace") + note


async def _drain(stream: asyncio.StreamReader, capture: _Capture) -> None:
    while chunk := await stream.read(65536):
        capture.add(chunk)


async def _feed(stream: asyncio.StreamWriter, data: bytes) -> None:
    """Write a command's stdin; a command that does not read it is not an error."""
    try:
        stream.write(data)
        await stream.drain()
        stream.close()
    except (BrokenPipeError, ConnectionResetError):
        pass


_cgroup_warning_logged: list[bool] = []
_shared_id_warning_logged: list[bool] = []


class Sandbox:
    """One sandbox; see the module docstring. Use ``async with Sandbox(image) as box:``.

    ``writable_dirs`` names directories at the root (``/tests``, ``/logs``) made writable on the
    sandbox's tmpfs, for a verifier that needs them; the rest of the root stays read-only.
    """

    def __init__(
        self, image: Path | None = None, limits: SandboxLimits = SandboxLimits(), writable_dirs: tuple[str, ...] = ()
    ) -> None:
        if image is not None and not Path(image).is_dir():
            raise SandboxError(f"sandbox image {image} is not a directory")
        reserved = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/dev", "/proc", "/tmp", "/root", WORKDIR}
        for directory in writable_dirs:
            if not _WRITABLE_DIR.fullmatch(directory) or directory in reserved or directory in ("/.", "/.."):
                raise SandboxError(f"writable_dirs takes new directories at the root such as /tests, not {directory!r}")
        self.image = Path(image).resolve() if image is not None else None
        self.limits = limits
        self.writable_dirs = tuple(writable_dirs)
        self.confinement = "not started"
        """What bounds the sandbox as a whole: the cgroup used, or why there is none."""
        self._init: asyncio.subprocess.Process | None = None
        self._spawner: _Spawner | None = None
        self._cgroup: SandboxCgroup | None = None
        self._outer_id: _OuterId | None = None
        self._filter = b""
        self._pinned: list[int] = []
        self._shells: set[ShellSession] = set()

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def outer_uid(self) -> int:
        """The host uid the sandbox's root (and every process in it) runs as."""
        self._check_running()
        assert self._outer_id is not None
        return self._outer_id.uid

    @property
    def cgroup_paths(self) -> list[Path]:
        """The directories of the sandbox's cgroup (one per cgroup tree); empty without one."""
        return self._cgroup.paths if self._cgroup is not None else []

    async def start(self) -> None:
        """Create the namespaces and the root; raises SandboxError with the reason if it fails."""
        if self._init is not None:
            raise SandboxError("sandbox already started")
        tools = _missing_tools()
        if tools:
            raise SandboxError(f"sandbox needs {', '.join(tools)} on PATH")
        try:
            self._filter = seccomp.filter_program()
        except ValueError as error:
            raise SandboxError(str(error)) from None
        try:
            await asyncio.wait_for(self._start_init(), START_TIMEOUT_S)
        except BaseException as error:
            await self.close()
            if isinstance(error, asyncio.TimeoutError):
                raise SandboxError(f"sandbox did not start within {START_TIMEOUT_S:.0f} s") from None
            raise

    def _start_cgroup(self) -> None:
        limits = self.limits
        memory = (limits.memory_mb + limits.disk_mb) * 1024 * 1024
        try:
            self._cgroup = SandboxCgroup.create(CgroupLimits(memory, limits.processes, limits.cpus))
        except CgroupUnavailable as error:
            self.confinement = f"no cgroup ({error}): memory is bounded per process only"
            if not _cgroup_warning_logged:
                _cgroup_warning_logged.append(True)
                log.warning("sandboxes run without a cgroup: %s", self.confinement)
            return
        self.confinement = self._cgroup.description

    async def _start_init(self) -> None:
        self._outer_id = _OuterId()
        if os.geteuid() != 0 and not _shared_id_warning_logged:
            _shared_id_warning_logged.append(True)
            log.warning("not root: every sandbox's root is this runner's own uid %d (no outer uid of its own)", os.geteuid())
        self._start_cgroup()
        self._spawner = await _Spawner.start()  # its interpreter starts while the sandbox is built
        image_fd = os.open(self.image, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if self.image else None
        image_mount = None
        if image_fd is not None and os.geteuid() == 0:
            image_mount = await asyncio.to_thread(_idmapped_mount, image_fd, self._outer_id.uid)
        cgroup_fds = self._cgroup.join_fds() if self._cgroup else []
        passed = [fd for fd in (image_fd if image_mount is None else None, image_mount) if fd is not None]
        env = {
            "PATH": _HOST_PATH,
            "LANG": "C",
            "CLAWRL_IMAGE_FD": "" if image_fd is None or image_mount is not None else str(image_fd),
            "CLAWRL_IMAGE_MOUNT_FD": "" if image_mount is None else str(image_mount),
            "CLAWRL_DISK_MB": str(self.limits.disk_mb),
            "CLAWRL_WRITABLE_DIRS": " ".join(self.writable_dirs),
            "CLAWRL_SETUP": _SETUP_SCRIPT,
        }
        unshare = shutil.which("unshare", path=_HOST_PATH) or "unshare"
        try:
            self._init = await asyncio.create_subprocess_exec(
                unshare, "--user", "--mount", "--pid", "--net", "--ipc", "--uts", "--keep-caps",
                "--kill-child", "--",
                "/bin/bash", "-c", _INIT_SCRIPT,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=env, cwd="/", start_new_session=True, preexec_fn=_init_preexec(cgroup_fds), pass_fds=passed,
            )  # fmt: skip
        finally:
            for fd in cgroup_fds + [fd for fd in (image_fd, image_mount) if fd is not None]:
                os.close(fd)
        init = self._init
        assert init.stdin and init.stdout
        await self._expect(b"unshared")
        _write_maps(init.pid, self._outer_id.uid, self._outer_id.gid)
        init.stdin.write(b"go\n")
        await init.stdin.drain()
        await self._expect(b"ready")
        # the unshare process is in every namespace of the sandbox but the pid one, whose
        # children-side handle it holds; /proc of its pid has them all
        namespaces = [(os.open(f"/proc/{init.pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), nstype) for name, nstype in _NAMESPACES]
        # the spawner keeps what it needs to enter the sandbox; the runner keeps none of it
        host_proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        cgroup_fds = self._cgroup.join_fds() if self._cgroup else []
        config = {
            "ns": [nstype for _, nstype in namespaces], "rlimits": _rlimits(self.limits),
            "filter": self._filter.hex(), "keyctl": seccomp.syscall_number("keyctl"),
        }  # fmt: skip
        assert self._spawner is not None
        try:
            self._spawner.configure(config, [fd for fd, _ in namespaces] + [host_proc] + cgroup_fds)
        finally:
            for fd in [fd for fd, _ in namespaces] + [host_proc] + cgroup_fds:
                os.close(fd)

    async def _expect(self, line: bytes) -> None:
        assert self._init and self._init.stdout and self._init.stderr
        got = (await self._init.stdout.readline()).strip()
        if got != line:
            await self._init.wait()
            error = (await self._init.stderr.read()).decode(errors="replace").strip()
            raise SandboxError(f"sandbox failed to start: {error or f'exit status {self._init.returncode}'}")

    def socket_path(self, path: str) -> str:
        """A path by which the host connects to the Unix socket at ``path`` inside the sandbox.

        The socket is pinned now: every component is opened without following a symlink, the
        last must be a socket, and the path returned (``/proc/self/fd/N`` of this process) keeps
        naming that socket while the sandbox runs, whatever is later renamed or linked over it.
        SandboxError if ``path`` is not a socket now.
        """
        self._check_running()
        assert self._init is not None
        parts = path.strip("/").split("/")
        if not path.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise SandboxError(f"socket_path takes an absolute path without . or .., not {path!r}")
        directory = os.open(f"/proc/{self._init.pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts[:-1]:
                inner = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
                os.close(directory)
                directory = inner
            pinned = os.open(parts[-1], os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
        except OSError as error:
            raise SandboxError(f"no socket at {path} in the sandbox: {error.strerror}") from None
        finally:
            os.close(directory)
        if not stat.S_ISSOCK(os.fstat(pinned).st_mode):
            os.close(pinned)
            raise SandboxError(f"{path} in the sandbox is not a socket")
        self._pinned.append(pinned)
        return f"/proc/self/fd/{pinned}"

    def _check_running(self) -> None:
        if self._init is None or self._init.returncode is not None or self._spawner is None:
            raise SandboxError("sandbox is not running (call start(), or it has been closed)")

    async def _spawn(self, argv: list[str], cwd: str) -> _Command:
        """Start argv inside the sandbox, in namespaces of its own (see the module docstring)."""
        self._check_running()
        assert self._spawner is not None
        if not cwd.startswith("/"):
            raise ValueError(f"cwd must be an absolute path inside the sandbox, got {cwd!r}")
        return await self._spawner.spawn(argv, cwd, _sandbox_env())

    async def run(
        self, command: str, *, timeout_s: float | None = None, stdin: str | None = None, cwd: str = WORKDIR
    ) -> CommandResult:
        """``bash -c command`` inside the sandbox, killed (its whole tree) after the timeout."""
        code, out, err, timed_out = await self._run_capturing(command, (stdin or "").encode(), timeout_s, cwd, OUTPUT_LIMIT)
        return CommandResult(code, out.text(), err.text(), timed_out)

    async def _run_capturing(
        self, command: str, stdin: bytes, timeout_s: float | None, cwd: str, output_limit: int
    ) -> tuple[int, _Capture, _Capture, bool]:
        timeout = self.limits.command_timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout}")
        # pid 1 of the command's namespace is this outer bash: the command itself is an ordinary
        # process (signals act on it as usual), and a death by signal N is reported as 128+N
        proc = await self._spawn(["/bin/bash", "-c", '/bin/bash -c "$1"; exit $?', "bash", command], cwd)
        assert proc.stdin and proc.stdout and proc.stderr
        out, err = _Capture(output_limit), _Capture()
        io = asyncio.gather(_feed(proc.stdin, stdin), _drain(proc.stdout, out), _drain(proc.stderr, err))
        try:
            await asyncio.wait_for(asyncio.shield(io), timeout)
        except asyncio.TimeoutError:
            await _kill(proc, io)
            return TIMEOUT_EXIT_CODE, out, err, True
        except asyncio.CancelledError:
            _abandon(proc, io)
            raise
        return await proc.wait(), out, err, False

    async def write_file(self, path: str, content: str) -> None:
        """Write a text file inside the sandbox (parent directories are created)."""
        quoted = shlex.quote(path)
        result = await self.run(f"mkdir -p -- \"$(dirname -- {quoted})\" && cat > {quoted}", stdin=content, cwd="/")
        if result.exit_code != 0:
            raise SandboxError(f"cannot write {path} in the sandbox: {result.stderr.strip()}")

    async def read_file(self, path: str) -> str:
        """A text file inside the sandbox (undecodable bytes replaced)."""
        result = await self.run(f"cat -- {shlex.quote(path)}", cwd="/")
        if result.exit_code != 0:
            raise SandboxError(f"cannot read {path} in the sandbox: {result.stderr.strip()}")
        return result.stdout

    async def export_workspace(self) -> bytes:
        """The sandbox's /workspace as a tar archive (symlinks as links, modes and times kept).

        For a verifier: ``import_workspace`` of it into a fresh sandbox gives the agent's work and
        nothing else of this one. SandboxError when it exceeds ``disk_mb`` or cannot be read.
        """
        # a file on tmpfs takes a page at least, its tar header 512 bytes: the files' size is the bound;
        # --sparse keeps a sparse file (truncate -s 1G) as the little disk it uses
        limit = self.limits.disk_mb * 1024 * 1024 + 1024 * 1024
        code, out, err, timed_out = await self._run_capturing(
            "tar --sparse --ignore-failed-read --numeric-owner -C / -cf - workspace", b"", None, "/", limit
        )
        if timed_out or out.dropped or code not in (0, 1):
            reason = "timed out" if timed_out else f"over {limit} bytes" if out.dropped else err.text().strip()
            raise SandboxError(f"cannot export /workspace: {reason}")
        return bytes(out.data)

    async def import_workspace(self, archive: bytes) -> None:
        """Replace /workspace with an archive of ``export_workspace`` (files owned by the sandbox's root)."""
        command = "find /workspace -mindepth 1 -delete && tar --no-same-owner -C / -xpf - workspace"
        code, _, err, timed_out = await self._run_capturing(command, archive, None, "/", OUTPUT_LIMIT)
        if timed_out or code != 0:
            raise SandboxError(f"cannot import /workspace: {'timed out' if timed_out else err.text().strip()}")

    async def shell(self) -> ShellSession:
        """A persistent bash inside the sandbox."""
        session = ShellSession(self)
        await session.start()
        self._shells.add(session)
        return session

    async def reset(self) -> None:
        """A fresh writable layer over the same image: the sandbox is rebuilt, its processes gone."""
        await self.close()
        await self.start()

    async def close(self) -> None:
        """Kill everything in the sandbox; its mounts go with it. Safe to call twice."""
        for session in list(self._shells):
            await session.close()
        for fd in self._pinned:
            os.close(fd)
        self._pinned = []
        spawner, self._spawner = self._spawner, None
        if spawner is not None:
            await spawner.close()
        init, self._init = self._init, None
        if init is not None and init.returncode is None:
            init.kill()  # --kill-child passes it on to pid 1, and the kernel to all the rest
        if init is not None:
            await init.wait()
        cgroup, self._cgroup = self._cgroup, None
        if cgroup is not None:
            await cgroup.remove()
        outer_id, self._outer_id = self._outer_id, None
        if outer_id is not None:
            outer_id.release()


async def _kill(proc: _Command, io: asyncio.Future[Any]) -> int:
    """Kill a command's tree, collect what it wrote until then, and its (signal) status."""
    if proc.returncode is None:
        proc.kill()
    await asyncio.wait({io}, timeout=_KILL_GRACE_S)  # a pipe still open after that: give up on it
    io.add_done_callback(_consume)  # an end of stream before the marker is expected here, not an error
    io.cancel()
    return await _reap(proc)


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _reap(proc: _Command) -> int:
    """The status of a killed process; if the spawner has not reported it within the grace period,
    stop waiting (the sandbox's close kills whatever is left with its pid namespace) and report
    the kill."""
    with contextlib.suppress(asyncio.TimeoutError):
        return await asyncio.wait_for(proc.wait(), _KILL_GRACE_S)
    return proc.returncode if proc.returncode is not None else -signal.SIGKILL


def _abandon(proc: _Command, io: asyncio.Future[Any]) -> None:
    """The caller gave up on a command (cancelled): it must not outlive that."""
    io.add_done_callback(_consume)
    io.cancel()
    if proc.returncode is None:
        proc.kill()


def _sandbox_env() -> dict[str, str]:
    return {"PATH": _SANDBOX_PATH, "HOME": "/root", "USER": "root", "LANG": "C.UTF-8", "TERM": "dumb"}


class ShellSession:
    """A bash that lives across commands: cwd, variables and functions persist.

    A command runs in the shell itself (``eval``) with stdin from /dev/null. When a command times
    out, the shell is killed with it, and the next command gets a new shell (state lost); the same
    happens after a command that makes the shell exit.
    """

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox
        self._proc: _Command | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self._proc = await self._sandbox._spawn(["/bin/bash", "--noprofile", "--norc"], WORKDIR)
        # a first command proves that the shell runs inside (a sandbox that cannot be entered
        # answers with exit status 125 and the reason)
        ready = await self._run(":", START_TIMEOUT_S)
        if ready.exit_code != 0:
            raise SandboxError(f"the shell did not start: {(ready.stderr or ready.stdout).strip() or ready.exit_code}")

    async def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
        timeout = self._sandbox.limits.command_timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout}")
        async with self._lock:
            if self._proc is None or self._proc.returncode is not None:
                await self.start()
            return await self._run(command, timeout)

    async def _run(self, command: str, timeout: float) -> CommandResult:
        proc = self._proc
        assert proc and proc.stdin and proc.stdout and proc.stderr
        token = uuid.uuid4().hex
        marker = f"__CLAWRL_DONE_{token}__".encode()
        proc.stdin.write(_shell_script(command, token, marker.decode()).encode())
        out, err = _Capture(), _Capture()
        io = asyncio.gather(_read_to_marker(proc.stdout, marker, out), _read_to_marker(proc.stderr, marker, err))
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            # a command that stops the shell reading (and fakes its end) must not hold the next
            # one's write for ever: the write is under the command's deadline too
            await asyncio.wait_for(proc.stdin.drain(), timeout)
            status, _ = await asyncio.wait_for(asyncio.shield(io), max(0.0, deadline - asyncio.get_running_loop().time()))
            return CommandResult(int(status), out.text(), err.text(), False)
        except asyncio.TimeoutError:
            await _kill(proc, io)
            return CommandResult(TIMEOUT_EXIT_CODE, out.text(), err.text(), True)
        except (EOFError, BrokenPipeError, ConnectionResetError):  # the command ended the shell
            with contextlib.suppress(asyncio.TimeoutError):  # let it exit with its own status
                await asyncio.wait_for(proc.wait(), _KILL_GRACE_S)
            returncode = await _kill(proc, io)
            return CommandResult(returncode, out.text(), err.text(), False)
        except asyncio.CancelledError:
            _abandon(proc, io)
            raise

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        self._sandbox._shells.discard(self)
        if proc is not None and proc.returncode is None:
            proc.kill()
        if proc is not None:
            await _reap(proc)


def _shell_script(command: str, token: str, marker: str) -> str:
    """The text fed to the shell for one command: a quoted here-document, so any text is safe."""
    delimiter = f"__CLAWRL_CMD_{token}__"
    return (
        f"IFS= read -r -d '' __clawrl_cmd <<'{delimiter}'\n{command}\n{delimiter}\n"
        f'eval "$__clawrl_cmd" </dev/null\n'
        f"printf '\\n{marker}%d\\n' $?\nprintf '\\n{marker}0\\n' >&2\n"
    )


async def _read_to_marker(stream: asyncio.StreamReader, marker: bytes, capture: _Capture) -> str:
    """Read up to ``\\n<marker><digits>\\n``; what came before goes to capture; returns the digits."""
    pending = bytearray()  # bytes that may still be the start of the marker line
    needle = b"\n" + marker
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            capture.add(bytes(pending))
            raise EOFError("the shell exited")
        pending += chunk
        at = pending.find(needle)
        if at >= 0 and pending.find(b"\n", at + len(needle)) >= 0:
            capture.add(bytes(pending[:at]))
            end = pending.find(b"\n", at + len(needle))
            status = bytes(pending[at + len(needle) : end])
            # the command can read the marker (bash's copy of its stdin) and print it: only what
            # the shell itself prints, an exit status, ends a command normally
            if not re.fullmatch(rb"[0-9]{1,3}", status):
                raise EOFError("the command forged the end of its output")
            return status.decode()
        if at < 0:
            keep = max(0, len(pending) - len(needle))
            capture.add(bytes(pending[:keep]))
            del pending[:keep]


def _missing_tools() -> list[str]:
    return [tool for tool in _REQUIRED_TOOLS if shutil.which(tool, path=_HOST_PATH) is None]


_availability: list[str | None] = []
_availability_lock = threading.Lock()


def sandbox_available() -> str | None:
    """None if a sandbox can start here, else why not (tests skip with it). Tries one, once."""
    with _availability_lock:
        if not _availability:
            _availability.append(_probe())
        return _availability[0]


def _probe() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"sandboxes need Linux namespaces, not {sys.platform}"
    result: list[str | None] = []
    # its own thread and event loop, so that it works from inside a running loop too
    thread = threading.Thread(target=lambda: result.append(asyncio.run(_try_sandbox())))
    thread.start()
    thread.join()
    return result[0] if result else "sandbox probe crashed"


async def _try_sandbox() -> str | None:
    try:
        async with Sandbox() as box:
            done = await box.run("echo ok", timeout_s=10)
    except (SandboxError, OSError) as error:
        return str(error)
    if done.stdout.strip() != "ok":
        return f"a command in the sandbox failed: {done.stderr.strip() or done.exit_code}"
    return None
