"""The HTTP transport to a coordinator service: a list of replicas, retries, and refusals
raised as the errors the embedded coordinator raises (``lockstep/remote.py`` is the store
over it).

Calls that are safe to repeat (reads, and the job reports, which are idempotent by
protocol) are retried on timeouts and dropped connections; every call is retried when the
connection could not even be made, on the next replica at once.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Hashable, Iterator
from typing import Any

import httpx
import pyarrow as pa

from lockstep.api import wire
from lockstep.barrier.model import Barrier
from lockstep.errors import ConfigurationError, StoreError

RETRIES = 4
BACKOFF_S = 0.2
DEFAULT_TIMEOUT_S = 30.0
# A meta query runs on the service for as long as its export takes (every row of the meta
# tables it reads, unbounded), then up to the service's ``sql_timeout_s`` (10 s by default)
# in DuckDB: minutes on a large store. Waiting less would time it out and retry it, i.e.
# run it again on the service.
DEFAULT_QUERY_TIMEOUT_S = 300.0


class ServiceClient:
    """Requests to one service's replicas (``url``: "http://a:1,http://b:2").

    >>> ServiceClient("http://a:1, http://b:2").urls
    ['http://a:1', 'http://b:2']
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        query_timeout_s: float = DEFAULT_QUERY_TIMEOUT_S,
        client: httpx.Client | None = None,
    ) -> None:
        for name, value in (("timeout_s", timeout_s), ("query_timeout_s", query_timeout_s)):
            if value <= 0:
                raise ConfigurationError(f"{name} must be positive, got {value}")
        # replicas of one service; a call that cannot reach one moves on to the next
        self.urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        self._current = 0
        self.client = client or httpx.Client(timeout=timeout_s)
        # Only the wait for the answer is longer: a replica that is down is still noticed
        # soon. Given as the request's "timeout" extension (what httpx's timeout argument
        # sets), which a client passed in, such as a test client, takes as it is.
        timeout = httpx.Timeout(timeout_s, read=query_timeout_s)
        self.query_extensions = {"timeout": timeout.as_dict()}
        if token:
            self.client.headers["Authorization"] = f"Bearer {token}"

    @property
    def url(self) -> str:
        return self.urls[self._current]

    def close(self) -> None:
        self.client.close()

    def call(
        self, method: str, path: str, *, idempotent: bool, stream: bool = False, **kwargs: Any
    ) -> httpx.Response:
        """The service's answer to a call, retried as the module says; a refusal raised as
        its error. With ``stream``, the answer's body is left to read (and to close)."""
        attempts = RETRIES * len(self.urls)
        for attempt in range(1, attempts + 1):
            try:
                request = self.client.build_request(method, self.url + path, **kwargs)
                response = self.client.send(request, stream=stream)
            except httpx.ConnectError as e:  # nothing was sent: always safe to retry
                if attempt == attempts:
                    raise StoreError(f"cannot reach the Lockstep service at {self.url}: {e}") from e
                self._current = (self._current + 1) % len(self.urls)
                if self._current != 0:
                    continue  # try the next replica at once
            except httpx.TransportError as e:  # sent, but no answer: a timeout, a dropped
                # connection, a replica killed mid-request
                if not idempotent or attempt == attempts:
                    raise StoreError(
                        f"the Lockstep service at {self.url} did not answer {method} {path}: "
                        f"{e!r}" + ("" if idempotent else "; the call may or may not have applied")
                    ) from e
                self._current = (self._current + 1) % len(self.urls)
            else:
                if response.status_code < 400:
                    return response
                if stream:
                    response.read()
                    response.close()
                if response.status_code >= 500 and idempotent and attempt < attempts:
                    pass  # a replica restarting: try again
                else:
                    raise refusal(response)
            time.sleep(BACKOFF_S * 2 ** (attempt - 1))
        raise AssertionError("unreachable")

    def first_line(self, path: str, **kwargs: Any) -> tuple[httpx.Response, Iterator[str], str]:
        """A streamed POST of an idempotent call, and its answer's first line (the call is
        made again if the answer breaks off before it)."""
        for attempt in range(1, RETRIES + 1):
            response = self.call("POST", path, idempotent=True, stream=True, **kwargs)
            lines = response.iter_lines()
            try:
                return response, lines, next(lines)
            except (httpx.HTTPError, StopIteration) as e:
                response.close()
                if attempt == RETRIES:
                    raise StoreError(
                        f"the Lockstep service at {self.url} did not answer POST {path}: {e!r}"
                    ) from e
        raise AssertionError("unreachable")


def arrow(response: httpx.Response) -> pa.Table:
    """An Arrow answer (the meta tables' export, a meta query's result)."""
    return pa.ipc.open_stream(response.content).read_all()


def refusal(response: httpx.Response) -> Exception:
    """The error a refused call raises: the service's own, or what its status says."""
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if isinstance(payload, dict) and "error" in payload:
        return wire.error_from_payload(payload)
    detail = payload.get("detail") if isinstance(payload, dict) else response.text[:500]
    return StoreError(
        f"the Lockstep service refused the request ({response.status_code}): {detail}"
    )


def second_part(lines: Iterator[str]) -> Barrier | None:
    """The second part of a two-part answer (``written-and-next`` with a wait): the next
    barrier; None when it broke off or the service could not wait (the job then waits with
    a long poll, which retries). A refusal (the instance fenced meanwhile) is raised."""
    try:
        rest = next(lines, None)
    except httpx.HTTPError:
        return None
    if rest is None:
        return None
    later = json.loads("{" + rest)
    if "refused" in later:  # as the long poll would be: raised, or asked again
        error = wire.error_from_payload(later["refused"])
        if wire.status_for(error) < 500:
            raise error
        return None
    found: Barrier | None = wire.load(later["next_barrier"], Barrier | None)
    return found


class PollsOut:
    """The long polls a client has out, by key (a job instance): thread-safe counts."""

    def __init__(self) -> None:
        self._out: Counter[Hashable] = Counter()
        self._lock = threading.Lock()

    def started(self, key: Hashable) -> None:
        with self._lock:
            self._out[key] += 1

    def ended(self, key: Hashable) -> None:
        with self._lock:
            self._out[key] -= 1
            if self._out[key] <= 0:
                del self._out[key]

    def __contains__(self, key: object) -> bool:
        return self._out.get(key, 0) > 0
