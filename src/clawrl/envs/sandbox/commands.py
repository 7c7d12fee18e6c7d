"""Running commands in a sandbox, the runner's side: the client of the sandbox's spawner process,
each command's pipes as asyncio streams, its output kept up to a limit, and the end of a command
(its whole tree killed, its status reaped).

How a command enters the sandbox (nested namespaces, rlimits, the seccomp filter) is spawner.py's,
a process of its own. ``shell_script`` and ``read_to_marker`` frame the commands of a
``ShellSession``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from clawrl.envs.sandbox.limits import SandboxError

OUTPUT_LIMIT = 8 * 1024 * 1024  # bytes kept of each output stream; the rest is read and dropped
KILL_GRACE_S = 5.0  # how long to wait for pipes to close after a kill before giving up on them
_SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Command:
    """A command the spawner started: its pipes as asyncio streams, its exit status (the
    interface of ``asyncio.subprocess.Process`` that this module uses)."""

    def __init__(self, spawner: Spawner, command_id: int, stdin: asyncio.StreamWriter,
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


class Spawner:
    """The client of one sandbox's spawner process (spawner.py; why a process: its docstring)."""

    def __init__(self, process: asyncio.subprocess.Process, channel: socket.socket) -> None:
        self._process = process
        self._channel = channel
        self._ids = itertools.count()
        self._commands: dict[int, Command] = {}
        self._started: dict[int, asyncio.Future[None]] = {}
        asyncio.get_running_loop().add_reader(channel.fileno(), self._receive)

    @classmethod
    async def start(cls) -> Spawner:
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

    async def spawn(self, argv: list[str], cwd: str, env: dict[str, str]) -> Command:
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
        command = Command(self, command_id, await _write_stream(stdin_write), stdout, stderr)
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


class Capture:
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


async def drain(stream: asyncio.StreamReader, capture: Capture) -> None:
    while chunk := await stream.read(65536):
        capture.add(chunk)


async def feed(stream: asyncio.StreamWriter, data: bytes) -> None:
    """Write a command's stdin; a command that does not read it is not an error."""
    try:
        stream.write(data)
        await stream.drain()
        stream.close()
    except (BrokenPipeError, ConnectionResetError):
        pass


async def kill(proc: Command, io: asyncio.Future[Any]) -> int:
    """Kill a command's tree, collect what it wrote until then, and its (signal) status."""
    if proc.returncode is None:
        proc.kill()
    await asyncio.wait({io}, timeout=KILL_GRACE_S)  # a pipe still open after that: give up on it
    io.add_done_callback(_consume)  # an end of stream before the marker is expected here, not an error
    io.cancel()
    return await reap(proc)


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def reap(proc: Command) -> int:
    """The status of a killed process; if the spawner has not reported it within the grace period,
    stop waiting (the sandbox's close kills whatever is left with its pid namespace) and report
    the kill."""
    with contextlib.suppress(asyncio.TimeoutError):
        return await asyncio.wait_for(proc.wait(), KILL_GRACE_S)
    return proc.returncode if proc.returncode is not None else -signal.SIGKILL


def abandon(proc: Command, io: asyncio.Future[Any]) -> None:
    """The caller gave up on a command (cancelled): it must not outlive that."""
    io.add_done_callback(_consume)
    io.cancel()
    if proc.returncode is None:
        proc.kill()


def sandbox_env() -> dict[str, str]:
    return {"PATH": _SANDBOX_PATH, "HOME": "/root", "USER": "root", "LANG": "C.UTF-8", "TERM": "dumb"}


def shell_script(command: str, token: str, marker: str) -> str:
    """The text fed to the shell for one command: a quoted here-document, so any text is safe."""
    delimiter = f"__CLAWRL_CMD_{token}__"
    return (
        f"IFS= read -r -d '' __clawrl_cmd <<'{delimiter}'\n{command}\n{delimiter}\n"
        f'eval "$__clawrl_cmd" </dev/null\n'
        f"printf '\\n{marker}%d\\n' $?\nprintf '\\n{marker}0\\n' >&2\n"
    )


async def read_to_marker(stream: asyncio.StreamReader, marker: bytes, capture: Capture) -> str:
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
