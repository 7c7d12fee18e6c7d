"""A sandbox without Docker: fresh Linux namespaces, an overlay over a read-only task image, rlimits.

Design (DESIGN §9, issue 13 item 2):

* **Namespaces.** ``start`` runs ``unshare --user --mount --pid --net --ipc --uts --kill-child``.
  The user namespace is always created, as root too: inside it the sandbox's root (uid 0) is an
  unprivileged outer uid (the caller's own uid, or ``ROOT_OUTER_UID`` = 65534 when the caller is
  root). That is what keeps a sandboxed root harmless: it holds capabilities only inside its own
  namespaces, never over the host's files (their owners are not mapped), and the kernel's
  ``RLIMIT_NPROC`` applies to it (the limit is never enforced for the host's uid 0). Process
  counts are kept per (user namespace, uid), so sandboxes do not share a process budget. The host
  writes the uid/gid maps itself, so no ``newuidmap`` helper is needed. The net namespace has only
  ``lo``, brought up.
* **Filesystem.** The sandbox's init (pid 1, ``_INIT_SCRIPT``) builds a new root on a tmpfs that
  exists only inside its mount namespace: read-only binds of /usr, /bin, /sbin, /lib* (symlinks
  where the host has merged /usr), a generated /etc (passwd, group, hosts, nsswitch.conf; the
  host's ld.so.cache and /etc/alternatives, which hold no secrets), a fresh /proc, a /dev of
  bind-mounted null/zero/full/random/urandom/tty, and ``WORKDIR`` = overlayfs (lower = the image,
  bound read-only; upper = a fresh directory). Upper layer, /tmp, /root and /dev/shm live on a
  second tmpfs of ``disk_mb`` megabytes, so filling the disk stops there. Then ``pivot_root`` and
  a lazy unmount of the old root: the host's tree is not reachable from inside at all.
* **Commands.** Each command enters the sandbox's namespaces from a fork of this process
  (``setns`` in ``preexec_fn``), becomes the sandbox's root, sets its rlimits and runs
  ``unshare --fork --kill-child unshare --pid --mount-proc --fork --kill-child bash -c COMMAND``:
  the inner ``unshare`` gives the command a pid namespace of its own, nested in the sandbox's
  (with its own /proc, so ``ps`` and ``/proc/self`` agree with ``getpid``; a command sees only its
  own processes, and its mounts stay its own). Killing the outer ``unshare`` (what the wall-clock
  timeout does) kills, through the chain of parent-death signals, the command's pid 1, and the
  kernel then kills every process of that namespace, also children that ``setsid`` or ignore
  SIGTERM. Nothing a command starts outlives it; a ``ShellSession`` is one long-lived command of
  that kind. (``unshare`` loses a signal death on the way out, so an outer bash turns it into
  128+N first.)
* **Cleanup without us.** Every process we start carries ``PR_SET_PDEATHSIG(SIGKILL)``; the
  ``unshare`` that owns the namespaces kills the sandbox's pid 1 when it dies (``--kill-child``),
  and pid 1 also exits when its stdin (a pipe from this process) reaches EOF. When pid 1 dies the
  kernel kills the whole pid namespace, and the mount namespace, with every tmpfs and overlay in
  it, goes away with its last process. Nothing is ever written to the host's disk, so a SIGKILL of
  the runner leaves no process, mount or directory behind. (The parent-death signal follows the
  thread that started a process: start sandboxes from a thread that outlives them, as an event
  loop's thread does.)

Limits: ``RLIMIT_NPROC`` counts every process of a sandbox (its init, running commands and shell
sessions, a few in all), so ``processes`` is the sandbox's budget rather than one command's.
When the caller is root, the image is attached through an idmapped mount (Linux >= 5.12 and a
filesystem that supports it), so that the host root's files in it belong to the sandbox's root;
without one, they appear as owned by ``nobody`` and only their mode decides what the sandbox may
do with them. Files of other host users always appear as ``nobody``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import resource
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

WORKDIR = "/workspace"
ROOT_OUTER_UID = 65534  # the outer uid of a sandbox's root when the caller is root (nobody)
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
# idmapped mounts (Linux >= 5.12); these syscall numbers are the same on every architecture
_SYS_OPEN_TREE, _SYS_MOUNT_SETATTR = 428, 442
_AT_FDCWD, _AT_EMPTY_PATH, _OPEN_TREE_CLONE = -100, 0x1000, 1
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_IDMAP = 0x1, 0x00100000


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandbox; the per-command ones are rlimits of every process."""

    cpu_seconds: int = 10
    """RLIMIT_CPU of each process of a command: it gets SIGXCPU (then SIGKILL) past it."""
    memory_mb: int = 1024
    """RLIMIT_AS of each process of a command: allocations past it fail (MemoryError in Python)."""
    processes: int = 64
    """RLIMIT_NPROC: most processes and threads the sandbox may hold at once (stops fork bombs)."""
    file_size_mb: int = 64
    """RLIMIT_FSIZE: largest file a command may write (SIGXFSZ / EFBIG past it)."""
    disk_mb: int = 256
    """Size of the tmpfs holding the writable layer, /tmp, /root and /dev/shm."""
    command_timeout_s: float = 30.0
    """Wall-clock limit of one command; at it the command's whole process tree is killed."""

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "memory_mb", "processes", "file_size_mb", "disk_mb", "command_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)!r}")


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
# the new user namespace across exec): it opens the image (the caller's access rights, before
# anything is mounted over it), says it is in its namespaces, and waits for the host to write the
# uid/gid maps; then it becomes the sandbox's root (setpriv also re-arms the parent-death signal,
# which a change of uid clears) and builds the root in stage two.
_INIT_SCRIPT = r"""
set -eu
if [ -n "$CLAWRL_IMAGE" ] && [ -z "$CLAWRL_IMAGE_MOUNT_FD" ]; then exec 3<"$CLAWRL_IMAGE"; fi
echo unshared
read -r go
[ "$go" = go ] || exit 1
exec setpriv --reuid=0 --regid=0 --keep-groups --pdeathsig=KILL -- /bin/bash -c "$CLAWRL_SETUP"
"""

