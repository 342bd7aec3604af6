"""A reader of the lake's tables by name, as a user's own Spark session: run as a script (its
own process and JVM) with ``--conf key=value`` settings naming the catalog and Spark SQL
statements; prints each statement's rows as one JSON list (values as strings). With
``--hold FOLDER``, it then writes ``FOLDER/held`` and keeps its session (and the catalog it
opened) until ``FOLDER/release`` appears."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession

    from pgcdc.lake.store.delta import delta_settings

    parser = argparse.ArgumentParser()
    parser.add_argument("--conf", action="append", default=[])
    parser.add_argument("--hold", default=None)
    parser.add_argument("statements", nargs="+")
    args = parser.parse_args(argv)
    conf = dict(item.split("=", 1) for item in args.conf)
    builder = SparkSession.builder.master("local[1]").appName("catalog-reader")
    settings = {"spark.ui.enabled": "false", "spark.log.level": "ERROR"}
    for key, value in {**delta_settings(conf), **settings}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        results = [
            [[None if v is None else str(v) for v in row] for row in spark.sql(s).collect()]
            for s in args.statements
        ]
        print(json.dumps(results), flush=True)
        if args.hold:
            folder = Path(args.hold)
            (folder / "held").touch()
            deadline = time.monotonic() + 600
            while not (folder / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
