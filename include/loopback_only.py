"""Run a command whose listening sockets must stay off the network: in a private network namespace
that holds only the loopback interface (Linux).

TensorFlow's distributed runtime (the gRPC server of every MultiWorkerMirroredStrategy worker)
listens on all interfaces and authenticates no one; TensorFlow's security guidance is never to
expose it to an untrusted network. On EMR the cluster's security groups guard those ports; on
this machine nothing would. A command run through `contained()` starts in a network namespace of
its own where the only interface is `lo` (brought up here): whatever it listens on, on any
address, is reachable from inside that namespace only, and it reaches nothing outside it either.
Its processes keep their user, files, memory and CPU; only the network is private.

    python include/loopback_only.py -- COMMAND [ARG ...]     run COMMAND contained
    python include/loopback_only.py --check                  exit 0 if this machine can contain one

The namespace is created with unshare(2): as root with CLONE_NEWNET alone; otherwise (or where
root may not, as in some containers) together with a user namespace (CLONE_NEWUSER) in which the
caller keeps its own user and group ids, as `unshare --net --map-current-user` does. Where
neither is allowed (a container's seccomp profile, user.max_net_namespaces = 0,
kernel.unprivileged_userns_clone = 0), `unavailable_reason()` says why, and the caller decides.

This file is run as a script by its own path and imports only the standard library, so that it
works wherever the caller's Python does (an Airflow task, the stage runner, the EMR rehearsal),
whatever is on the module path; it must start single-threaded (unshare of a user namespace
requires it), which a fresh interpreter is.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
LOOPBACK_INTERFACE = "lo"
HELPER = Path(__file__).resolve()
CHECK_TIMEOUT_S = 30
PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before any fork: a child calls it before exec


def prefix() -> list[str]:
    """What goes before a command to run it contained. `-I`: the helper imports nothing from the
    environment's module path; the command itself gets the environment unchanged."""
    return [sys.executable, "-I", str(HELPER), "--"]


def contained(argv: list[str]) -> list[str]:
    """`argv` run in a private network namespace holding only loopback (see unavailable_reason)."""
    return prefix() + list(argv)


@functools.cache
def unavailable_reason() -> str | None:
    """None when this machine can run a command contained; otherwise why not, in a few words
    (checked once per process, by creating such a namespace in a short-lived process)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are a Linux feature and this is {sys.platform}"
    try:
        check = subprocess.run(
            [sys.executable, "-I", str(HELPER), "--check"],
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"the namespace check could not run ({error})"
    if check.returncode == 0:
        return None
    return check.stderr.strip().splitlines()[-1] if check.stderr.strip() else f"exit code {check.returncode}"


def _unshare(flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def stop_with_parent(parent_pid: int) -> None:
    """SIGTERM to this process when the thread that started it ends, however it ends (kill -9 of an
    Airflow task): a stage's spark-submit must not keep working in a run folder whose lock its task
    no longer holds. Lasts across exec; ends the process at once if `parent_pid` is already gone."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text)


def enter_private_network() -> None:
    """Move this (single-threaded) process into a new network namespace holding only `lo`, up.
    Raises OSError saying why when the platform does not allow it."""
    uid, gid = os.geteuid(), os.getegid()
    failures = []
    if uid == 0:
        try:
            _unshare(CLONE_NEWNET)
            return _bring_up_loopback()
        except OSError as error:
            failures.append(f"unshare(CLONE_NEWNET) as root: {error.strerror}")
    try:
        _unshare(CLONE_NEWUSER | CLONE_NEWNET)
    except OSError as error:
        failures.append(f"unshare(CLONE_NEWUSER|CLONE_NEWNET): {error.strerror}")
        raise OSError(error.errno, "; ".join(failures)) from None
    # The same user and group inside the user namespace; setgroups must be denied before an
    # unprivileged process may write its gid_map.
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _bring_up_loopback()
    # The capabilities held in the new user namespace end at the command's execve (its user is
    # not root there): the command cannot change the namespace's network.


def _bring_up_loopback() -> None:
    """A new network namespace holds `lo`, down: up, it carries 127.0.0.0/8 (and ::1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as handle:
        request = struct.pack("16sH14x", LOOPBACK_INTERFACE.encode(), 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(handle, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(handle, SIOCSIFFLAGS, struct.pack("16sH14x", LOOPBACK_INTERFACE.encode(), flags | IFF_UP))


def interfaces() -> list[str]:
    return sorted(name for _, name in socket.if_nameindex())


def main(argv: list[str]) -> int:
    check = argv[:1] == ["--check"]
    command = argv[1:] if argv[:1] == ["--"] else []
    if not check and not command:
        print(f"usage: {Path(sys.argv[0]).name} --check | -- COMMAND [ARG ...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    try:
        enter_private_network()
    except OSError as error:
        print(f"no private network namespace: {error.strerror or error}", file=sys.stderr)
        return 1
    others = [name for name in interfaces() if name != LOOPBACK_INTERFACE]
    if others:  # never run a command believed contained where it is not
        print(f"the new network namespace holds other interfaces than lo: {', '.join(others)}", file=sys.stderr)
        return 1
    if check:
        return 0
    stop_with_parent(parent)  # again: a new user namespace changes this process's credentials, which clears it
    try:
        os.execvp(command[0], command)
    except OSError as error:
        print(f"cannot run {command[0]}: {error.strerror}", file=sys.stderr)
        return 127 if error.errno == errno.ENOENT else 126


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
