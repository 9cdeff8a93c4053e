"""docs/tutorial.md, run the way its reader runs it, so it cannot drift from the code.

The tutorial's fenced blocks are read in order (info strings, see ``parse_blocks``):

- ```` ```bash ````: typed into one terminal. All of them run in one ``bash -euo pipefail``
  session (the venv's bin first on PATH), so ``cd``, ``export`` and ``SERVE_PID=$!`` carry
  over from block to block as they do for the reader; a failing command fails the test.
- ```` ```python file=NAME ```` (any language with ``file=``): saved as NAME in the
  session's current folder, as the reader saves it.
- ```` ```text ````: the stdout of the bash block just before it, compared the way doctest
  does: ``...`` matches anything, runs of whitespace are equal, and the values that differ
  from run to run (timestamps, decimals, snapshot ids, byte counts) match any number.
- ```` ```text figure ````: a drawing; neither run nor checked.

Anything else fails the test: a block the test does not run is a block that can drift. The
only change made to the text is the port (``PORT=8765`` becomes a free one). Beyond the
printed outputs, the test checks the pipeline's tables against a ground truth computed in
plain Python from the tutorial's own generators, the revision in ``__META_REVISION`` and
the expiration in ``__META_TABLE_BARRIER``.
"""

from __future__ import annotations

import contextlib
import doctest
import os
import re
import runpy
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.ports import free_port

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
VENV_BIN = Path(sys.executable).parent
PORT_LINE = "PORT=8765"
BLOCK_TIMEOUT_S = 300.0  # one block (a Spark run on a busy 2-core machine takes ~1 min)

