"""Run views (#41): the served catalog as the job runtime of a program that knows nothing of
Lockstep. Stock pyiceberg plays the program; the job protocol is driven as ``lockstep exec``
drives it (attach, take the barrier, open the run, PROCESSED, publish, WRITTEN)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from service_fixtures import ADMIN_TOKEN, LOAD_JOB_TOKEN, READ_TOKEN, SUM_JOB_TOKEN

if TYPE_CHECKING:
    from iceberg_rest_fixtures import CatalogService

    from lockstep.barrier.session import JobSession

pytest.importorskip("pyiceberg")
pytest_plugins = ["iceberg_rest_fixtures"]


def _catalog(service: CatalogService, token: str, **properties: str) -> Any:
    from pyiceberg.catalog import load_catalog

    return load_catalog("t", type="rest", uri=service.uri, token=token, **properties)


def _post(service: CatalogService, path: str, body: dict[str, Any], token: str) -> Any:
    import httpx

    answer = httpx.post(
        f"{service.uri}/v1/lockstep/jobs/{path}",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
    )
    return answer


def _rows(values: list[int]) -> Any:
    import pyarrow as pa

    return pa.table({"n": pa.array(values, pa.int64())})


def _schema() -> Any:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    return Schema(NestedField(1, "n", LongType(), required=False))


class Pipeline:
    """Job ``load`` writes ``a`` and ``b``; job ``sum`` reads ``a`` and writes ``total``."""

    def __init__(self, service: CatalogService) -> None:
        import lockstep

        self.service = service
        self.admin = lockstep.connect(service.url, token=ADMIN_TOKEN)
        self.admin.register_job("load", sinks=["a", "b"])
        self.admin.register_job("sum", sources=["a"], sinks=["total"])
        _catalog(service, ADMIN_TOKEN).create_namespace("default")
        self.load = lockstep.connect(service.url, token=LOAD_JOB_TOKEN)
        self.sum = lockstep.connect(service.url, token=SUM_JOB_TOKEN)

    def take(self, job: str) -> tuple[JobSession, int]:
        """A new instance of ``job`` and the barrier it takes."""
        ls = self.load if job == "load" else self.sum
        session = ls.attach(job)
        barrier = session.next_barrier()
        assert barrier is not None
        return session, barrier.barrier_id

    def open(self, session: JobSession, barrier_id: int) -> Any:
        """The run's catalog, as ``lockstep exec`` hands it to the program."""
        token = LOAD_JOB_TOKEN if session.job_id == "load" else SUM_JOB_TOKEN
        body = {"token": session.token, "barrier": barrier_id}
        answer = _post(self.service, f"{session.job_id}/runs", body, token)
        assert answer.status_code == 200, answer.text
        return _catalog(self.service, token, warehouse=answer.json()["warehouse"])

    def finish(self, session: JobSession, barrier_id: int) -> dict[str, int | None]:
        """PROCESSED with the staged heads, one publish, WRITTEN."""
        import httpx

        token = LOAD_JOB_TOKEN if session.job_id == "load" else SUM_JOB_TOKEN
        staged = httpx.get(
            f"{self.service.uri}/v1/lockstep/jobs/{session.job_id}/staged",
            params={"token": session.token},
            headers={"Authorization": f"Bearer {token}"},
        ).json()["snapshots"]
        session.report_processed(barrier_id, staged)
        body = {"token": session.token, "barrier": barrier_id, "snapshots": staged}
        answer = _post(self.service, f"{session.job_id}/publish", body, token)
        assert answer.status_code == 200, answer.text
        session.report_written(barrier_id, answer.json()["snapshots"])
        return dict(staged)


def _values(table: Any, ref: str | None = None) -> list[int]:
    snapshot = table.current_snapshot() if ref is None else table.snapshot_by_name(ref)
    if snapshot is None:
        return []
    return sorted(table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()["n"].to_pylist())


