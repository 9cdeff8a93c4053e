"""``lockstep exec JOB --remote sc://... --sql FILE``: a SQL job with no program process.

``spark-sql`` cannot use Spark Connect, and a program that runs a SQL file over it pays a
Python start and a Connect client every barrier, more than the statements themselves. With
``--sql`` exec runs FILE's statements itself, one by one, over the run's own session on the
shared Spark (``exec_remote``: the run's catalog set for that session only). No code from the
job runs in exec's process: the statements run on the server, where the session's catalog
is all they can reach. The file is read again each barrier, as ``spark-sql -f`` would.

A statement that fails is the job's failure, like a program exiting 1: exec says which
statement, and publishes nothing. Rows a statement returns (a ``SELECT``, a ``SHOW``) are
printed tab-separated on standard output, as ``spark-sql`` prints them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lockstep.errors import InvalidRequestError

_QUOTES = "'\"`"


def statements(text: str) -> list[str]:
    """The statements of a Spark SQL script, in order: ``;`` ends one, except inside quotes
    (``'...'``, ``"..."``, ``\\`...\\```, backslash escapes in strings) and comments
    (``-- ...`` to the line's end, ``/* ... */`` nested as Spark nests them); comments are
    dropped, empty statements skipped."""
    found: list[str] = []
    current: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _QUOTES:
            end = _quoted_end(text, i)
            current.append(text[i:end])
            i = end
        elif text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            i = _comment_end(text, i)
            current.append(" ")
        elif c == ";":
            found.append("".join(current))
            current = []
            i += 1
        else:
            current.append(c)
            i += 1
    found.append("".join(current))
    return [s.strip() for s in found if s.strip()]


def _quoted_end(text: str, start: int) -> int:
    quote, i = text[start], start + 1
    while i < len(text):
        if text[i] == "\\" and quote != "`":
            i += 2
            continue
        if text[i] == quote:
            if quote == "`" and text.startswith("``", i):  # a doubled backtick is one
                i += 2
                continue
            return i + 1
        i += 1
    raise InvalidRequestError(
        f"the SQL file has an unclosed {quote} opened at character {start + 1}: close it"
    )


def _comment_end(text: str, start: int) -> int:
    depth, i = 0, start
    while i < len(text):
        if text.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    raise InvalidRequestError(
        f"the SQL file has an unclosed /* comment opened at character {start + 1}: close it"
    )


def read_statements(path: Path) -> list[str]:
    """FILE's statements; an error that says what to fix if it cannot be read or has none."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InvalidRequestError(f"cannot read the SQL file {str(path)!r}: {e.strerror}") from e
    found = statements(text)
    if not found:
        raise InvalidRequestError(f"the SQL file {str(path)!r} has no statement")
    return found


def run_statements(
    spark: Any,
    path: Path,
    say: Callable[[str], None],
    stopped: Callable[[], int | None],
) -> int:
    """Run FILE's statements on ``spark`` (a Spark Connect session), in order: 0 when all
    ran; 1 when one failed (said, with its number and first line); 128+N when signal N
    (``stopped()``) came before the last ended. Only 0 lets exec publish."""
    found = read_statements(path)
    for number, statement in enumerate(found, start=1):
        if (signum := stopped()) is not None:
            return 128 + signum
        try:
            rows = spark.sql(statement).collect()  # a command ran already; a query runs here
        except Exception as e:  # Spark's error: the job's failure, not exec's
            say(
                f"statement {number} of {len(found)} failed ({_first_line(statement)}): "
                f"{type(e).__name__}: {_first_line(str(e))}"
            )
            signum = stopped()
            return 1 if signum is None else 128 + signum
        for row in rows:
            print("\t".join("NULL" if v is None else str(v) for v in row), flush=True)
    return 0


def _first_line(text: str, width: int = 120) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."