_SETUP_SCRIPT = r"""
set -eu
R=/tmp  # any directory will do: the tmpfs mounted on it is seen only in this mount namespace
mount -n --make-rprivate /
mount -n -t tmpfs -o size=16m,mode=0755 clawrl-root "$R"
mkdir "$R/.rw"
mount -n -t tmpfs -o "size=${CLAWRL_DISK_MB}m,mode=0755" clawrl-rw "$R/.rw"
mkdir -m 0755 "$R/.rw/upper" "$R/.rw/work" "$R/.rw/lower" "$R/.rw/home"
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
for n in null zero full random urandom tty; do touch "$R/dev/$n"; mount -n --bind "/dev/$n" "$R/dev/$n"; done
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"; ln -s /proc/self/fd/1 "$R/dev/stdout"; ln -s /proc/self/fd/2 "$R/dev/stderr"
mkdir "$R/dev/shm"; mount -n --bind "$R/.rw/shm" "$R/dev/shm"
mount -n --bind "$R/.rw/tmp" "$R/tmp"
mount -n --bind "$R/.rw/home" "$R/root"
if [ -n "$CLAWRL_IMAGE_MOUNT_FD" ]; then
  mount -n --no-canonicalize --move "/proc/self/fd/$CLAWRL_IMAGE_MOUNT_FD" "$R/.rw/lower"
elif [ -n "$CLAWRL_IMAGE" ]; then
  mount -n --no-canonicalize --bind -o ro /proc/self/fd/3 "$R/.rw/lower"
fi
exec 3<&-
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


def _die_with_parent(parent_pid: int) -> None:
    """In a child before exec: get SIGKILL when the process that started us dies."""
    if _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(126)
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os._exit(126)


def _init_preexec() -> Callable[[], None]:
    parent = os.getpid()
    return lambda: _die_with_parent(parent)


def _command_preexec(ns_fds: list[tuple[int, int]], cwd: str, limits: SandboxLimits) -> Callable[[], None]:
    """The forked child enters the sandbox, becomes its root and takes the command's rlimits."""
    parent = os.getpid()
    is_root = os.geteuid() == 0

    def enter() -> None:
        libc = _libc()
        if is_root:
            os.setgroups([])  # the host root's supplementary groups must not come along
        for fd, nstype in ns_fds:
            if libc.setns(fd, nstype) != 0:
                os._exit(125)
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        os.chdir(cwd)
        _set_rlimits(limits)
        _die_with_parent(parent)  # after the uid change, which clears the parent-death signal

    return enter


def _set_rlimits(limits: SandboxLimits) -> None:
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_mb * mb, limits.file_size_mb * mb))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _write_id_maps(pid: int) -> None:
    """Map the sandbox's uid/gid 0 to an unprivileged outer id (see the module docstring)."""
    uid = os.geteuid() or ROOT_OUTER_UID
    gid = os.getegid() if os.geteuid() else ROOT_OUTER_UID
    _write_maps(pid, uid, gid)


def _write_maps(pid: int, uid: int, gid: int) -> None:
    proc = Path(f"/proc/{pid}")
    (proc / "setgroups").write_text("deny")  # required before gid_map when not root; harmless as root
    (proc / "gid_map").write_text(f"0 {gid} 1")
    (proc / "uid_map").write_text(f"0 {uid} 1")


