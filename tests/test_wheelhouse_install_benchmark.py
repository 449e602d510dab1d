"""benchmarks/wheelhouse_install.py installs the same wheelhouse with pip and with uv: the same
requirements, offline, both byte-compiling, without this machine's pip settings, alternating."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks import wheelhouse_install


def test_pip_and_uv_install_the_same_requirements_offline():
    python, wheels = Path("/node/venv/bin/python"), Path("/node/wheels")
    shared = wheelhouse_install.requirement_args(wheels)
    pip = wheelhouse_install.pip_install(python, wheels)
    uv = wheelhouse_install.uv_install(python, wheels, uv="/tools/uv")
    assert pip[-len(shared) :] == shared == uv[-len(shared) :]
    assert shared[:3] == ["--no-index", "--find-links", str(wheels)]
    assert uv[:3] == ["/tools/uv", "pip", "install"]
    assert {"--offline", "--no-cache", "--compile-bytecode"} <= set(uv), "no cache and byte-compiled, as pip's"
    assert uv[uv.index("--python") + 1] == str(python)


def test_the_installers_run_without_this_machines_pip_settings(monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("UV_INDEX_URL", "file:///elsewhere")
    env = wheelhouse_install.node_env()
    assert env["PIP_CONFIG_FILE"] == os.devnull
    assert "PIP_FIND_LINKS" not in env and "UV_INDEX_URL" not in env


def test_the_installers_alternate_each_into_a_fresh_environment(monkeypatch, tmp_path):
    calls = []

    def install(installer, wheels, python, venv):
        calls.append((installer, venv))
        return {"install_seconds": float(len(calls))}

    monkeypatch.setattr(wheelhouse_install, "install", install)
    runs = wheelhouse_install.install_rounds({"pip": "P", "uv": "U"}, tmp_path, "python3.11", tmp_path, repeats=2)
    assert [installer for installer, _ in calls] == ["P", "U", "P", "U"]
    assert len({venv for _, venv in calls}) == 4
    assert runs == {"pip": {"install_seconds": [1.0, 3.0]}, "uv": {"install_seconds": [2.0, 4.0]}}
