"""Which deaths of a harness's process its faults explain (the others are the run's errors).

A process that ends of an error is restarted either way; this only decides whether its
death counts against the run. Each fault explains only the errors its server's loss
causes, and only in a process that was running when it happened (a connection pooled
before a restart fails at its next use, however much later that is on a loaded machine).
An explained death hides nothing from the verdict on the data: the final check of every
table at every barrier (:mod:`_crash_truth`) judges that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _crash_procs import Managed
    from _crash_run import CrashRun

EXPECTED_ERRORS = ("StoreError",)  # a job process that could not reach a killed replica
# ...and, for a while after PostgreSQL restarted, one whose Spark lost its JDBC catalog
PG_RESTART_ERRORS = ("PSQLException", "terminating connection", "Connection refused")
# ...after the S3 server restarted, one whose AWS SDK (Java) or PyArrow S3 client (Python)
# lost it: refused connections, resets, a server still starting up
S3_RESTART_ERRORS = (
    "SdkClientException",
    "Unable to execute HTTP request",
    "Connection refused",
    "Connection reset",
    "NETWORK_CONNECTION",
    "Couldn't connect to server",
    "InternalError",
    "We encountered an internal error",
    "ServiceUnavailable",
    "NoHttpResponseException",
)
# ...and, the catalog served, one whose catalog is a replica that was killed (a client's
# served catalog is the one replica that named it: Iceberg's REST client does not retry a
# refused connection) or answered an error while PostgreSQL, behind it, restarted
SERVED_CATALOG_ERRORS = (
    "java.net.ConnectException",
    "Connection refused",
    "NoHttpResponseException",
    "Connection reset",
    "ConnectionError",
    "RemoteDisconnected",
    "ServiceUnavailableException",
    "ServiceFailureException",
)


def explained(run: CrashRun, process: Managed, output: str) -> bool:
    """Whether ``process`` ended of what the run's faults cause: a killed replica, or a
    restart of PostgreSQL since it started; on an object store, a restart of the S3
    server since it started, or (the catalog served) a replica killed since."""
    if any(e in output for e in EXPECTED_ERRORS):
        return True
    causes = [
        (run.pg_restarted_at, PG_RESTART_ERRORS),
        (run.s3_restarted_at, S3_RESTART_ERRORS),
    ]
    if run.catalog_served:
        causes.append((run.replica_restarted_at, SERVED_CATALOG_ERRORS))
        causes.append((run.pg_restarted_at, SERVED_CATALOG_ERRORS))
    return any(
        at is not None and at >= process.started_at and any(e in output for e in errors)
        for at, errors in causes
    )
