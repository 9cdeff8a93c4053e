"""The operations of the remote coordinator (DESIGN §7): revisions, retention, repair,
over the service's HTTP API (a part of :class:`lockstep.remote.RemoteMetadataStore`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lockstep.api import wire
from lockstep.barrier.model import FoundVersion, Revision, TableRetention, TableVersion
from lockstep.readers.seen import Seen


class RemoteOperations:
    """Revisions, retention and repair, for a class with the service's ``_json`` call and
    the ``_seen`` a change of history resets."""

    _seen: Seen

    def _json(self, method: str, path: str, kind: Any, *, idempotent: bool, **kwargs: Any) -> Any:
        raise NotImplementedError

    def plan_revision(self, table: str, to_barrier: int, *, full: bool = False) -> Revision:
        body = {"table": table, "to_barrier": to_barrier, "full": full}
        result: Revision = self._json(
            "POST", "/v1/revisions/plan", Revision, idempotent=True, json=body
        )
        return result

    def begin_revision(self, table: str, to_barrier: int, *, full: bool = False) -> Revision:
        # idempotent: beginning the same revision again resumes it
        body = {"table": table, "to_barrier": to_barrier, "full": full}
        self._seen.history_changed()  # before: a revision may apply though the call fails
        result: Revision = self._json("POST", "/v1/revisions", Revision, idempotent=True, json=body)
        return result

    def finish_revision(self, revision_id: int) -> Revision:
        path = f"/v1/revisions/{revision_id}/finish"
        self._seen.history_changed()
        result: Revision = self._json("POST", path, Revision, idempotent=True)
        return result

    def revisions(self, *, limit: int | None = None) -> list[Revision]:
        params = {"limit": limit} if limit is not None else {}
        result: list[Revision] = self._json(
            "GET", "/v1/revisions", list[Revision], idempotent=True, params=params
        )
        return result

    def plan_retention(self, retain_barriers: int) -> list[TableRetention]:
        body = {"retain_barriers": retain_barriers}
        result: list[TableRetention] = self._json(
            "POST", "/v1/retention/plan", list[TableRetention], idempotent=True, json=body
        )
        return result

    def record_retention(self, retain_barriers: int) -> list[TableRetention]:
        body = {"retain_barriers": retain_barriers}
        self._seen.history_changed()
        result: list[TableRetention] = self._json(
            "POST", "/v1/retention", list[TableRetention], idempotent=True, json=body
        )
        return result

    def restore_versions(self, found: Sequence[FoundVersion]) -> list[TableVersion]:
        body = {"found": wire.dump(list(found), list[FoundVersion])}
        self._seen.history_changed()
        result: list[TableVersion] = self._json(
            "POST", "/v1/repair/versions", list[TableVersion], idempotent=True, json=body
        )
        return result