def test_a_run_stages_its_sinks_and_publishes_them_together(
    iceberg_service: CatalogService,
) -> None:
    pipeline = Pipeline(iceberg_service)
    pipeline.admin.issue_barrier()
    load, b1 = pipeline.take("load")
    run = pipeline.open(load, b1)
    a = run.create_table("default.a", _schema())
    a.append(_rows([1, 2]))
    assert _values(run.load_table("default.a")) == [1, 2]  # the program sees its writes
    run.create_table("default.b", _schema()).append(_rows([10]))

    reader = _catalog(iceberg_service, READ_TOKEN)
    assert reader.load_table("default.a").current_snapshot() is None  # main never moved
    pipeline.finish(load, b1)
    a_read, b_read = reader.load_table("default.a"), reader.load_table("default.b")
    assert (_values(a_read), _values(b_read)) == ([1, 2], [10])
    stamped = a_read.current_snapshot()
    assert stamped is not None
    assert stamped.summary["lockstep.barrier"] == str(b1)  # the catalog stamped it
    assert _values(a_read, "lockstep_b1") == [1, 2]

    # the downstream run sees its source at its barrier, even after the source moves on
    pipeline.admin.issue_barrier()
    total, b_sum = pipeline.take("sum")
    assert b_sum == 1
    load, b2 = pipeline.take("load")
    assert b2 == 2
    pipeline.open(load, b2).load_table("default.a").append(_rows([3]))
    pipeline.finish(load, b2)
    run = pipeline.open(total, b_sum)
    source = run.load_table("default.a")
    assert _values(source) == [1, 2]  # barrier 1's version, though main holds barrier 2
    assert source.metadata_location.rsplit("/", 1)[1].startswith("lockstep-view-")
    shown = run.load_table("default.a")  # the file the load names says the same
    from pyiceberg.table import StaticTable

    assert StaticTable.from_metadata(shown.metadata_location).metadata == shown.metadata


def test_a_run_that_writes_an_undeclared_table_is_refused(
    iceberg_service: CatalogService,
) -> None:
    from pyiceberg.exceptions import ForbiddenError

    pipeline = Pipeline(iceberg_service)
    pipeline.admin.issue_barrier()
    load, b1 = pipeline.take("load")
    pipeline.open(load, b1).create_table("default.a", _schema()).append(_rows([1]))
    pipeline.finish(load, b1)
    total, b_sum = pipeline.take("sum")
    run = pipeline.open(total, b_sum)
    with pytest.raises(ForbiddenError, match=r"writes only its job's sinks \(default\.total\)"):
        run.load_table("default.a").append(_rows([99]))
    with pytest.raises(ForbiddenError, match=r"creating .default\.other. under the run"):
        run.create_table("default.other", _schema())
    assert _values(_catalog(iceberg_service, READ_TOKEN).load_table("default.a")) == [1]


def test_a_failed_run_publishes_nothing_and_the_next_reruns_the_barrier(
    iceberg_service: CatalogService,
) -> None:
    from pyiceberg.exceptions import ForbiddenError

    pipeline = Pipeline(iceberg_service)
    pipeline.admin.issue_barrier()
    load, b1 = pipeline.take("load")
    run = pipeline.open(load, b1)
    run.create_table("default.a", _schema()).append(_rows([1]))
    run.create_table("default.b", _schema()).append(_rows([10]))
    pipeline.finish(load, b1)
    pipeline.admin.issue_barrier()
    load, b2 = pipeline.take("load")
    run = pipeline.open(load, b2)
    run.load_table("default.a").append(_rows([2]))  # one of two sinks, then the program dies
    b_table = run.load_table("default.b")
    reader = _catalog(iceberg_service, READ_TOKEN)
    assert _values(reader.load_table("default.a")) == [1]

    # the next instance fences the dead one: its late commit is refused
    again, replayed = pipeline.take("load")
    assert replayed == b2  # the same barrier, again
    with pytest.raises(ForbiddenError, match="fenced by a newer one"):
        b_table.append(_rows([20]))
    fenced = _post(
        iceberg_service,
        "load/publish",
        {"token": load.token, "barrier": b2, "snapshots": {"a": None}},
        LOAD_JOB_TOKEN,
    )
    assert fenced.status_code == 409, fenced.text

    rerun = pipeline.open(again, replayed)  # staging reset to main: the dead run's row is gone
    assert _values(rerun.load_table("default.a")) == [1]
    rerun.load_table("default.a").append(_rows([2]))
    rerun.load_table("default.b").append(_rows([20]))
    staged = pipeline.finish(again, replayed)
    # a publish repeated (a crash between publish and WRITTEN) changes nothing
    body = {"token": again.token, "barrier": replayed, "snapshots": staged}
    assert _post(iceberg_service, "load/publish", body, LOAD_JOB_TOKEN).status_code == 200
    a_read, b_read = reader.load_table("default.a"), reader.load_table("default.b")
    assert (_values(a_read), _values(b_read)) == ([1, 2], [10, 20])
    assert (_values(a_read, "lockstep_b2"), _values(b_read, "lockstep_b2")) == ([1, 2], [10, 20])


