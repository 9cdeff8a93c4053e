"""Consistency levels are declared once (``readers/levels.py``): every place that offers a
choice of level offers exactly :class:`ConsistencyLevel`, and every place that treats
levels differently reads their flags. A level added to levels.py and missing from one of
these places fails here, naming the place.
"""

from __future__ import annotations

import argparse
import re
import typing

import pytest

from lockstep.barrier.model import TableVersion, VersionState
from lockstep.cli.main import build_parser
from lockstep.demo import Dashboard
from lockstep.errors import NoConsistentBarrierError
from lockstep.facade import Level, Lockstep
from lockstep.readers.levels import ABBREVIATIONS, SEMANTICS, ConsistencyLevel, LevelName
from lockstep.readers.seen import Seen
from lockstep.service.iceberg import pinned
from lockstep.service.requests import ResolveIn

ALL = [level.value for level in ConsistencyLevel]


def _literal_values(kind: object) -> list[str]:
    """The strings of every ``Literal`` inside ``kind`` (a union, or a Literal itself)."""
    if typing.get_origin(kind) is typing.Literal:
        return list(typing.get_args(kind))
    return [v for arg in typing.get_args(kind) for v in _literal_values(arg)]


def _resolve_level_choices() -> list[str]:
    """The choices of ``lockstep resolve --level``, as the parser has them."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    resolve = commands.choices["resolve"]
    (level,) = [a for a in resolve._actions if "--level" in a.option_strings]
    return list(level.choices or ())


def test_each_level_is_declared_whole() -> None:
    assert set(SEMANTICS) == set(ConsistencyLevel), "a level without semantics"
    assert set(ABBREVIATIONS) == set(ConsistencyLevel), "a level without an abbreviation"
    assert len(set(ABBREVIATIONS.values())) == len(ABBREVIATIONS), ABBREVIATIONS
    assert all(re.fullmatch("[a-z]{2}", a) for a in ABBREVIATIONS.values()), ABBREVIATIONS


def test_the_facade_the_cli_and_the_wire_offer_every_level() -> None:
    assert _literal_values(LevelName) == ALL, "readers/levels.py LevelName"
    assert _literal_values(Level) == ALL, "lockstep/facade.py Level"
    assert _resolve_level_choices() == ALL, "lockstep resolve --level"
    for value in ALL:
        assert ResolveIn(tables=["t"], level=value).level is ConsistencyLevel(value)
        assert ConsistencyLevel.parse(value.upper().replace("_", "-")).value == value


def test_the_catalog_has_a_pinned_view_for_every_level_with_a_common_barrier() -> None:
    pinnable = {level for level in ConsistencyLevel if level.semantics.common_barrier}
    assert {level for level, _ in pinned.LEVELS.values()} == pinnable
    for warehouse, (level, start) in pinned.LEVELS.items():
        assert warehouse == f"lockstep:{level.value}"
        prefix = f"{start}{'ab' * 8}.{'0' * 32}"
        found = pinned._LEASED.fullmatch(prefix)
        assert found is not None, prefix
        assert found.group(2) == "ab" * 8, prefix


def test_the_client_sends_floors_at_the_levels_memory_answers() -> None:
    seen = Seen()
    seen.note([TableVersion("orders", 7, 1, VersionState.WRITTEN)])
    for level in ConsistencyLevel:
        floors = seen.floors(["orders"], level)
        assert (floors == {"orders": 7}) if level.semantics.written_only else floors is None


@pytest.mark.parametrize("level", list(ConsistencyLevel), ids=ALL)
def test_messages_and_the_demo_name_every_level(level: ConsistencyLevel) -> None:
    error = NoConsistentBarrierError(
        level.value, ["a"], ["a"], "x", common_barrier=level.semantics.common_barrier
    )
    expected = f"no barrier ({level.value})" if level.semantics.common_barrier else "no version"
    assert str(error).startswith(expected)
    dashboard = Dashboard(typing.cast("Lockstep", None))  # counting reads no store
    assert f"{level.abbreviation.upper()} 0 (0 wrong)" in dashboard.counts()
