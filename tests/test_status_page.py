"""The status page, rendered by a real headless Chromium against a real server."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import lockstep

pytestmark = pytest.mark.browser

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1100,760",
]


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("Debian's chromium is not installed (CI installs it)")
    profile = tempfile.mkdtemp(prefix="lockstep-chromium-")
    try:
        return subprocess.run(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=90,
            check=True,
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def test_status_page_shows_topology_and_live_barriers(
    served: tuple[str, dict[str, str]],
    tmp_path: Path,
) -> None:
    url, tokens = served
    ls = lockstep.connect(url, token=tokens["admin"])
    ls.register_job("load_shopping", sinks=["shopping"])
    ls.register_job("sum_amount", sources=["shopping"], sinks=["user_item_amount"])
    ls.register_job("sum_price", sources=["shopping"], sinks=["user_item_price"])
    root = ls.attach("load_shopping")
    for barrier_id in (1, 2):
        ls.issue_barrier()
        assert root.next_barrier() is not None
        root.report_processed(barrier_id, {"shopping": 100 + barrier_id})
        root.report_written(barrier_id)
    amount = ls.attach("sum_amount")
    assert amount.next_barrier() is not None  # sum_amount is now working on barrier 1

    page = f"{url}/?token={tokens['read']}"
    dom = chromium("--dump-dom", page).stdout
    assert 'id="topology"' in dom
    for name in ("load_shopping", "sum_amount", "sum_price", "user_item_amount"):
        assert f'data-name="{name}"' in dom
    assert "latest barrier issued: <b>2</b>" in dom
    assert 'class="barrier">barrier 2</text>' in dom  # shopping's live barrier in the graph
    assert "working on barrier 1" in dom
    screenshot = tmp_path / "status.png"
    chromium(f"--screenshot={screenshot}", page)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size > 10_000  # a rendered page, not a blank one
    # without a token the page is refused
    unauthenticated = chromium("--dump-dom", f"{url}/").stdout
    assert "missing or unknown bearer token" in unauthenticated
