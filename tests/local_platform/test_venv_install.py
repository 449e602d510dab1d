"""`make venv`'s installer: uv from the sources pip is configured with, pip when uv fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from local_platform import venv_install
from local_platform.venv_install import install, uv_attempts, uv_pin, uv_source_arguments

ROOT = Path(__file__).resolve().parents[2]


def test_uv_reads_the_package_sources_pip_is_configured_with_the_environment_first():
    pip_config = "\n".join(
        [
            "global.find-links='/opt/wheels'",
            "global.extra-index-url='file:///a/simple file:///b/simple'",
            "global.constraint='/etc/pip/constraints.txt'",
            "global.cert='/etc/ssl/certs/ca.crt'",
            "global.index-url='https://mirror.example/simple'",
            ":env:.index-url='https://other.example/simple'",
            "user.find-links='/home/me/wheels'",
        ]
    )
    assert uv_source_arguments(pip_config) == [
        "--find-links", "/opt/wheels",
        "--extra-index-url", "file:///a/simple",
        "--extra-index-url", "file:///b/simple",
        "--constraint", "/etc/pip/constraints.txt",
        "--index-url", "https://other.example/simple",
    ]  # fmt: skip


def test_uv_tries_its_cache_alone_first_then_the_indexes_compiling_every_module():
    cache_only, online = uv_attempts(Path("/v"), Path("r.txt"), ["--find-links", "/w"])
    assert cache_only[:4] == ["/v/bin/uv", "pip", "install", "--offline"]
    assert "--offline" not in online
    for attempt in (cache_only, online):
        assert "--compile-bytecode" in attempt
        assert attempt[-4:] == ["--find-links", "/w", "-r", "r.txt"]
        assert attempt[attempt.index("--python") + 1] == "/v/bin/python"


def test_uv_is_pinned_in_the_locked_environment():
    assert uv_pin() == next(
        line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("uv==")
    )


def test_a_lock_without_uv_is_named(tmp_path):
    lock = tmp_path / "requirements.txt"
    lock.write_text("six==1.17.0\nuvicorn==0.54.0\n")
    with pytest.raises(SystemExit, match="pins no uv"):
        uv_pin(lock)


def fresh_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    requirements = tmp_path / "requirements.txt"
    # A small package of the lock, so that it installs wherever the lock does.
    requirements.write_text(
        next(line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("six==")) + "\n"
    )
    return venv


def imports_six(venv: Path) -> bool:
    return subprocess.run([str(venv / "bin" / "python"), "-c", "import six"]).returncode == 0


@pytest.mark.pip
def test_uv_installs_the_requirements(tmp_path):
    venv = fresh_venv(tmp_path)
    assert install(venv, tmp_path / "requirements.txt") == "uv"
    assert imports_six(venv)


@pytest.mark.pip
def test_pip_installs_them_when_uv_fails_and_says_why(tmp_path, capsys):
    venv = fresh_venv(tmp_path)

    def uv_broken(command):
        if command[0].endswith("/uv"):
            return subprocess.CompletedProcess(command, 2, "", "error: uv is broken here")
        return venv_install.run(command)

    assert install(venv, tmp_path / "requirements.txt", runner=uv_broken) == "pip"
    assert imports_six(venv)
    said = capsys.readouterr().out
    assert "uv could not install" in said and "uv is broken here" in said
    assert "installing with pip" in said


def test_a_pip_that_fails_too_stops_with_pips_error(tmp_path):
    def everything_fails(command):
        return subprocess.CompletedProcess(command, 1, "", f"{command[0]} failed: no index")

    with pytest.raises(SystemExit, match="(?s)pip could not install .*pip failed: no index"):
        install(tmp_path / "venv", tmp_path / "requirements.txt", runner=everything_fails)
