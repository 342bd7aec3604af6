"""``pgcdc resync``: copy tables of a pipeline anew, the others untouched.

For a table whose DDL the lake could not follow (parked: ``pgcdc status`` says why), or any
table whose lake tables should be rebuilt from the source. The copy is the one a table added
to the pipeline gets: its Delta tables (mirror, history, changelog) are removed and copied
again in a temporary slot's snapshot at X, and the stream applies its changes committed at X
or later, with no gap and no duplicate.

The command only asks (a small file per table under the lake's ``_pgcdc/resync/``; it holds
no lock and needs no Spark): a running ``pgcdc run`` picks the request up within seconds,
stops its stream between two batches, copies the tables and streams on; without one, the next
``pgcdc run`` does it before it streams. While the copy runs the other tables wait, and the
table's lake tables are missing: readers see no rows of it until the copy lands.

Exit codes: 0 asked; 2 a bad configuration, a lake without a pipeline, or a table the
configuration does not mirror.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

NAME = "resync"


def register(sub: Any) -> tuple[str, Callable[[argparse.Namespace], int]]:
    p = sub.add_parser(
        NAME,
        help="copy tables of a pipeline anew (a parked table, say), the others untouched",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, type=Path, help="the pipeline.toml file")
    p.add_argument("tables", nargs="+", metavar="TABLE", help="schema.table, as status names it")
    return NAME, run


def run(args: argparse.Namespace) -> int:
    from pgcdc.errors import PgcdcError
    from pgcdc.lake.config import ConfigError, load_config
    from pgcdc.lake.run.catalog import plan_source
    from pgcdc.lake.store.state import load_state, request_resync
    from pgcdc.lake.store.tables import LakeLayout
    from pgcdc.replication import scrub_secrets

    console = Console(stderr=True)

    def say(text: str, style: str | None = None) -> None:
        console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)

    try:
        config = load_config(args.config)
        layout = LakeLayout(config.lake.location())
        state = load_state(layout)
        if state is None:
            say(
                f"pgcdc resync: the lake {layout.root} has no pipeline yet: pgcdc run copies "
                "every table on its first start",
                "red",
            )
            return 2
        dsn = config.source.resolved_dsn()
        plan = plan_source(dsn, config, managed=state.publication_created)
    except ConfigError as exc:
        say(str(exc), "red")
        return 2
    except PgcdcError as exc:
        say(f"pgcdc resync: {scrub_secrets(str(exc))}", "red")
        return 1
    planned = {t.table_id for t in plan.tables}
    unknown = [t for t in args.tables if t not in planned]
    if unknown:
        say(
            f"pgcdc resync: {', '.join(unknown)}: not among the pipeline's tables "
            f"({', '.join(sorted(planned))}); name them as schema.table, as pgcdc status does",
            "red",
        )
        return 2
    request_resync(layout, args.tables)
    parked = state.parked()
    for table_id in args.tables:
        why = f" (parked: {parked[table_id].reason})" if table_id in parked else ""
        say(f"asked to copy {table_id} anew{why}")
    say(
        "a running pgcdc run copies them within seconds, then streams on; otherwise the next "
        "pgcdc run does, before it streams"
    )
    return 0