_id_map_userns: list[int] = []  # one user namespace mapping 0 -> ROOT_OUTER_UID, made once
_id_map_lock = threading.Lock()


def _root_id_map() -> int:
    """An fd of a user namespace whose root is ROOT_OUTER_UID, for idmapped mounts."""
    with _id_map_lock:
        if not _id_map_userns:
            holder = subprocess.Popen(
                ["unshare", "--user", "--", "/bin/sh", "-c", "echo; exec cat"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={"PATH": _HOST_PATH},
            )  # fmt: skip
            assert holder.stdin and holder.stdout
            try:
                holder.stdout.readline()
                _write_maps(holder.pid, ROOT_OUTER_UID, ROOT_OUTER_UID)
                _id_map_userns.append(os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC))
            finally:
                holder.stdin.close()
                holder.wait()
        return _id_map_userns[0]


def _idmapped_mount(image: Path) -> int | None:
    """A detached read-only mount of image on which host root's files belong to the sandbox's root.

    Without it, the sandbox's root could not modify an image's root-owned files (their owner is not
    mapped). Needs a kernel and filesystem with idmapped mounts; None where they are missing, and the
    image is bound as it is.
    """
    libc = _libc()
    tree = libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(image), _OPEN_TREE_CLONE | os.O_CLOEXEC)
    if tree < 0:
        return None
    attr = struct.pack("QQQQ", _MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY, 0, 0, _root_id_map())
    if libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, attr, len(attr)) != 0:
        os.close(tree)
        return None
    return tree