FENCE = re.compile(r"^```(?P<info>[^`\n]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
# Values that differ from run to run: timestamps, decimals (durations), numbers of 4+ digits
# (snapshot ids, byte counts; 1,234 too). Numbers below 1,000 (barrier ids, row and snapshot
# counts, fencing tokens, the dashboard's figures) are compared as they are.
VOLATILE = re.compile(
    r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?|\d+\.\d+|\d{1,3}(?:,\d{3})+|\d{4,}"
)
# A table's rule (``----`` under a header) is as wide as its widest cell, so a column of
# snapshot ids is a dash narrower when every id drawn has 18 digits (about one in nine
# does): rules compare as rules, whatever their width.
RULE = re.compile(r"-{3,}")
CHECK_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@dataclass
class Block:
    kind: str  # "bash", "file", "output" or "figure"
    body: str
    line: int  # where the block starts in tutorial.md (1-based), for messages
    name: str = ""  # the file a "file" block is saved as
    output: Block | None = None  # for a bash block: its expected stdout, if shown
    got: str = ""  # for a bash block: its stdout in this run

    def where(self) -> str:
        return f"docs/tutorial.md:{self.line}"


def parse_blocks(markdown: str) -> list[Block]:
    """The tutorial's fenced blocks in order, each text block attached to its bash block."""
    blocks: list[Block] = []
    for match in FENCE.finditer(markdown):
        line = markdown.count("\n", 0, match.start()) + 1
        words = match["info"].split()
        lang, options = (words[0] if words else ""), words[1:]
        attrs = dict(w.split("=", 1) for w in options if "=" in w)
        flags = {w for w in options if "=" not in w}
        body = match["body"]
        if "file" in attrs and not flags and len(attrs) == 1:
            blocks.append(Block("file", body, line, name=attrs["file"]))
        elif lang == "bash" and not options:
            blocks.append(Block("bash", body, line))
        elif lang == "text" and not options:
            previous = blocks[-1] if blocks else None
            if previous is None or previous.kind != "bash" or previous.output is not None:
                raise AssertionError(
                    f"docs/tutorial.md:{line}: a ```text block is the output of the ```bash "
                    "block just before it, and there is none (a drawing is ```text figure)"
                )
            previous.output = Block("output", body, line)
        elif lang == "text" and options == ["figure"]:
            blocks.append(Block("figure", body, line))
        else:
            raise AssertionError(
                f"docs/tutorial.md:{line}: ```{match['info']} is neither run nor checked by "
                "tests/end_to_end/test_tutorial.py; use ```bash, ```LANG file=NAME, ```text "
                "(the output of the bash block before it) or ```text figure"
            )
    return blocks


def masked(text: str) -> str:
    """``text`` with its run-to-run values and its rules' widths made alike."""
    return RULE.sub("---", VOLATILE.sub("#", text))


def output_matches(want: str, got: str) -> bool:
    checker = doctest.OutputChecker()
    return checker.check_output(masked(want), masked(got), CHECK_FLAGS)


def output_difference(want: str, got: str) -> str:
    example = doctest.Example("", want)
    return doctest.OutputChecker().output_difference(example, got, CHECK_FLAGS)


class Terminal:
    """One ``bash -euo pipefail`` session fed block by block, like a reader's terminal.

    It runs in a process group of its own, so everything started from it (the Spark JVMs,
    a ``lockstep serve &``) is stopped with it.
    """

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder = folder
        self.count = 0
        self.shell_errors = (folder / ".shell.err").open("wb")  # bash's own, if any
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc", "-euo", "pipefail"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.shell_errors,
            cwd=folder,
            env=env,
            start_new_session=True,
        )

    def run(self, script: str, *, where: str, timeout_s: float = BLOCK_TIMEOUT_S) -> str:
        """Run ``script`` in the session; its stdout (stderr is kept for a failure's report)."""
        assert self.proc.stdin is not None
        self.count += 1
        stem = self.folder / f".block{self.count:02d}"
        Path(f"{stem}.sh").write_text(script)
        marker = f"__tutorial_block_{self.count}_done__"
        q = shlex.quote
        command = f"source {q(f'{stem}.sh')} >{q(f'{stem}.out')} 2>{q(f'{stem}.err')} </dev/null"
        self.proc.stdin.write(f"{command}\necho {marker}\n".encode())
        self.proc.stdin.flush()
        finished = self._wait_for(marker, time.monotonic() + timeout_s)
        out = Path(f"{stem}.out").read_text() if Path(f"{stem}.out").exists() else ""
        if not finished:
            err = Path(f"{stem}.err").read_text() if Path(f"{stem}.err").exists() else ""
            status = self.proc.poll()
            what = "timed out" if status is None else f"failed (the shell exited with {status})"
            pytest.fail(
                f"{where}: the block {what}:\n{script}\n--- stdout:\n{out[-3000:]}\n"
                f"--- stderr:\n{err[-5000:]}",
                pytrace=False,
            )
        return out

    def _wait_for(self, marker: str, deadline: float) -> bool:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        pending = b""
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:  # the shell exited: a command failed under `set -e`
                return False
            pending += chunk
            if marker.encode() in pending.splitlines():
                return True
        return False

    def value(self, expression: str) -> str:
        """What the session expands ``expression`` to (e.g. ``$LOCKSTEP_HOME``)."""
        return self.run(f'printf "%s" "{expression}"\n', where="(the test)", timeout_s=30)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)  # the group this test started
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.shell_errors):
            if stream is not None:
                stream.close()


def run_tutorial(blocks: list[Block], folder: Path, *, kafka: str) -> Terminal:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["KAFKA_BOOTSTRAP"] = kafka  # the reader's broker (chapter 8)
    terminal = Terminal(folder, env)
    try:
        mismatches = []
        for block in blocks:
            if block.kind == "file":
                staged = folder / f".file{block.line}"
                staged.write_text(block.body)
                q = shlex.quote
                terminal.run(f"cp -- {q(str(staged))} {q(block.name)}\n", where=block.where())
            elif block.kind == "bash":
                block.got = terminal.run(block.body, where=block.where())
                want = block.output
                if want is not None and not output_matches(want.body, block.got):
                    diff = output_difference(want.body, block.got)
                    mismatches.append(f"{want.where()} (the output of {block.where()}):\n{diff}")
        # every block ran; report every drifted output at once
        assert not mismatches, "\n".join(mismatches)
    except BaseException:
        terminal.close()
        raise
    return terminal


