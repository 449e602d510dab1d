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


def test_a_port_is_tried_from_the_address_it_is_tried_through():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert listening.reachable_from_the_network(port, ["127.0.0.1"]) == ["127.0.0.1"]
        assert listening.reachable_from_the_network(listening.free_port(), ["127.0.0.1"]) == []


def test_an_address_no_longer_this_machines_sends_no_connection(monkeypatch):
    """A Docker network removed during the watch: its address would route out of the machine, where
    something else could answer (192.0.2.1 is reserved for documentation, no machine's own)."""
    tried = []
    monkeypatch.setattr(socket.socket, "connect", lambda self, target: tried.append(target))
    assert listening.reachable_from_the_network(4040, ["192.0.2.1"]) == []
    assert tried == []
