"""Where a test run's time goes: its wall time against the CPU time the whole machine spent.

    .venv/bin/python -m benchmarks.suite_cpu [--every 10] [--files 15] -- bash .ci/run

Runs the command (its output goes to stdout, each line as it comes), reads the machine's CPU time
from /proc/stat every --every seconds, and prints afterwards: for the whole run and for each pytest
part it saw start (`--part check`, `--part rest`), the wall time, the CPU-seconds spent and how busy
that kept the cores; then the --files test files of the rest part with the longest wall time, each
with its CPU-seconds (pytest prints a file's line once its tests are done, so a file's time runs
from the line before; on xdist's workers it prints no such lines: `make test ARGS='-n 0'` for
them). Half the CPU-seconds of a run is the least any scheduling of it can take on 2 cores. The
machine's CPU time counts everything on it: run it with nothing else running.
"""

from __future__ import annotations

import argparse
import bisect
import os
import re
import subprocess
import threading
import time

FILE_LINE = re.compile(r"^(tests/\S+\.py) ")
PART = re.compile(r"pytest --part (check|rest)\b")


def busy_and_total_ticks() -> tuple[int, int]:
    """The machine's CPU time so far, in clock ticks: busy (not idle or waiting on I/O) and in all."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq + steal, sum(fields)


class CpuSamples:
    """(time, busy CPU-seconds) every `every` seconds, from start until stop()."""

    def __init__(self, every: float) -> None:
        self.every, self.times, self.busy = every, [], []
        self.ticks_per_s = os.sysconf("SC_CLK_TCK")
        self.stopped = threading.Event()
        self.sample()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        self.times.append(time.time())
        self.busy.append(busy_and_total_ticks()[0] / self.ticks_per_s)

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            self.sample()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.sample()

    def between(self, start: float, end: float) -> float:
        """CPU-seconds from the last sample at or before start to the last at or before end."""
        first = max(bisect.bisect_right(self.times, start) - 1, 0)
        last = max(bisect.bisect_right(self.times, end) - 1, 0)
        return self.busy[last] - self.busy[first]


def run_timed(command: list[str]) -> tuple[int, list[tuple[float, str]]]:
    """The command's exit status and its output lines, each with the time it came."""
    lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        for line in process.stdout:
            print(line, end="", flush=True)
            lines.append((time.time(), line.rstrip("\n")))
    return process.returncode, lines


def spans(lines: list[tuple[float, str]], start: float, end: float) -> tuple[list, list]:
    """(name, start, end) of the whole run and each pytest part, and of each test file of the rest."""
    starts, files, previous = [], [], None  # previous: the last line that ended a span of the rest part
    for stamp, text in lines:
        part, file = PART.search(text), FILE_LINE.match(text)
        if part:
            starts.append((part.group(1), stamp))
            previous = stamp if part.group(1) == "rest" else None
        elif file and previous is not None:
            files.append((file.group(1), previous, stamp))
            previous = stamp
    ends = [at for _, at in starts[1:]] + [end] * bool(starts)
    parts = [(name, at, until) for (name, at), until in zip(starts, ends, strict=True)]
    return [("whole run", start, end), *parts], files


def line(name: str, wall: float, cpu: float) -> str:
    cores = os.cpu_count() or 1
    return f"{name:<60} wall {wall:7.0f} s  CPU {cpu:7.0f} s  cores {cpu / max(wall, 1e-9) / cores:4.0%} busy"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between CPU samples")
    parser.add_argument("--files", type=int, default=15, help="how many test files to list")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --, e.g. -- bash .ci/run")
    samples = CpuSamples(args.every)
    started = time.time()
    status, lines = run_timed(command)
    ended = time.time()
    samples.stop()
    parts, files = spans(lines, started, ended)
    print(f"\n{' '.join(command)}: exit status {status}, {os.cpu_count()} cores")
    for name, start, end in parts:
        print(line(name, end - start, samples.between(start, end)))
    cores, spent = os.cpu_count() or 1, samples.between(started, ended)
    print(f"the least any scheduling of this work takes on {cores} cores: {spent / cores:.0f} s")
    longest = sorted(files, key=lambda file: file[2] - file[1], reverse=True)[: args.files]
    for name, start, end in longest:
        print(line(f"  {name}", end - start, samples.between(start, end)))
    raise SystemExit(status)


if __name__ == "__main__":
    main()