# -- the ground truth, from the tutorial's own generators ------------------------------------


def expected_tables(pipe: dict[str, Any], barrier_id: int) -> dict[str, list[tuple[Any, ...]]]:
    """region_revenue and top_customers through ``barrier_id``, in plain Python."""
    regions: dict[str, str] = {}
    revenue: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    spent: dict[tuple[str, str], int] = defaultdict(int)
    for b in range(1, barrier_id + 1):
        regions.update((c["customer_id"], c["region"]) for c in pipe["customer_feed"](b))
        for order in pipe["order_feed"](b):
            region = regions[order["customer_id"]]
            revenue[region][0] += order["amount"]
            revenue[region][1] += 1
            spent[order["customer_id"], region] += order["amount"]
    ranked = sorted(spent.items(), key=lambda kv: (-kv[1], kv[0][0]))[:3]
    return {
        "region_revenue": sorted((r, v, n) for r, (v, n) in revenue.items()),
        "top_customers": [(i + 1, c, r, v) for i, ((c, r), v) in enumerate(ranked)],
    }


def outputs_of(blocks: list[Block], command: str) -> list[str]:
    """The stdout of every bash block that runs ``command``, in order."""
    return [b.got for b in blocks if b.kind == "bash" and command in b.body]


def processed(run_output: str) -> dict[str, int]:
    return {
        m["job"]: int(m["n"])
        for m in re.finditer(r"^job (?P<job>\w+): processed (?P<n>\d+) barrier", run_output, re.M)
    }


# -- the tests ---------------------------------------------------------------------------------


def test_every_block_of_the_tutorial_is_run_or_checked() -> None:
    """Fast: the tutorial parses, and points nowhere outside the repository."""
    text = TUTORIAL.read_text()
    blocks = parse_blocks(text)
    kinds = [b.kind for b in blocks]
    assert kinds.count("bash") >= 10
    # mypipe.py, dashboard.py, upstream.py, top_customers.sql, streaming.py, consumer.py
    assert kinds.count("file") == 6
    assert text.count(PORT_LINE) == 1, f"the test replaces the one {PORT_LINE!r} line"
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert all("://" not in link for link in links), links
    assert not [u for u in re.findall(r"https?://[^\s\"'`)]+", text) if "127.0.0.1" not in u]


