"""The libpq transport on its own: connecting past a silent host, commands, status."""

from __future__ import annotations

import socket

from pgcdc.replication.transport import LibpqTransport
from tests.fix_pg import PgDatabase


def test_a_silent_first_host_is_left_for_the_next_one(pg: PgDatabase) -> None:
    """libpq's non-blocking connect leaves connect_timeout to the caller: a first host that
    accepts the connection and then says nothing (a black-holed primary) once kept the
    transport there until its timeout, and the next host was never tried."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes connections; nobody ever answers
        port = silent.getsockname()[1]
        dsn = pg.dsn(host="127.0.0.1,127.0.0.1", port=f"{port},{pg.cluster.port}")
        transport = LibpqTransport(dsn, connect_timeout=2)
        try:
            assert transport.server_version // 10000 == pg.major
            rows = transport.command("IDENTIFY_SYSTEM")
            assert len(rows) == 1 and isinstance(rows[0][1], int)  # timeline, an int4
        finally:
            transport.close()
        assert transport.closed
