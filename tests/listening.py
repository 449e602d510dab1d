"""The listening TCP sockets of processes (Linux /proc), and this machine's own network addresses,
for the tests of what a local run listens on."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

LISTEN = "0A"
SIOCGIFADDR = 0x8915
IF_INET6 = Path("/proc/net/if_inet6")  # this machine's IPv6 addresses


@dataclass(frozen=True)
class Listening:
    pid: int
    name: str
    address: str
    port: int
    netns: str  # the network namespace the socket is in (/proc/PID/ns/net)

    @property
    def loopback(self) -> bool:
        address = ipaddress.ip_address(self.address)
        mapped = getattr(address, "ipv4_mapped", None)
        return (mapped or address).is_loopback


def _address(hex_address: str) -> str:
    """/proc/net/tcp{,6}'s address: 32-bit words in the host's (little-endian) byte order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[index : index + 4][::-1] for index in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening_sockets(pid: int | None = None) -> list[Listening]:
    """The TCP sockets process `pid` (this one by default) listens on. Read per process: a process
    in another network namespace has its own /proc/PID/net/tcp."""
    pid = os.getpid() if pid is None else pid
    proc = Path(f"/proc/{pid}")
    try:
        inodes = set()
        for fd in (proc / "fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
        name = (proc / "comm").read_text().strip()
        netns = os.readlink(proc / "ns" / "net")
        tables = [(proc / "net" / table).read_text().splitlines()[1:] for table in ("tcp", "tcp6")]
    except OSError:  # the process has ended meanwhile, or is not ours to read
        return []
    found = []
    for rows in tables:
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == LISTEN and inode in inodes:
                address, port = local.rsplit(":", 1)
                found.append(Listening(pid, name, _address(address), int(port, 16), netns))
    return found


def interfaces(pid: int | None = None) -> list[str]:
    """The network interfaces of the namespace process `pid` (this one by default) is in."""
    rows = Path(f"/proc/{os.getpid() if pid is None else pid}/net/dev").read_text().splitlines()[2:]
    return sorted(row.split(":", 1)[0].strip() for row in rows)


def machine_addresses() -> list[str]:
    """This machine's own addresses other than loopback (IPv4, and global IPv6): a port reachable
    through one of them is reachable from the network. Fails on a machine that has none: there, a
    check that nothing answers through them would pass without trying a single connection."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as handle:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):  # an interface without an IPv4 address
                request = struct.pack("256s", name.encode()[:15])
                address = socket.inet_ntoa(fcntl.ioctl(handle, SIOCGIFADDR, request)[20:24])
                if not ipaddress.ip_address(address).is_loopback:
                    found.append(address)
    with contextlib.suppress(OSError):
        for row in IF_INET6.read_text().splitlines():
            hex_address, scope = row.split()[0], row.split()[3]
            address = ipaddress.ip_address(bytes.fromhex(hex_address))
            if scope == "00" and not address.is_loopback:  # global scope (link-local needs an interface)
                found.append(str(address))
    assert found, (
        "this machine has no network address but loopback, so nothing can show that a port stays off the "
        "network: run this test on a machine with a network interface"
    )
    return found


def free_port() -> int:
    """A loopback port no one listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def reachable_from_the_network(port: int, addresses: list[str]) -> list[str]:
    """Those of this machine's own network `addresses` through which `port` accepts a connection.
    Each connection leaves from the address it goes to: one that is no longer this machine's (a
    Docker network removed meanwhile) cannot be bound, so no connection leaves the machine, where
    something else could answer it."""
    answered = []
    for address in addresses:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.settimeout(2)
                probe.bind((address, 0))
                probe.connect((address, port))
                answered.append(address)
        except OSError:
            pass
    return answered


@dataclass
class Watched:
    """What the processes under this one listened on while a piece of work ran."""

    here: str  # this process's network namespace
    addresses: list[str]  # this machine's own addresses, tried against every port
    seen: dict[tuple, Listening] = field(default_factory=dict)  # (pid, address, port) -> the socket
    answered: dict[tuple, list[str]] = field(default_factory=dict)  # the same -> addresses it answered through
    namespaces: dict[str, list[str]] = field(default_factory=dict)  # another namespace -> its interfaces
    commands: dict[int, str] = field(default_factory=dict)  # pid -> command line

    def summary(self) -> list[str]:
        return sorted(
            f"{entry.name}[{entry.pid}] {entry.address}:{entry.port} {entry.netns}" for entry in self.seen.values()
        )

    def assert_loopback_only(self) -> None:
        """In this machine's network namespace on loopback only; in another one, which holds only
        loopback, on any address (TensorFlow's gRPC servers listen on every interface); and nothing
        answers through the machine's own addresses."""
        for key, entry in self.seen.items():
            assert entry.loopback or (entry.netns != self.here and self.namespaces[entry.netns] == ["lo"]), entry
            assert not self.answered[key], f"{entry} answered through {self.answered[key]}"


def watch_listening(work: Callable[[], object], interval_s: float = 0.2) -> Watched:
    """Run `work` in a thread while polling the sockets its child processes listen on; each new
    one is tried through this machine's own addresses. Re-raises what `work` raised."""
    watched = Watched(here=os.readlink("/proc/self/ns/net"), addresses=machine_addresses())
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    while thread.is_alive():
        for process in psutil.Process().children(recursive=True):
            for entry in listening_sockets(process.pid):
                record(watched, process, entry)
        time.sleep(interval_s)
    thread.join()
    if failure:
        raise failure[0]
    return watched


def record(watched: Watched, process: psutil.Process, entry: Listening) -> None:
    key = (entry.pid, entry.address, entry.port)
    if key in watched.seen:
        return
    watched.seen[key] = entry
    with contextlib.suppress(psutil.Error):
        watched.commands.setdefault(entry.pid, " ".join(process.cmdline()))
    watched.answered[key] = reachable_from_the_network(entry.port, watched.addresses)
    if entry.netns != watched.here:
        watched.namespaces.setdefault(entry.netns, interfaces(entry.pid))