def test_a_run_view_is_its_openers_alone(iceberg_service: CatalogService) -> None:
    from pyiceberg.exceptions import ForbiddenError

    pipeline = Pipeline(iceberg_service)
    pipeline.admin.issue_barrier()
    load, b1 = pipeline.take("load")
    body = {"token": load.token, "barrier": b1}
    warehouse = _post(iceberg_service, "load/runs", body, LOAD_JOB_TOKEN).json()["warehouse"]
    with pytest.raises(ForbiddenError, match="opened with another token"):
        _catalog(iceberg_service, ADMIN_TOKEN, warehouse=warehouse)
    refused = _post(iceberg_service, "load/runs", body, SUM_JOB_TOKEN)
    assert refused.status_code == 403, refused.text


def test_a_run_views_key_is_the_token_its_caller_authenticated_with(
    iceberg_service: CatalogService,
) -> None:
    """#48 item 4: a token sent as ``?token=`` was not the key's key, the constant "local"
    was, so a prefix computed from public data (job, instance and barrier, which the status
    page shows) opened the run for any token that acts for the job. The key is now the token
    the caller authenticated with, however it came; and the catalog takes one from the
    ``Authorization`` header alone (test_url_tokens.py)."""
    import httpx

    from lockstep.service.iceberg.run_view import Run

    pipeline = Pipeline(iceberg_service)
    pipeline.admin.issue_barrier()
    load, b1 = pipeline.take("load")
    body = {"token": load.token, "barrier": b1}
    prefix = _post(iceberg_service, "load/runs", body, LOAD_JOB_TOKEN).json()["prefix"]
    public = Run("load", load.token, b1, frozenset(), frozenset()).prefix("local")

    def tables(under: str, *, header: str | None = None, query: str | None = None) -> int:
        answer = httpx.get(
            f"{iceberg_service.uri}/v1/{under}/namespaces/default/tables",
            params={} if query is None else {"token": query},
            headers={} if header is None else {"Authorization": f"Bearer {header}"},
        )
        return answer.status_code

    assert tables(prefix, header=LOAD_JOB_TOKEN) == 200
    assert tables(public, query=LOAD_JOB_TOKEN) == 401  # it was 200
    assert tables(public, query=ADMIN_TOKEN) == 401  # it was 200
    assert tables(public, header=LOAD_JOB_TOKEN) == 403
    assert tables(prefix, query=LOAD_JOB_TOKEN) == 401
    assert tables(prefix, header=ADMIN_TOKEN) == 403


def test_a_callers_credential_is_the_token_it_presented_and_is_never_shown() -> None:
    from lockstep.service.auth import Access, Grant, Role
    from lockstep.service.deps import LOCAL, authenticate

    tokens = {LOAD_JOB_TOKEN: Grant(Role.JOB, frozenset({"load"}))}
    caller = authenticate(tokens, f"Bearer {LOAD_JOB_TOKEN}", Access.READ)
    assert caller.credential == LOAD_JOB_TOKEN
    assert LOAD_JOB_TOKEN not in repr(caller)
    # without a token file every caller is the local admin, with one constant credential
    assert authenticate(None, f"Bearer {LOAD_JOB_TOKEN}", Access.READ) == LOCAL
