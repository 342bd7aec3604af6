"""The throwaway-server harness (pgcdc.cli.throwaway_server): the ports its servers listen on."""

from __future__ import annotations

import socket

from pgcdc.cli.throwaway_server import _ephemeral_ports, free_port


def test_servers_listen_outside_the_ephemeral_range() -> None:
    # A server on an ephemeral port, while stopped, can be "reached" by a client the kernel gave
    # that same port: the client connects to itself and reads its own startup packet back (CI saw
    # "server closed the connection unexpectedly" instead of "Connection refused" that way).
    low, high = _ephemeral_ports()
    ports = {free_port() for _ in range(50)}
    assert all(not low <= port <= high for port in ports), (low, high, sorted(ports))
    assert len(ports) > 1  # chosen at random, so parallel harnesses rarely collide
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # and free