def test_a_column_of_shorter_ids_still_matches() -> None:
    """Fast: when every snapshot id of a column has 18 digits, not 19, the column's rule is
    a dash narrower; the output still matches (it failed one run in about nine)."""
    want = (
        "table   barrier_id  snapshot_id\n"
        "------  ----------  -------------------\n"
        "orders  3           7012345678901234567\n"
    )
    got = (
        "table   barrier_id  snapshot_id\n"
        "------  ----------  ------------------\n"
        "orders  3           701234567890123456\n"
    )
    assert output_matches(want, got)
    assert not output_matches(want, got.replace("orders  3", "orders  4"))


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.kafka
def test_the_tutorial_runs_as_written(tmp_path: Path, kafka_bootstrap: str) -> None:
    if shutil.which("curl") is None:
        pytest.skip("the tutorial waits for the service with curl, which is not installed")
    text = TUTORIAL.read_text().replace(PORT_LINE, f"PORT={free_port()}")
    blocks = parse_blocks(text)
    terminal = run_tutorial(blocks, tmp_path, kafka=kafka_bootstrap)
    try:
        home = Path(terminal.value("$LOCKSTEP_HOME"))
        folder = Path(terminal.value("$PWD"))
        service_pid = terminal.value("${SERVE_PID:-}")
    finally:
        terminal.close()

    # the jobs: every barrier once; after the revision only the revised jobs redo barrier 3
    runs = [processed(out) for out in outputs_of(blocks, "run 'mypipe:*' --until-idle")]
    loaders, derived = ["load_orders", "load_customers"], ["enrich", "region_revenue"]
    assert [[r[j] for j in [*loaders, *derived, "top_customers"]] for r in runs] == [
        [2] * 5,  # barriers 1 and 2, on the home
        [1] * 5,  # barrier 3, through the service
        [0, 0, 1, 1, 1],  # barrier 3 again, revised
    ], runs
    assert service_pid, "the service was started in the background and its PID kept"

    # the dashboard: one barrier for both tables; after the revision back at barrier 2, with
    # the same answer as before; after the jobs reran, barrier 3
    dashboards = outputs_of(blocks, "python dashboard.py")
    heads = [out.splitlines()[0] for out in dashboards]
    assert heads == [
        "read at barrier 2: {'region_revenue': 2, 'top_customers': 2}",
        "read at barrier 2: {'region_revenue': 2, 'top_customers': 2}",
        "read at barrier 3: {'region_revenue': 3, 'top_customers': 3}",
    ], heads
    assert dashboards[1] == dashboards[0]

    import lockstep

    pipe = runpy.run_path(str(folder / "mypipe.py"))
    truth = {b: expected_tables(pipe, b) for b in (2, 3, 5)}
    for barrier, out in ((2, dashboards[0]), (3, dashboards[2])):
        for rank, customer, region, spent in truth[barrier]["top_customers"]:
            row = rf"│\s+{rank} │ {customer}\s+│ {region}\s+│\s+{spent} │"
            assert re.search(row, out), (row, out)

    with lockstep.connect(home) as ls:
        with ls.read(["region_revenue", "top_customers"]) as read:
            assert read.barrier_id == 5  # chapter 8's two barriers
            got = {
                "region_revenue": sorted(
                    (r["region"], r["revenue"], r["orders"])
                    for r in read.arrow("region_revenue").to_pylist()
                ),
                "top_customers": sorted(
                    (r["rank"], r["customer_id"], r["region"], r["spent"])
                    for r in read.arrow("top_customers").to_pylist()
                ),
            }
        assert got == truth[5]

        revision = ls.sql(
            "SELECT revised_table, to_barrier, state, first_revised_barrier, "
            "last_revised_barrier FROM __META_REVISION ORDER BY revised_table"
        ).to_pylist()
        revised = ("enriched_orders", "region_revenue", "top_customers")
        assert [tuple(r.values()) for r in revision] == [(t, 2, "DONE", 3, 3) for t in revised]
        expired = ls.sql(
            "SELECT barrier_id, count(*) FILTER (WHERE expired) AS expired, count(*) AS tables "
            "FROM __META_TABLE_BARRIER GROUP BY barrier_id ORDER BY barrier_id"
        ).to_pylist()
        assert [tuple(r.values()) for r in expired] == [(1, 5, 5)] + [
            (b, 0, 5) for b in (2, 3, 4, 5)
        ]
        # chapter 8: the consumer printed barriers 4 and 5's changes of region_revenue, which
        # are those between its snapshots (compared as sets of printed lines)
        [consumed] = outputs_of(blocks, "python consumer.py")
        assert sorted(consumed.splitlines()) == sorted(_printed_changes(ls, (4, 5)))


def _printed_changes(ls: Any, barriers: tuple[int, ...]) -> list[str]:
    """consumer.py's lines for ``barriers``, from region_revenue's snapshots."""
    from lockstep.barrier.log.changelog import changes_between

    def rows(barrier: int) -> list[dict[str, Any]]:
        version = ls.store.version_as_of("region_revenue", barrier)
        return ls.iceberg.arrow_at("region_revenue", version.snapshot_id).to_pylist()

    lines = []
    for b in barriers:
        for change in changes_between(rows(b - 1), rows(b), key=("region",)):
            row = change.after or change.before
            lines.append(f"{b} {change.op} {row['region']} {row['revenue']} {row['orders']}")
    return lines
