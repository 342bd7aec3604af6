"""List PostgreSQL's built-in types and how pgcdc's codec prints their binary values, from a
real server's ``pg_type``.

    .venv/bin/python -m tools.type_coverage [--major 18]

One line per built-in base type (arrays are read through their element type): ``codec`` (the
codec reads the binary send format and prints what the output function prints), ``server``
(its text needs the catalog or is internal: ``pgcdc tail --binary`` asks the server;
``SERVER_RENDERED``), ``text`` (no binary send function: pgoutput sends it as text even in
binary mode), or ``MISSING`` (neither: a new type to cover; the exit code is then 1).
tests/protocol/values/test_builtin_types.py makes the same check on both servers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import psycopg

from pgcdc.cli.throwaway_server import Cluster
from pgcdc.protocol.values.adapt import CONVERTERS, SERVER_RENDERED

QUERY = """
SELECT t.oid::int, t.typname::text, t.typsend <> 0
FROM pg_catalog.pg_type t
WHERE t.oid < 10000 AND t.typtype = 'b'
  AND NOT (t.typsend = 'array_send'::regproc AND t.typname LIKE '\\_%')
ORDER BY t.oid
"""


def coverage(dsn: str) -> list[tuple[int, str, str]]:
    """(oid, name, how) for every built-in base type of the server at ``dsn``."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(QUERY).fetchall()
    out = []
    for oid, name, sends in rows:
        if not sends:
            how = "text"
        elif oid in CONVERTERS:
            how = "codec"
        elif name in SERVER_RENDERED:
            how = "server"
        else:
            how = "MISSING"
        out.append((oid, name, how))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.type_coverage", description=__doc__)
    parser.add_argument("--major", type=int, default=18, help="PostgreSQL major version")
    args = parser.parse_args(argv)
    with Cluster(args.major) as cluster:
        rows = coverage(cluster.dsn())
    for oid, name, how in rows:
        reason = SERVER_RENDERED.get(name, "") if how == "server" else ""
        print(f"{oid:>5}  {name:<30} {how:<8} {reason}".rstrip())
    missing = [name for _, name, how in rows if how == "MISSING"]
    if missing:
        print(f"not covered: {', '.join(missing)}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
