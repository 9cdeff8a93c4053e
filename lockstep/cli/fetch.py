"""``lockstep fetch``: the jars Lockstep puts on a JVM, from Maven Central into its cache.

With no names it fetches what this installation needs: the Iceberg runtime for the
installed PySpark and the PostgreSQL driver (Iceberg's JDBC catalog). ``--list`` says
what is pinned, and what is already fetched, without fetching.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lockstep.barrier.jars import JARS, cache_dir, fetch_jars, iceberg_runtime_key, jar_path
from lockstep.cli.format import Output
from lockstep.errors import ConfigurationError, InvalidRequestError


def needed_here() -> list[str]:
    """The jars this installation uses by default."""
    from lockstep.barrier.runtime.spark_session import installed_spark_version

    try:
        keys = [iceberg_runtime_key(installed_spark_version())]
    except ConfigurationError:  # no PySpark (a service's machine): no Spark runtime
        keys = []
    return [*keys, "postgresql"]


def cmd_fetch(args: argparse.Namespace) -> Output:
    """Fetch the jars Lockstep uses (Maven Central, checked, into Lockstep's cache)."""
    unknown = [k for k in args.jars if k not in JARS]
    if unknown:
        raise InvalidRequestError(
            f"no jar called {unknown[0]!r}: choose from {', '.join(JARS)} (lockstep fetch --list)"
        )
    keys = list(JARS) if args.all else (args.jars or needed_here())
    if args.list:
        rows = [_row(key, key in keys) for key in JARS]
        text = "\n".join(
            f"{r['jar']:20s} {r['coordinates']:58s} {'fetched' if r['fetched'] else '-'}"
            for r in rows
        )
        return Output(rows, f"{text}\n(cache: {cache_dir() / 'jars'})")

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    paths = fetch_jars(keys, say)
    rows = [_row(key, True) for key in keys]
    return Output(rows, "\n".join(str(p) for p in paths))


def _row(key: str, needed: bool) -> dict[str, Any]:
    jar = JARS[key]
    return {
        "jar": key,
        "coordinates": jar.artifact.coordinates,
        "purpose": jar.purpose,
        "path": str(jar_path(key)),
        "fetched": jar_path(key).is_file(),
        "needed": needed,
    }


def add_fetch_command(sub: Any, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "fetch",
        help="fetch the jars Lockstep uses from Maven Central",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        parents=[common],
    )
    parser.add_argument("jars", nargs="*", metavar="JAR", help=f"what to fetch: {', '.join(JARS)}")
    parser.add_argument("--all", action="store_true", help="every jar Lockstep pins")
    parser.add_argument("--list", action="store_true", help="say what is pinned and fetched")
    parser.set_defaults(handler=cmd_fetch)
