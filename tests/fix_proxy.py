"""A TCP proxy on loopback that tests control: cut every connection through it, or refuse new
ones for a while, to simulate network failures between pgcdc and PostgreSQL."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

#: SO_LINGER on, timeout 0: close() sends a reset, like a broken network path
_RESET_ON_CLOSE = b"\x01\x00\x00\x00\x00\x00\x00\x00"


class TcpProxy:
    """Forwards 127.0.0.1:<port> to ``target_port``; ``cut()`` drops every open connection."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self.accepting = True
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self.accepting:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._conns += [client, server]
                self.connections += 1
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> int:
        """Drop every open connection abruptly; returns how many were cut."""
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                s.close()
            except OSError:
                pass
        return len(conns) // 2

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()


@pytest.fixture
def proxy_factory() -> Iterator[type[TcpProxy]]:
    proxies: list[TcpProxy] = []

    class Tracked(TcpProxy):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            proxies.append(self)

    yield Tracked
    for p in proxies:
        p.close()
