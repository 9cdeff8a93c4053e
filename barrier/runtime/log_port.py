"""What the job runtime asks of a log tier (``lockstep.barrier.log.tier`` implements it):
the runtime names no Kafka module, so the Kafka folders may use the runtime's types."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from lockstep.barrier.model import TableVersion


class LogTierPort(Protocol):
    """The log writers of one job instance's sinks."""

    def start(self, written: Sequence[int]) -> None: ...

    def staged(self, barrier_id: int, snapshots: Mapping[str, int | None]) -> None: ...

    def written(self, barrier_id: int, versions: Sequence[TableVersion]) -> None: ...

    def close(self) -> None: ...


class JobLogPort(Protocol):
    """A job's log settings (``Job(log=...)``), which open its instance's writers."""

    def open(
        self,
        sinks: Sequence[str],
        *,
        spark: Any,
        identifier: Callable[[str], str],
        version_at: Callable[[str, int], TableVersion | None],
        logged: Callable[[int, str, str, Mapping[int, int]], None],
        job_id: str = "",
    ) -> LogTierPort: ...
