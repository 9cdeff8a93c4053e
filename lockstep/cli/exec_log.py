"""``lockstep exec``'s log tier (docs/log.md): each barrier exec publishes, its sinks'
changes go to their Kafka logs, as the Python runtime writes them.

The writers are the runtime's (``barrier/log/tier.py``): started with exec's instance,
after its recovery (fencing the previous instance's writers, writing what the logs lack),
then fed each WRITTEN barrier. The snapshots are read with pyiceberg through the service's
catalog, with exec's own token (the program's run credential is over by then).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from lockstep.barrier.iceberg.naming import iceberg_parts
from lockstep.barrier.log.tier import JobLog, LogTier
from lockstep.barrier.model import TableVersion
from lockstep.errors import InvalidRequestError


def add_log_options(options: argparse.ArgumentParser) -> None:
    options.add_argument(
        "--log",
        metavar="BOOTSTRAP",
        help="write each published barrier's changes of the job's sinks to their Kafka logs "
        "(host:port[,...]; topics lockstep.log.<table>, docs/log.md)",
    )
    options.add_argument(
        "--log-key",
        action="append",
        default=[],
        metavar="TABLE=COL[,COL]",
        help="a sink's primary key, for updates in its log (repeat per table; none: whole-row "
        "inserts and deletes)",
    )


def job_log(args: argparse.Namespace) -> JobLog | None:
    """The ``--log`` and ``--log-key`` options as a :class:`JobLog` (None: no ``--log``)."""
    if getattr(args, "log", None) is None:
        if getattr(args, "log_key", None):
            raise InvalidRequestError("--log-key names a log's key: give --log BOOTSTRAP too")
        return None
    keys: dict[str, tuple[str, ...]] = {}
    for item in args.log_key:
        table, _, columns = item.partition("=")
        key = tuple(c.strip() for c in columns.split(",") if c.strip())
        if not table.strip() or not key:
            raise InvalidRequestError(
                f"--log-key {item!r}: give TABLE=COLUMN[,COLUMN], e.g. --log-key orders=order_id"
            )
        keys[table.strip()] = key
    return JobLog(args.log, keys=keys)


def open_log(
    spec: JobLog,
    sinks: Sequence[str],
    *,
    catalog: Any,
    version_at: Callable[[str, int], TableVersion | None],
    logged: Callable[[int, str, str, Mapping[int, int]], None],
    job_id: str,
) -> LogTier:
    """The writers of exec's instance, reading snapshots with pyiceberg from ``catalog``."""
    unknown = sorted(set(spec.keys) - set(sinks))
    if unknown:
        raise InvalidRequestError(
            f"--log-key names {', '.join(unknown)}, which job {job_id!r} does not write; its "
            f"sinks: {', '.join(sinks)}"
        )

    def rows_at(table: str, snapshot_id: int | None) -> Iterable[Mapping[str, Any]]:
        if snapshot_id is None:
            return []
        loaded = catalog.load_table(".".join(iceberg_parts(table)))
        rows: list[Mapping[str, Any]] = loaded.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
        return rows

    return LogTier(
        spec, sinks, rows_at=rows_at, version_at=version_at, logged=logged, job_id=job_id
    )
