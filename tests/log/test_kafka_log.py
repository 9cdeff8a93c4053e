"""Tables' logs on a real Kafka broker (Apache Kafka, tests/kafka_broker.py): each barrier's
changes in one transaction, read back aligned on barriers; a second writer fences the
first, whose open transaction no read_committed reader ever sees; a barrier the log holds
is not written twice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lockstep.barrier.log.changelog import Change, change_record, changes_between
from lockstep.barrier.log.kafka_log import LogFencedError, TableLogWriter
from lockstep.barrier.sources.kafka.client import aiokafka_module, create_topic
from lockstep.readers.log_stream import stream

pytestmark = pytest.mark.kafka
VERSIONS = [  # a table's rows at barriers 1..4
    [{"id": 1, "n": "a"}],
    [{"id": 1, "n": "b"}, {"id": 2, "n": "x"}],
    [{"id": 2, "n": "x"}, {"id": 3, "n": "y"}],
    [{"id": 2, "n": "z"}, {"id": 3, "n": "y"}, {"id": 4, "n": "w"}],
]


@pytest.fixture
def topics(kafka_bootstrap: str, kafka_topic: str) -> dict[str, str]:
    names = {"orders": f"{kafka_topic}-orders", "revenue": f"{kafka_topic}-revenue"}
    for topic in names.values():
        create_topic(kafka_bootstrap, topic, 3)
    return names


@pytest.fixture
def writers(kafka_bootstrap: str, topics: dict[str, str]) -> Iterator[list[TableLogWriter]]:
    made: list[TableLogWriter] = []
    yield made
    for writer in made:
        writer.close()


def _writer(
    servers: str, topics: dict[str, str], table: str, made: list[TableLogWriter]
) -> TableLogWriter:
    writer = TableLogWriter(
        servers, table, key=("id",), topic=topics[table], transactional_id=topics[table]
    )
    made.append(writer)
    return writer


def _changes(barrier: int) -> list[Change]:
    before = VERSIONS[barrier - 2] if barrier > 1 else []
    return changes_between(before, VERSIONS[barrier - 1], key=("id",))


def test_each_barriers_changes_are_read_back_whole_and_aligned(
    kafka_bootstrap: str, topics: dict[str, str], writers: list[TableLogWriter]
) -> None:
    orders = _writer(kafka_bootstrap, topics, "orders", writers)
    revenue = _writer(kafka_bootstrap, topics, "revenue", writers)
    assert orders.start().barrier is None  # an empty log
    revenue.start()
    for barrier in (1, 2, 3, 4):
        assert orders.write(barrier, _changes(barrier))
    # revenue (a catch-up job's table) skipped barrier 3: its version at 4 follows 2's
    revenue_versions = {1: VERSIONS[0], 2: VERSIONS[1], 4: VERSIONS[3]}
    previous: list[dict[str, object]] = []
    for barrier, rows in revenue_versions.items():
        assert revenue.write(barrier, changes_between(previous, rows, key=("id",)))
        previous = rows
    read = list(stream(kafka_bootstrap, ["orders", "revenue"], topics=topics, idle_s=3))
    assert [b for b, _ in read] == [1, 2, 3, 4]
    for barrier, changes in read:
        assert _sorted(changes["orders"]) == _sorted(_changes(barrier))
    by_barrier = dict(read)
    assert by_barrier[3]["revenue"] == []
    assert _sorted(by_barrier[4]["revenue"]) == _sorted(
        changes_between(VERSIONS[1], VERSIONS[3], key=("id",))
    )
    later = list(stream(kafka_bootstrap, ["orders"], topics=topics, after=2, idle_s=3))
    assert [b for b, _ in later] == [3, 4]


def test_a_second_writer_fences_the_first_and_its_open_transaction_is_never_read(
    kafka_bootstrap: str, topics: dict[str, str], writers: list[TableLogWriter]
) -> None:
    first = _writer(kafka_bootstrap, topics, "orders", writers)
    first.start()
    ends_1 = first.write(1, _changes(1))
    assert ends_1
    _open_a_transaction(first, barrier=2)  # the first stops here: sent, not committed
    second = _writer(kafka_bootstrap, topics, "orders", writers)
    started = second.start()
    assert started.barrier == 1  # its start aborted the first's transaction
    # where barrier 1 ends is read back as written: after its markers, not at the log's end
    # (which the commit record and the aborted transaction push further)
    assert started.barrier_ends == ends_1
    assert all(started.end_offsets[p] > ends_1[p] for p in ends_1)
    with pytest.raises(aiokafka_module().errors.ProducerFenced):
        _commit(first)  # the first, resumed, cannot commit it
    assert not second.write(1, _changes(1))  # the log holds barrier 1: not written twice
    assert second.write(2, _changes(2))
    third = _writer(kafka_bootstrap, topics, "orders", writers)
    assert third.start().barrier == 2
    with pytest.raises(LogFencedError, match="another writer of its log"):
        second.write(3, _changes(3))  # fenced between two barriers
    assert third.write(3, _changes(3))
    read = list(stream(kafka_bootstrap, ["orders"], topics=topics, idle_s=3))
    assert [b for b, _ in read] == [1, 2, 3]
    for barrier, changes in read:  # the aborted change (id 9) is in none
        assert _sorted(changes["orders"]) == _sorted(_changes(barrier))


def _open_a_transaction(writer: TableLogWriter, *, barrier: int) -> None:
    """Begin a transaction and send a change of ``barrier`` in it, as a writer stopped
    before its commit leaves it."""
    producer = writer._producer
    record = change_record(
        Change("c", None, {"id": 9, "n": "never"}), table=writer.table, barrier=barrier, key=("id",)
    )

    async def send() -> None:
        await producer.begin_transaction()
        await (
            await producer.send(
                writer.topic, record.value, key=record.key, headers=list(record.headers)
            )
        )

    assert writer._loop is not None
    writer._loop.run(send())


def _commit(writer: TableLogWriter) -> None:
    assert writer._loop is not None
    writer._loop.run(writer._producer.commit_transaction())


def _sorted(changes: list[Change]) -> list[str]:
    return sorted(repr(c) for c in changes)
