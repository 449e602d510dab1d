"""The pinned environment (requirements.txt, which the test run's venv was built from)."""

from __future__ import annotations

from importlib import metadata

import pytest
from packaging.specifiers import SpecifierSet


@pytest.mark.parametrize("python", ["3.11.0", "3.11.2"])
def test_every_pinned_package_installs_on_any_python_3_11(python):
    """`make` builds the venv with whatever Python 3.11 the machine has: Debian 12's is 3.11.2."""
    refusing = [
        f"{dist.metadata['Name']}=={dist.version} (Requires-Python {dist.metadata['Requires-Python']})"
        for dist in metadata.distributions()
        if dist.metadata.get("Requires-Python") and not SpecifierSet(dist.metadata["Requires-Python"]).contains(python)
    ]
    assert not refusing, f"not installable on Python {python}: {refusing}"
