"""tests/listening.py's own check: the containment tests connect through this machine's network
addresses, so on a machine that has none they would pass without trying anything."""

from __future__ import annotations

import socket

import pytest

from tests import listening


def test_a_machine_with_loopback_alone_fails_the_tests_that_need_a_network_address(monkeypatch, tmp_path):
    loopback_only = tmp_path / "if_inet6"
    loopback_only.write_text("00000000000000000000000000000001 01 80 10 80       lo\n")
    monkeypatch.setattr(socket, "if_nameindex", lambda: [(1, "lo")])
    monkeypatch.setattr(listening, "IF_INET6", loopback_only)
    with pytest.raises(AssertionError, match="no network address but loopback"):
        listening.machine_addresses()
