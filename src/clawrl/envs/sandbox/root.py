"""Building a sandbox: its namespaces, its new root, and the outer uid its root runs as.

``INIT_SCRIPT`` is the sandbox's pid 1 and ``SETUP_SCRIPT`` builds its root (the package's
docstring: "Two levels of namespaces", "Filesystem"). The rest is the host's side of that: what the
init does before its exec (``init_preexec``), the uid/gid maps (``write_maps``), the outer id leased
for the sandbox's life (``OuterId``), and the idmapped mount of the image (``idmapped_mount``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import signal
import socket
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

from clawrl.envs.sandbox.limits import SandboxError
from clawrl.envs.sandbox.seccomp import syscall_number

OUTER_ID_BASE = 0x70000000  # the first outer uid/gid a root runner leases to a sandbox's root
OUTER_ID_COUNT = 65536  # how many it may lease at once
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
NAMESPACES = (  # the order matters: the user namespace first, it grants the rights for the rest
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


# pid 1 of a sandbox. Stage one runs as the unmapped caller (``--keep-caps`` keeps its rights in
# the new user namespace across exec): it says it is in its namespaces and waits for the host to
# write the uid/gid maps; then it becomes the sandbox's root (setpriv also re-arms the
# parent-death signal, which a change of uid clears) and builds the root in stage two.
INIT_SCRIPT = r"""
set -eu
echo unshared
read -r go
[ "$go" = go ] || exit 1
exec setpriv --reuid=0 --regid=0 --keep-groups --pdeathsig=KILL -- /bin/bash -c "$CLAWRL_SETUP"
"""

# The image arrives as a descriptor (CLAWRL_IMAGE_FD, or CLAWRL_IMAGE_MOUNT_FD for an idmapped
# mount): no host path is ever named inside, and both are closed before anything else can run.
SETUP_SCRIPT = r"""
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


def _die_with_parent(parent_pid: int) -> None:
    """In a child before exec: get SIGKILL when the process that started us dies."""
    if _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(126)
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os._exit(126)


def _join_fresh_keyring() -> None:
    """Leave the runner's session keyring for a new, empty, anonymous one."""
    libc = _libc()
    keyctl = syscall_number("keyctl")
    if libc.syscall(keyctl, _KEYCTL_JOIN_SESSION_KEYRING, None, 0, 0, 0) < 0 and ctypes.get_errno() != errno.ENOSYS:
        raise OSError(ctypes.get_errno(), "keyctl(KEYCTL_JOIN_SESSION_KEYRING)")  # ENOSYS: a kernel without keyrings


def init_preexec(cgroup_fds: list[int]) -> Callable[[], None]:
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


def write_maps(pid: int, uid: int, gid: int) -> None:
    proc = Path(f"/proc/{pid}")
    (proc / "setgroups").write_text("deny")  # required before gid_map when not root; harmless as root
    (proc / "gid_map").write_text(f"0 {gid} 1")
    (proc / "uid_map").write_text(f"0 {uid} 1")


class OuterId:
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
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={"PATH": HOST_PATH}, cwd="/",
    )  # fmt: skip
    assert holder.stdin and holder.stdout
    try:
        holder.stdout.readline()
        write_maps(holder.pid, outer_id, outer_id)
        return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        holder.stdin.close()
        holder.wait()


def idmapped_mount(image_fd: int, outer_id: int) -> int | None:
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
