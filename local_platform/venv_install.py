"""Installs a requirements file into a new virtual environment: with uv when it can, else with pip.

`make venv` and `make hf-venv` run it with the system's Python 3.11, so it uses the standard
library only. uv (its pin is in requirements.txt) installs in parallel and links from its cache;
it reads the package sources pip is configured with (`pip config list`:
index, extra indexes, find-links, constraints). Its cache alone is tried first (quietly: a
first install has no cache), then the indexes, then pip, each with a line saying why the one before
failed: the environment never depends on uv.

    python3.11 -m local_platform.venv_install VENV REQUIREMENTS
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

LOCK = Path(__file__).resolve().parent.parent / "requirements.txt"

# pip's setting -> uv's flag, for the settings that say where packages come from.
SOURCE_FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def uv_pin(lock: Path = LOCK) -> str:
    """The `uv==X` line of the pinned environment."""
    for line in lock.read_text().splitlines():
        if re.fullmatch(r"uv==\S+", line.strip()):
            return line.strip()
    raise SystemExit(f"{lock} pins no uv (a `uv==X` line); run `make lock`")


def uv_source_arguments(pip_config: str) -> list[str]:
    """uv's flags for the package sources in `pip config list`'s output (`scope.key='value'`).

    pip's own precedence holds: an environment variable (`:env:`) over the config files, and a
    list value (space-separated) gives one flag per item.
    """
    chosen: dict[str, str] = {}
    for line in pip_config.splitlines():
        found = re.fullmatch(r"(?P<scope>[^.]*)\.(?P<key>[\w-]+)='(?P<value>.*)'", line.strip())
        if not found or found["key"] not in SOURCE_FLAGS:
            continue
        if found["scope"] == ":env:" or found["key"] not in chosen:
            chosen[found["key"]] = found["value"]
    arguments = []
    for key, value in chosen.items():
        for item in value.split():
            arguments += [SOURCE_FLAGS[key], item]
    return arguments


def uv_attempts(venv: Path, requirements: Path, sources: list[str]) -> list[list[str]]:
    """uv's installs to try in order: from its cache alone, then from the indexes."""
    install = [
        str(venv / "bin" / "uv"),
        "pip",
        "install",
        "--quiet",
        "--python",
        str(venv / "bin" / "python"),
        # pip's way: each pinned version from whichever source has it, not only the first.
        "--index-strategy",
        "unsafe-best-match",
        # Every module compiled here, once (about 20 s on 2 cores): where PYTHONDONTWRITEBYTECODE is
        # set, as in many containers and CI jobs, Python would otherwise compile what it imports anew
        # in every process (`import tensorflow`: 9 s instead of 3).
        "--compile-bytecode",
        *sources,
        "-r",
        str(requirements),
    ]
    return [install[:3] + ["--offline"] + install[3:], install]


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True)


def last_line(result: subprocess.CompletedProcess) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {result.returncode}"


def install(venv: Path, requirements: Path, runner=run) -> str:
    """Installs `requirements` into `venv`; returns the installer that did it ("uv" or "pip")."""
    pip = [str(venv / "bin" / "pip"), "--disable-pip-version-check"]
    got_uv = runner(pip + ["install", "--quiet", uv_pin()])
    if got_uv.returncode == 0:
        sources = uv_source_arguments(runner(pip + ["config", "list"]).stdout)
        for attempt in uv_attempts(venv, requirements, sources):
            tried = runner(attempt)
            if tried.returncode == 0:
                return "uv"
            if "--offline" not in attempt:
                print(f"uv could not install {requirements}: {last_line(tried)}", flush=True)
    else:
        print(f"uv is not installable: {last_line(got_uv)}", flush=True)
    print("installing with pip", flush=True)
    with_pip = runner(pip + ["install", "--quiet", "-r", str(requirements)])
    if with_pip.returncode != 0:
        raise SystemExit(f"pip could not install {requirements}:\n{with_pip.stderr or with_pip.stdout}")
    return "pip"


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    install(Path(argv[0]), Path(argv[1]))


if __name__ == "__main__":
    main(sys.argv[1:])
