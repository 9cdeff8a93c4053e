"""What the ``lockstep`` command's arguments may be: argparse types that refuse a bad value
with the rule it broke."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from lockstep.cli.format import MAX_ID


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An integer from ``minimum`` up to what the store holds (64-bit)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if value > MAX_ID:
            raise argparse.ArgumentTypeError(f"must be at most {MAX_ID}, got {value}")
        return value

    return parse


def port(text: str) -> int:
    """A TCP port (1-65535): the operating system would take a larger number modulo 65536."""
    value = int_at_least(1)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is from 1 to 65535, not {value}")
    return value


def positive_float(text: str) -> float:
    """A number above 0 (an interval, a timeout)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A number from 0 up (a least interval, where 0 means none)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value
