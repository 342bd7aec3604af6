"""The harness itself: both servers run with what logical replication tests need."""

from tests.fix_pg import PgDatabase


def test_server_settings(pg: PgDatabase) -> None:
    rows = pg.execute(
        "SELECT current_setting('wal_level'), current_setting('max_prepared_transactions')::int,"
        " current_setting('server_version_num')::int / 10000"
    )
    assert rows == [("logical", 20, pg.major)]
