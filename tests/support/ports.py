"""Loopback ports for the servers the tests, benchmarks and tools start (brokers,
databases, the service, object stores, Spark Connect, Trino)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    >>> 0 < free_port() < 65536
    True
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
