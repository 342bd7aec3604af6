"""The data endpoint: executors fetch their partition's pgoutput messages from the driver.

``DataEndpoint`` is a small threaded TCP server running in the driver-side reader process next
to the receiver. An executor's ``read()`` (``fetch_messages``) connects, sends the stream's
secret token and a list of spool byte ranges, and gets the records of those ranges back, sent
straight from the spool files. Executors therefore never need the driver's disk, and only
whoever holds the token (it travels inside the planned partitions) can read.

Wire format, all integers big-endian. Request: ``b"PGCS"``, version byte 1, the 32-byte token,
``u32`` range count, then ``u64 start, u64 end`` per range. Reply: status byte 0 and ``u64``
total length followed by the records (``u32`` length + message, as in the spool), or status 1,
``u32`` length and a UTF-8 error text.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import socket
import socketserver
import struct
import threading
from collections.abc import Generator, Sequence

from pgcdc.spark.errors import EndpointError
from pgcdc.spark.spool import RECORD_HEADER, Spool, SpoolReleasedError

__all__ = ["DataEndpoint", "advertised_host", "fetch_messages"]

log = logging.getLogger("pgcdc.spark")

MAGIC = b"PGCS"
VERSION = 1
TOKEN_BYTES = 32
_HEAD = struct.Struct("!4sB32sI")
_RANGE = struct.Struct("!QQ")
_OK = struct.Struct("!BQ")
_ERR = struct.Struct("!BI")
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")
_MAX_RANGES = 1 << 24
_READ_CHUNK = 4 << 20


def advertised_host(option: str | None = None) -> str:
    """The address executors reach the driver at: the option, ``SPARK_LOCAL_IP``, the address
    of this host's name, or (when that is a loopback address, as Spark does) the address of the
    interface that routes outwards; 127.0.0.1 as the last resort."""
    if option:
        return option
    env = os.environ.get("SPARK_LOCAL_IP")
    if env:
        return env
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        address = "127.0.0.1"
    if not address.startswith("127."):
        return address
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
            outward = str(probe.getsockname()[0])
    except OSError:
        return address
    return outward if outward and not outward.startswith("0.") else address


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed before the request was complete")
        data += chunk
    return bytes(data)


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(self.server.io_timeout)
        try:
            magic, version, token, count = _HEAD.unpack(_recv_exact(sock, _HEAD.size))
            if magic != MAGIC or version != VERSION:
                self._fail(sock, "not a pgcdc data endpoint request (wrong magic or version)")
                return
            if not hmac.compare_digest(token, self.server.token):
                log.warning("data endpoint: refused a request with a wrong token")
                self._fail(sock, "wrong token: this partition belongs to another stream")
                return
            if count > _MAX_RANGES:
                self._fail(sock, f"too many ranges ({count})")
                return
            raw = _recv_exact(sock, count * _RANGE.size)
            ranges = [_RANGE.unpack_from(raw, i * _RANGE.size) for i in range(count)]
            total = sum(end - start for start, end in ranges)
            spool = self.server.spool
            # check every range first, so that an error can still be reported cleanly
            for start, end in ranges:
                if not spool.readable(start, end):
                    self._fail(
                        sock,
                        f"spool range {start}-{end} is not available any more: its batch was "
                        "committed, or the driver-side reader restarted",
                    )
                    return
            sock.sendall(_OK.pack(0, total))
            sent = 0
            for start, end in ranges:
                sent += spool.send_range(sock, start, end)
            self.server.note_served(len(ranges), sent)
        except SpoolReleasedError as exc:
            log.warning("data endpoint: %s", exc)
        except (ConnectionError, TimeoutError, OSError) as exc:
            log.warning("data endpoint: connection from %s ended: %s", self.client_address, exc)

    @staticmethod
    def _fail(sock: socket.socket, text: str) -> None:
        data = text.encode("utf-8")
        with contextlib.suppress(OSError):
            sock.sendall(_ERR.pack(1, len(data)) + data)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], spool: Spool, token: bytes, io_timeout: float):
        self.spool = spool
        self.token = token
        self.io_timeout = io_timeout
        self.requests = 0
        self.bytes_sent = 0
        self._stats_lock = threading.Lock()
        super().__init__(address, _Handler)

    def note_served(self, ranges: int, sent: int) -> None:
        with self._stats_lock:
            self.requests += 1
            self.bytes_sent += sent


class DataEndpoint:
    """Serves spool ranges to executors; see the module doc."""

    def __init__(
        self,
        spool: Spool,
        *,
        bind_host: str = "0.0.0.0",  # executors on other hosts connect
        port: int = 0,
        advertise: str | None = None,
        io_timeout: float = 120.0,
    ) -> None:
        self.token = os.urandom(TOKEN_BYTES)
        self._server = _Server((bind_host, port), spool, self.token, io_timeout)
        self.port = int(self._server.server_address[1])
        self.host = advertised_host(advertise)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="pgcdc-data-endpoint",
            daemon=True,
        )
        self._thread.start()
        log.info(
            "data endpoint listening on %s:%d, advertised as %s:%d",
            bind_host,
            self.port,
            self.host,
            self.port,
        )

    @property
    def requests(self) -> int:
        return self._server.requests

    @property
    def bytes_sent(self) -> int:
        return self._server.bytes_sent

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def fetch_messages(
    host: str,
    port: int,
    token: bytes,
    ranges: Sequence[tuple[int, int]],
    *,
    timeout: float = 120.0,
) -> Generator[bytes, None, None]:
    """The messages of ``ranges``, in order, streamed from a ``DataEndpoint``."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise EndpointError(
            f"cannot reach the pgcdc data endpoint at {host}:{port} from this executor: {exc}",
            "make the driver's address reachable from executors: set the option 'driverHost' "
            "(pgcdc.spark.read_stream uses spark.driver.host), and allow the port through "
            "firewalls (option 'endpointPort')",
        ) from None
    with sock:
        request = [_HEAD.pack(MAGIC, VERSION, token, len(ranges))]
        request += [_RANGE.pack(start, end) for start, end in ranges]
        try:
            sock.sendall(b"".join(request))
            head = _recv_exact(sock, 1)
            if head[0] != 0:
                (length,) = _U32.unpack(_recv_exact(sock, _U32.size))
                text = _recv_exact(sock, length).decode("utf-8", "replace")
                raise EndpointError(
                    f"the pgcdc data endpoint at {host}:{port} refused the partition: {text}",
                    "restart the streaming query; if it keeps happening, report it",
                )
            (total,) = _U64.unpack(_recv_exact(sock, _U64.size))
            remaining = total
            buffer = bytearray()
            need = RECORD_HEADER.size  # bytes the next record needs at least
            unpack = RECORD_HEADER.unpack_from
            header = RECORD_HEADER.size
            while remaining:
                chunk = sock.recv(min(_READ_CHUNK, remaining))
                if not chunk:
                    raise ConnectionError("the data endpoint closed the connection early")
                remaining -= len(chunk)
                buffer += chunk
                size = len(buffer)
                if size < need:
                    continue
                position = 0
                while size - position >= header:
                    (length,) = unpack(buffer, position)
                    stop = position + header + length
                    if stop > size:
                        break
                    yield bytes(buffer[position + header : stop])
                    position = stop
                del buffer[:position]
                need = header + unpack(buffer, 0)[0] if len(buffer) >= header else header
            if buffer:
                raise EndpointError(
                    f"the pgcdc data endpoint at {host}:{port} sent a truncated record",
                    "report this as a pgcdc bug",
                )
        except (OSError, ConnectionError) as exc:
            raise EndpointError(
                f"lost the connection to the pgcdc data endpoint at {host}:{port}: {exc}",
                "the driver-side reader may have stopped; restart the streaming query",
            ) from None
