"""The abuse corpus's probe: one hostile request, and the helpers that spell them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
from catalog_scene import NS, Scene, send
from service_fixtures import ADMIN_TOKEN, LOAD_JOB_TOKEN, READ_TOKEN

# -- the corpus ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    name: str
    method: str
    path: str  # under /iceberg/v1 (or, starting with '//', the service's own path)
    body: Any = None
    token: str | None = ADMIN_TOKEN
    headers: dict[str, str] = field(default_factory=dict)
    repeated: tuple[tuple[str, str], ...] = ()  # headers sent more than once

    def send(self, scene: Scene) -> httpx.Response:
        url = (
            scene.service.url + self.path[1:]
            if self.path.startswith("//")
            else scene.url(self.path)
        )
        if self.repeated:
            return httpx.request(self.method, url, headers=list(self.repeated), timeout=30)
        return send(self.method, url, self.token, self.body, self.headers)


def _describe(update: dict[str, Any]) -> str:
    """An update, in a few words: its action and what it aims at."""
    stats = update.get("statistics") or update.get("partition-statistics") or {}
    aim = (
        update.get("ref-name")
        or ",".join(update.get("updates", {}))
        or update.get("location")
        or (update.get("schema") or {}).get("fields", [{}])[0].get("type")
        or next(iter(update.get("spec", {}).get("fields", [])), {}).get("transform")
        or update.get("format-version")
        or stats.get("statistics-path")
        or (update.get("snapshot") or {}).get("manifest-list")
    )
    return f"{update['action']}({aim})" if aim else str(update["action"])


def _updates_on(path: str, *updates: dict[str, Any], **kw: Any) -> Probe:
    label = "+".join(_describe(u) for u in updates)
    who = {ADMIN_TOKEN: "", READ_TOKEN: " by a reader", LOAD_JOB_TOKEN: " by load's token"}
    headers = "".join(f" {k}={v}" for k, v in kw.get("headers", {}).items())
    name = f"{label} on {path.rsplit('/', 1)[-1]}{who[kw.get('token', ADMIN_TOKEN)]}{headers}"
    return Probe(name, "POST", path, commit(*updates), **kw)


def commit(*updates: dict[str, Any]) -> dict[str, Any]:
    return {"requirements": [], "updates": list(updates)}


def ident(name: str) -> dict[str, Any]:
    return {"namespace": [NS], "name": name}


TABLES = f"/namespaces/{NS}/tables"
ORDERS, SCRATCH, TOTALS = (f"{TABLES}/{t}" for t in ("orders", "scratch", "totals"))
FIELD = {"id": 1, "name": "user_id", "type": "string", "required": False}
SCHEMA = {"type": "struct", "schema-id": 1, "fields": [FIELD]}
CREATE = {"name": "t", "schema": {"type": "struct", "fields": [FIELD]}}
SET_X = {"action": "set-properties", "updates": {"x": "1"}}
