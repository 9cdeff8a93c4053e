"""The catalog under attack (#38): the abuse corpus (tests/catalog_abuse.py) against the real
service, on SQLite and on PostgreSQL. Every request is refused with a 4xx in the Iceberg
error model; afterwards no file of the sentinel tree outside the warehouse was touched, and
no table's metadata moved (so no Lockstep table's main did)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from catalog_abuse import corpus, problem, run_corpus
from catalog_scene import Scene, build_scene
from iceberg_rest_fixtures import serve_catalog

pytest.importorskip("pyiceberg")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def scene(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Scene]:
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    with serve_catalog(tmp_path, store_url=url) as service:
        yield build_scene(service, tmp_path / "outside")


def test_every_abuse_is_refused_and_changes_nothing(scene: Scene) -> None:
    sentinels, pointers = scene.sentinels(), scene.pointers()
    assert len(sentinels) == 5
    answers = list(run_corpus(scene))
    assert len(answers) >= 50
    problems = [p for p in (problem(probe, response) for probe, response in answers) if p]
    assert not problems, "\n".join(problems)
    assert scene.sentinels() == sentinels
    assert scene.pointers() == pointers
    names = [probe.name for probe in corpus(scene)]
    assert len(set(names)) == len(names), "each probe says what it tries"