class _Capture:
    """Bytes read from a stream, the first OUTPUT_LIMIT of them kept."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = OUTPUT_LIMIT - len(self.data)
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


class Sandbox:
    """One sandbox; see the module docstring. Use ``async with Sandbox(image) as box:``."""

    def __init__(self, image: Path | None = None, limits: SandboxLimits = SandboxLimits()) -> None:
        if image is not None and not Path(image).is_dir():
            raise SandboxError(f"sandbox image {image} is not a directory")
        self.image = Path(image).resolve() if image is not None else None
        self.limits = limits
        self._init: asyncio.subprocess.Process | None = None
        self._ns_fds: list[tuple[int, int]] = []
        self._shells: set[ShellSession] = set()

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Create the namespaces and the root; raises SandboxError with the reason if it fails."""
        if self._init is not None:
            raise SandboxError("sandbox already started")
        tools = _missing_tools()
        if tools:
            raise SandboxError(f"sandbox needs {', '.join(tools)} on PATH")
        try:
            await asyncio.wait_for(self._start_init(), START_TIMEOUT_S)
        except BaseException as error:
            await self.close()
            if isinstance(error, asyncio.TimeoutError):
                raise SandboxError(f"sandbox did not start within {START_TIMEOUT_S:.0f} s") from None
            raise

    async def _start_init(self) -> None:
        image_mount = _idmapped_mount(self.image) if self.image is not None and os.geteuid() == 0 else None
        env = {
            "PATH": _HOST_PATH,
            "LANG": "C",
            "CLAWRL_IMAGE": str(self.image or ""),
            "CLAWRL_IMAGE_MOUNT_FD": "" if image_mount is None else str(image_mount),
            "CLAWRL_DISK_MB": str(self.limits.disk_mb),
            "CLAWRL_SETUP": _SETUP_SCRIPT,
        }
        unshare = shutil.which("unshare", path=_HOST_PATH) or "unshare"
        try:
            self._init = await self._spawn_init(unshare, env, image_mount)
        finally:
            if image_mount is not None:
                os.close(image_mount)
        init = self._init
        assert init.stdin and init.stdout
        await self._expect(b"unshared")
        _write_id_maps(init.pid)
        init.stdin.write(b"go\n")
        await init.stdin.drain()
        await self._expect(b"ready")
        # the unshare process is in every namespace of the sandbox but the pid one, whose
        # children-side handle it holds; /proc of its pid has them all
        for name, nstype in _NAMESPACES:
            self._ns_fds.append((os.open(f"/proc/{init.pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), nstype))

    @staticmethod
    async def _spawn_init(unshare: str, env: dict[str, str], image_mount: int | None) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            unshare, "--user", "--mount", "--pid", "--net", "--ipc", "--uts", "--keep-caps",
            "--kill-child", "--",
            "/bin/bash", "-c", _INIT_SCRIPT,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=env, preexec_fn=_init_preexec(), pass_fds=() if image_mount is None else (image_mount,),
        )  # fmt: skip

    async def _expect(self, line: bytes) -> None:
        assert self._init and self._init.stdout and self._init.stderr
        got = (await self._init.stdout.readline()).strip()
        if got != line:
            await self._init.wait()
            error = (await self._init.stderr.read()).decode(errors="replace").strip()
            raise SandboxError(f"sandbox failed to start: {error or f'exit status {self._init.returncode}'}")

    @property
    def host_root(self) -> Path:
        """The sandbox's root directory as the host reaches it while the sandbox runs: /proc/PID/root
        of the process holding its namespaces. A Unix socket created inside is reachable there,
        where the network namespace keeps every TCP connection from the host out."""
        self._check_running()
        assert self._init is not None
        return Path(f"/proc/{self._init.pid}/root")

    def _check_running(self) -> None:
        if self._init is None or self._init.returncode is not None or not self._ns_fds:
            raise SandboxError("sandbox is not running (call start(), or it has been closed)")

    async def _spawn(self, argv: list[str], cwd: str) -> asyncio.subprocess.Process:
        """Start argv inside the sandbox, in a pid namespace of its own (see the module docstring)."""
        self._check_running()
        if not cwd.startswith("/"):
            raise ValueError(f"cwd must be an absolute path inside the sandbox, got {cwd!r}")
        try:
            return await self._exec_inside(argv, cwd)
        except (OSError, subprocess.SubprocessError) as error:  # e.g. the sandbox died meanwhile
            raise SandboxError(f"cannot run a command in the sandbox: {error}") from error

    async def _exec_inside(self, argv: list[str], cwd: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            "/usr/bin/unshare", "--fork", "--kill-child", "--",
            "/usr/bin/unshare", "--pid", "--mount-proc", "--fork", "--kill-child", "--", *argv,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=_sandbox_env(), preexec_fn=_command_preexec(self._ns_fds, cwd, self.limits),
        )  # fmt: skip

    async def run(
        self, command: str, *, timeout_s: float | None = None, stdin: str | None = None, cwd: str = WORKDIR
    ) -> CommandResult:
        """``bash -c command`` inside the sandbox, killed (its whole tree) after the timeout."""
        timeout = self.limits.command_timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout}")
        # an outer bash reports a signal death as 128+N: the unshare chain cannot pass it on
        proc = await self._spawn(["/bin/bash", "-c", '/bin/bash -c "$1"; exit $?', "bash", command], cwd)
        assert proc.stdin and proc.stdout and proc.stderr
        out, err = _Capture(), _Capture()
        io = asyncio.gather(
            _feed(proc.stdin, (stdin or "").encode()), _drain(proc.stdout, out), _drain(proc.stderr, err)
        )
        try:
            await asyncio.wait_for(asyncio.shield(io), timeout)
        except asyncio.TimeoutError:
            await _kill(proc, io)
            return CommandResult(TIMEOUT_EXIT_CODE, out.text(), err.text(), True)
        except asyncio.CancelledError:
            _abandon(proc, io)
            raise
        return CommandResult(await proc.wait(), out.text(), err.text(), False)

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
        for fd, _ in self._ns_fds:
            os.close(fd)
        self._ns_fds = []
        init, self._init = self._init, None
        if init is not None and init.returncode is None:
            init.kill()  # --kill-child passes it on to pid 1, and the kernel to all the rest
        if init is not None:
            await init.wait()


async def _kill(proc: asyncio.subprocess.Process, io: asyncio.Future[Any]) -> int:
    """Kill a command's tree, collect what it wrote until then, and its (signal) status."""
    if proc.returncode is None:
        proc.kill()
    await asyncio.wait({io}, timeout=_KILL_GRACE_S)  # a pipe still open after that: give up on it
    if io.done():
        io.exception()  # an end of stream before the marker is expected here, not an error
    else:
        io.cancel()
    return await _reap(proc)


async def _reap(proc: asyncio.subprocess.Process) -> int:
    """The status of a killed process. asyncio's ``wait()`` also waits for the process's pipes to
    close, and a process that escaped the parent-death chain would hold them open for ever: after
    the grace period stop waiting (the sandbox's close kills whatever is left with its pid
    namespace) and report the kill."""
    with contextlib.suppress(asyncio.TimeoutError):
        return await asyncio.wait_for(proc.wait(), _KILL_GRACE_S)
    return proc.returncode if proc.returncode is not None else -signal.SIGKILL


def _abandon(proc: asyncio.subprocess.Process, io: asyncio.Future[Any]) -> None:
    """The caller gave up on a command (cancelled): it must not outlive that."""
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
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self._proc = await self._sandbox._spawn(["/bin/bash", "--noprofile", "--norc"], WORKDIR)
        # Answering a first command proves that every unshare of the chain has set its parent-death
        # signal (each does so before it execs the next): a kill before then, as a session closed
        # right after it opened, would leave the shell running, holding its pipes.
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
        try:
            await proc.stdin.drain()
            status, _ = await asyncio.wait_for(asyncio.shield(io), timeout)
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
            return pending[at + len(needle) : end].decode()
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
