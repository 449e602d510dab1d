"""The processes below this one (Linux /proc), so that a command can stop everything it started.

Airflow starts processes that start others (the scheduler's executor workers, a task's
spark-submit, its JVM and Python workers), and some outlive their parents when Airflow is
interrupted. Made a child subreaper, this process becomes the parent of every such orphan, so
`descendants()` still finds them.
"""

from __future__ import annotations

import ctypes
import os
import signal
from contextlib import suppress

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Orphans among this process's descendants are re-parented to it instead of to init."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def parents_and_states() -> dict[int, tuple[int, str]]:
    """{pid: (parent pid, state letter)} of every process."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with suppress(OSError):
                with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()  # the name may hold spaces and ')'
                found[int(entry)] = (int(fields[1]), fields[0])
    return found


def descendants(root: int | None = None) -> list[int]:
    """Pids of every live process below `root` (this process), parents first."""
    children: dict[int, list[int]] = {}
    for pid, (parent, state) in parents_and_states().items():
        if state != "Z":
            children.setdefault(parent, []).append(pid)
    found, todo = [], [os.getpid() if root is None else root]
    while todo:
        for child in sorted(children.get(todo.pop(0), [])):
            found.append(child)
            todo.append(child)
    return found


def signal_all(number: int) -> None:
    """Send signal `number` to every process below this one."""
    for pid in descendants():
        with suppress(ProcessLookupError):
            os.kill(pid, number)


def kill_all() -> None:
    signal_all(signal.SIGKILL)


def reap_orphans(keep: int) -> None:
    """Collect the exit status of this process's ended children other than `keep` (which its
    subprocess.Popen collects): orphans adopted as subreaper would otherwise stay zombies."""
    me = os.getpid()
    for pid, (parent, state) in parents_and_states().items():
        if parent == me and state == "Z" and pid != keep:
            with suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
