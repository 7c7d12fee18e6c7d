"""A sandbox without Docker: fresh Linux namespaces, an overlay over a read-only task image, a
cgroup, rlimits and a system-call filter.

Threat model (DESIGN §9, issue 26; docs/environments.md says the same for users): the code a
command runs is hostile, and RL finds every shortcut. It must not reach the host (files,
terminal, keyring, processes, network), another sandbox, the runner's own machinery, or the
verifier; the limits hold for the whole sandbox, not per process.

* **Two levels of namespaces.** ``start`` runs ``unshare --user --mount --pid --net --ipc --uts``
  as the sandbox's *base*: its pid 1 (``root.INIT_SCRIPT``) builds the root and then only waits. The
  base user namespace maps the sandbox's root (uid 0) to an outer uid of its own, leased for the
  sandbox's life from ``OUTER_ID_BASE`` upwards when the runner is root (``root.OuterId``), so no
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

The parts: ``limits.py`` (``SandboxLimits``, ``CommandResult``, ``SandboxError``), ``root.py`` (the
init and the new root, outer ids, the idmapped image), ``commands.py`` (the client of the spawner,
pipes, output, killing), ``spawner.py`` (the process that enters the sandbox for each command),
``cgroup.py`` and ``seccomp.py``. This module is the sandbox itself: ``Sandbox``, ``ShellSession``
and ``sandbox_available``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shlex
import shutil
import stat
import sys
import threading
import uuid
from pathlib import Path

from clawrl.envs.sandbox import seccomp
from clawrl.envs.sandbox.cgroup import CgroupLimits, CgroupUnavailable, SandboxCgroup
from clawrl.envs.sandbox.commands import (
    KILL_GRACE_S,
    OUTPUT_LIMIT,
    Capture,
    Command,
    Spawner,
    abandon,
    drain,
    feed,
    kill,
    read_to_marker,
    reap,
    sandbox_env,
    shell_script,
)
from clawrl.envs.sandbox.limits import TIMEOUT_EXIT_CODE, CommandResult, SandboxError, SandboxLimits, rlimits
from clawrl.envs.sandbox.root import (
    HOST_PATH,
    INIT_SCRIPT,
    NAMESPACES,
    SETUP_SCRIPT,
    OuterId,
    idmapped_mount,
    init_preexec,
    write_maps,
)

__all__ = [
    "OUTPUT_LIMIT", "START_TIMEOUT_S", "TIMEOUT_EXIT_CODE", "WORKDIR", "CommandResult", "Sandbox", "SandboxError",
    "SandboxLimits", "ShellSession", "sandbox_available",
]  # fmt: skip

log = logging.getLogger(__name__)

WORKDIR = "/workspace"
START_TIMEOUT_S = 20.0
_REQUIRED_TOOLS = ("unshare", "setpriv", "mount", "umount", "pivot_root", "ip", "bash")
_WRITABLE_DIR = re.compile(r"/[A-Za-z0-9_.-]+")  # a directory at the root, e.g. /tests or /logs


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
        self._spawner: Spawner | None = None
        self._cgroup: SandboxCgroup | None = None
        self._outer_id: OuterId | None = None
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
        self._outer_id = OuterId()
        if os.geteuid() != 0 and not _shared_id_warning_logged:
            _shared_id_warning_logged.append(True)
            log.warning("not root: every sandbox's root is this runner's own uid %d (no outer uid of its own)", os.geteuid())
        self._start_cgroup()
        self._spawner = await Spawner.start()  # its interpreter starts while the sandbox is built
        image_fd = os.open(self.image, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if self.image else None
        image_mount = None
        if image_fd is not None and os.geteuid() == 0:
            image_mount = await asyncio.to_thread(idmapped_mount, image_fd, self._outer_id.uid)
        cgroup_fds = self._cgroup.join_fds() if self._cgroup else []
        passed = [fd for fd in (image_fd if image_mount is None else None, image_mount) if fd is not None]
        env = {
            "PATH": HOST_PATH,
            "LANG": "C",
            "CLAWRL_IMAGE_FD": "" if image_fd is None or image_mount is not None else str(image_fd),
            "CLAWRL_IMAGE_MOUNT_FD": "" if image_mount is None else str(image_mount),
            "CLAWRL_DISK_MB": str(self.limits.disk_mb),
            "CLAWRL_WRITABLE_DIRS": " ".join(self.writable_dirs),
            "CLAWRL_SETUP": SETUP_SCRIPT,
        }
        unshare = shutil.which("unshare", path=HOST_PATH) or "unshare"
        try:
            self._init = await asyncio.create_subprocess_exec(
                unshare, "--user", "--mount", "--pid", "--net", "--ipc", "--uts", "--keep-caps",
                "--kill-child", "--",
                "/bin/bash", "-c", INIT_SCRIPT,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=env, cwd="/", start_new_session=True, preexec_fn=init_preexec(cgroup_fds), pass_fds=passed,
            )  # fmt: skip
        finally:
            for fd in cgroup_fds + [fd for fd in (image_fd, image_mount) if fd is not None]:
                os.close(fd)
        init = self._init
        assert init.stdin and init.stdout
        await self._expect(b"unshared")
        write_maps(init.pid, self._outer_id.uid, self._outer_id.gid)
        init.stdin.write(b"go\n")
        await init.stdin.drain()
        await self._expect(b"ready")
        # the unshare process is in every namespace of the sandbox but the pid one, whose
        # children-side handle it holds; /proc of its pid has them all
        namespaces = [(os.open(f"/proc/{init.pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), nstype) for name, nstype in NAMESPACES]
        # the spawner keeps what it needs to enter the sandbox; the runner keeps none of it
        host_proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        cgroup_fds = self._cgroup.join_fds() if self._cgroup else []
        config = {
            "ns": [nstype for _, nstype in namespaces], "rlimits": rlimits(self.limits),
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

    async def _spawn(self, argv: list[str], cwd: str) -> Command:
        """Start argv inside the sandbox, in namespaces of its own (see the module docstring)."""
        self._check_running()
        assert self._spawner is not None
        if not cwd.startswith("/"):
            raise ValueError(f"cwd must be an absolute path inside the sandbox, got {cwd!r}")
        return await self._spawner.spawn(argv, cwd, sandbox_env())

    async def run(
        self, command: str, *, timeout_s: float | None = None, stdin: str | None = None, cwd: str = WORKDIR
    ) -> CommandResult:
        """``bash -c command`` inside the sandbox, killed (its whole tree) after the timeout."""
        code, out, err, timed_out = await self._run_capturing(command, (stdin or "").encode(), timeout_s, cwd, OUTPUT_LIMIT)
        return CommandResult(code, out.text(), err.text(), timed_out)

    async def _run_capturing(
        self, command: str, stdin: bytes, timeout_s: float | None, cwd: str, output_limit: int
    ) -> tuple[int, Capture, Capture, bool]:
        timeout = self.limits.command_timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout}")
        # pid 1 of the command's namespace is this outer bash: the command itself is an ordinary
        # process (signals act on it as usual), and a death by signal N is reported as 128+N
        proc = await self._spawn(["/bin/bash", "-c", '/bin/bash -c "$1"; exit $?', "bash", command], cwd)
        assert proc.stdin and proc.stdout and proc.stderr
        out, err = Capture(output_limit), Capture()
        io = asyncio.gather(feed(proc.stdin, stdin), drain(proc.stdout, out), drain(proc.stderr, err))
        try:
            await asyncio.wait_for(asyncio.shield(io), timeout)
        except asyncio.TimeoutError:
            await kill(proc, io)
            return TIMEOUT_EXIT_CODE, out, err, True
        except asyncio.CancelledError:
            abandon(proc, io)
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


class ShellSession:
    """A bash that lives across commands: cwd, variables and functions persist.

    A command runs in the shell itself (``eval``) with stdin from /dev/null. When a command times
    out, the shell is killed with it, and the next command gets a new shell (state lost); the same
    happens after a command that makes the shell exit.
    """

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox
        self._proc: Command | None = None
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
        proc.stdin.write(shell_script(command, token, marker.decode()).encode())
        out, err = Capture(), Capture()
        io = asyncio.gather(read_to_marker(proc.stdout, marker, out), read_to_marker(proc.stderr, marker, err))
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            # a command that stops the shell reading (and fakes its end) must not hold the next
            # one's write for ever: the write is under the command's deadline too
            await asyncio.wait_for(proc.stdin.drain(), timeout)
            status, _ = await asyncio.wait_for(asyncio.shield(io), max(0.0, deadline - asyncio.get_running_loop().time()))
            return CommandResult(int(status), out.text(), err.text(), False)
        except asyncio.TimeoutError:
            await kill(proc, io)
            return CommandResult(TIMEOUT_EXIT_CODE, out.text(), err.text(), True)
        except (EOFError, BrokenPipeError, ConnectionResetError):  # the command ended the shell
            with contextlib.suppress(asyncio.TimeoutError):  # let it exit with its own status
                await asyncio.wait_for(proc.wait(), KILL_GRACE_S)
            returncode = await kill(proc, io)
            return CommandResult(returncode, out.text(), err.text(), False)
        except asyncio.CancelledError:
            abandon(proc, io)
            raise

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        self._sandbox._shells.discard(self)
        if proc is not None and proc.returncode is None:
            proc.kill()
        if proc is not None:
            await reap(proc)


def _missing_tools() -> list[str]:
    return [tool for tool in _REQUIRED_TOOLS if shutil.which(tool, path=HOST_PATH) is None]


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
