"""The status page, rendered by a real headless Chromium against a real server.

One pipeline with known delays (the service's clock is the tests' fake clock): a root job,
two aggregates (one slow: the bottleneck) and a job that never runs. ``--dump-dom`` checks
the static page; a driven Chromium (Debian's chromium-driver with selenium) reads the delay
charts back and checks them against ``__META_DELAY``, the job states, the bottleneck mark,
that an auto-refresh keeps the scroll position, and that nothing overflows on a phone.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeClock

import lockstep
from lockstep.facade import Lockstep
from lockstep.service.status_svg import duration

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
    "--disable-dev-shm-usage",
]
# own cost (s) of each job at each barrier: sum_price is the slow one
COSTS = {"load_shopping": 1.0, "sum_amount": 0.5, "sum_price": 3.0}


def chromium(*args: str, window: str = "1100,760") -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("Debian's chromium is not installed (CI installs it)")
    profile = tempfile.mkdtemp(prefix="lockstep-chromium-")
    try:
        return subprocess.run(
            [
                binary,
                *CHROMIUM_FLAGS,
                f"--window-size={window}",
                f"--user-data-dir={profile}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=90,
            check=True,
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def run_barrier(ls: Lockstep, clock: FakeClock, sessions: dict[str, Any], b: int) -> None:
    """Issue barrier ``b`` and take it through the root and both aggregates, each job
    spending ``COSTS[job] + b / 10`` seconds (so every point of a chart differs)."""
    assert ls.issue_barrier().barrier_id == b
    for job, sink in (
        ("load_shopping", "shopping"),
        ("sum_amount", "user_item_amount"),
        ("sum_price", "user_item_price"),
    ):
        session = sessions[job]
        clock.advance(0.25)  # the job notices the barrier: its wait
        assert session.next_barrier().barrier_id == b
        clock.advance(COSTS[job] + b / 10)
        session.report_processed(b, {sink: 100 * b})
        session.report_written(b)
        session.heartbeat()


@pytest.fixture
def pipeline(served: tuple[str, dict[str, str]], clock: FakeClock) -> Iterator[dict[str, Any]]:
    """Barriers 1-3 WRITTEN everywhere, barrier 4 taken by sum_amount (running), export_crm
    registered and never attached (not running)."""
    url, tokens = served
    ls = lockstep.connect(url, token=tokens["admin"])
    ls.register_job("load_shopping", sinks=["shopping"])
    ls.register_job("sum_amount", sources=["shopping"], sinks=["user_item_amount"])
    ls.register_job("sum_price", sources=["shopping"], sinks=["user_item_price"])
    ls.register_job("export_crm", sources=["user_item_amount"], sinks=["crm_export"])
    sessions = {job: ls.attach(job) for job in COSTS}
    for b in (1, 2, 3):
        run_barrier(ls, clock, sessions, b)
    ls.issue_barrier()
    assert sessions["load_shopping"].next_barrier() is not None
    sessions["load_shopping"].report_processed(4, {"shopping": 400})
    sessions["load_shopping"].report_written(4)
    assert sessions["sum_amount"].next_barrier() is not None  # working on barrier 4
    page = f"{url}/?token={tokens['read']}"
    yield {"url": url, "page": page, "ls": ls, "clock": clock, "sessions": sessions}
    ls.close()


def test_status_page_renders_without_script(pipeline: dict[str, Any], tmp_path: Path) -> None:
    page = pipeline["page"]
    dom = chromium("--dump-dom", "--virtual-time-budget=2000", page).stdout
    assert 'id="topology"' in dom
    for name in ("load_shopping", "sum_amount", "sum_price", "export_crm", "user_item_amount"):
        assert f'data-name="{name}"' in dom
    assert '<div class="chip" id="latest-barrier">' in dom
    assert "latest barrier issued</span> <b>4</b>" in dom
    assert 'class="barrier">written 4</text>' in dom  # shopping's newest barrier, in the graph
    assert "working on barrier 4" in dom
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in dom
    for external in ("<script src", "<link", "https://"):  # nothing from outside the service
        assert external not in dom
    screenshot = tmp_path / "status.png"
    chromium(f"--screenshot={screenshot}", page)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size > 10_000  # a rendered page, not a blank one
    # without a token the page is refused, with a page saying how to pass one
    unauthenticated = chromium("--dump-dom", f"{pipeline['url']}/").stdout
    assert "A token is needed" in unauthenticated
    assert "/?token=YOUR_TOKEN" in unauthenticated
    assert '"error"' not in unauthenticated  # not the API's JSON


def test_status_json_has_the_page_data(pipeline: dict[str, Any]) -> None:
    import httpx

    token = pipeline["page"].rsplit("=", 1)[1]
    body = httpx.get(f"{pipeline['url']}/v1/status", params={"token": token}).json()
    assert body["latest_barrier"] == 4
    assert body["bottleneck"]["job_id"] == "sum_price"
    assert [b["barrier_id"] for b in body["barriers"]] == [4, 3, 2, 1]
    assert [r["barrier_id"] for r in body["delays"]["user_item_price"]] == [1, 2, 3]


def test_a_tables_log_tier_delay_is_beside_its_snapshot_delay(pipeline: dict[str, Any]) -> None:
    """A table with a log (its writer reports where each barrier ends in it): /v1/status
    has each barrier's log delay, the page the latest beside the e2e delay's figures."""
    import httpx

    clock, load = pipeline["clock"], pipeline["sessions"]["load_shopping"]
    clock.advance(2)
    for b in (1, 2, 3):
        load.report_logged(b, "shopping", "lockstep.log.shopping", {0: 10 * b})
    token = pipeline["page"].rsplit("=", 1)[1]
    body = httpx.get(f"{pipeline['url']}/v1/status", params={"token": token}).json()
    shopping = {r["barrier_id"]: r for r in body["delays"]["shopping"]}
    for b in (1, 2, 3):
        assert shopping[b]["log_delay_s"] > shopping[b]["e2e_delay_s"] > 0
    assert all(r["log_delay_s"] is None for r in body["delays"]["user_item_price"])
    html = httpx.get(pipeline["page"]).text
    latest = shopping[3]["log_delay_s"]
    assert html.count('class="log-delay"') == 1  # shopping's card alone
    assert f'<span class="log-delay">log {duration(latest)}</span>' in html


@pytest.fixture
def browser() -> Iterator[Any]:
    """Opens Debian's chromium through Debian's chromium-driver (never a downloaded one)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    binary, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip("Debian's chromium and chromium-driver are not installed (CI installs them)")
    drivers: list[Any] = []

    def open_browser(width: int, height: int, *, phone: bool = False) -> Any:
        options = webdriver.ChromeOptions()
        options.binary_location = binary
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--window-size={width},{height}")
        if phone:  # a phone's viewport: the page's viewport meta and media queries apply
            metrics = {"width": width, "height": height, "pixelRatio": 2.0}
            options.add_experimental_option("mobileEmulation", {"deviceMetrics": metrics})
        driver = webdriver.Chrome(
            options=options, service=webdriver.ChromeService(executable_path=driver_path)
        )
        drivers.append(driver)
        return driver

    yield open_browser
    for driver in drivers:
        driver.quit()


def test_a_long_delays_axis_label_is_not_clipped(browser: Any, tmp_path: Path) -> None:
    from lockstep.service.status_style import PAGE_CSS
    from lockstep.service.status_svg import delay_chart

    rows = [
        {"barrier_id": b, "e2e_delay_s": d, "job_id": "j", "wait_s": 1.0, "own_cost_s": d - 1}
        for b, d in ((1, 12.0), (2, 95.0))
    ]
    page = tmp_path / "chart.html"
    page.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><style>{PAGE_CSS}</style></head>"
        f"<body><section>{delay_chart('t', rows, 1, 2)}</section></body></html>"
    )
    driver = browser(1100, 700)
    driver.get(page.as_uri())
    labels = driver.execute_script(
        "return Array.from(document.querySelectorAll('svg.delay-chart text.tick'))"
        ".map(function (t) { var b = t.getBBox(); return [t.textContent, b.x]; });"
    )
    assert "1 min 40 s" in [text for text, _ in labels]
    for text, left in labels:
        assert left >= 0, f"{text!r} starts at x={left}, outside the chart"


READ_CHARTS = """
return Array.from(document.querySelectorAll("svg.delay-chart")).map(function (svg) {
  var d = svg.dataset, box = svg.getBoundingClientRect();
  return {table: d.table, yMax: +d.yMax, top: +d.plotTop, height: +d.plotHeight,
          left: +d.plotLeft, width: +d.plotWidth, first: +d.firstBarrier,
          last: +d.lastBarrier, shownWidth: box.width,
          points: Array.from(svg.querySelectorAll("circle.point")).map(function (c) {
            return {barrier: +c.dataset.barrier, delay: +c.dataset.e2eDelayS,
                    cx: c.cx.baseVal.value, cy: c.cy.baseVal.value};
          })};
});
"""


def test_delay_charts_match_meta_delay(pipeline: dict[str, Any], browser: Any) -> None:
    driver = browser(1280, 900)
    driver.get(pipeline["page"])
    charts = {chart["table"]: chart for chart in driver.execute_script(READ_CHARTS)}
    expected: dict[str, dict[int, float]] = {}
    for row in pipeline["ls"].sql("SELECT * FROM __META_DELAY").to_pylist():
        expected.setdefault(row["table_name"], {})[row["barrier_id"]] = row["e2e_delay_s"]
    assert set(expected) == {"shopping", "user_item_amount", "user_item_price"}
    assert set(charts) == set(expected) | {"crm_export"}  # one chart per table
    assert charts["crm_export"]["points"] == []  # never written
    # as built: three jobs in turn, each 0.25 s to notice the barrier plus its cost
    assert expected["user_item_price"][1] == pytest.approx(0.75 + 1.1 + 0.6 + 3.1)
    for table, delays in expected.items():
        chart = charts[table]
        assert chart["shownWidth"] > 250  # drawn, at a readable size
        assert (chart["first"], chart["last"]) == (1, 4)
        assert {p["barrier"] for p in chart["points"]} == set(delays)
        for point in chart["points"]:
            assert point["delay"] == pytest.approx(delays[point["barrier"]], abs=1e-9)
            # the drawn position, mapped back through the chart's axes
            drawn = chart["yMax"] * (chart["top"] + chart["height"] - point["cy"]) / chart["height"]
            assert drawn == pytest.approx(delays[point["barrier"]], abs=chart["yMax"] / 500)
            at = chart["first"] + (point["cx"] - chart["left"]) / chart["width"] * (
                chart["last"] - chart["first"]
            )
            assert at == pytest.approx(point["barrier"], abs=0.01)
    # the timeline's WRITTEN marks are the same delays (written - issued)
    for table, delays in expected.items():
        for barrier, delay in delays.items():
            lane = driver.find_element(
                "css selector", f'.barrier[data-barrier="{barrier}"] .lane[data-table="{table}"]'
            )
            assert float(lane.get_attribute("data-written-s")) == pytest.approx(delay)
    unwritten = '.barrier[data-barrier="4"] .lane[data-table="user_item_amount"]'
    assert driver.find_element("css selector", unwritten).get_attribute("data-written-s") == ""


def test_job_states_and_bottleneck(pipeline: dict[str, Any], browser: Any) -> None:
    driver = browser(1280, 900)
    driver.get(pipeline["page"])
    states = {
        "load_shopping": "waiting",
        "sum_amount": "running",
        "sum_price": "waiting",
        "export_crm": "not running",
    }
    for job, state in states.items():
        row = driver.find_element("css selector", f'tr[data-job="{job}"]')
        assert row.get_attribute("data-activity") == state
        assert row.find_element("css selector", ".pill").text == state
        node = driver.find_element("css selector", f'#topology g.job[data-name="{job}"]')
        assert node.get_attribute("data-activity") == state
    assert "working on barrier 4" in driver.find_element("css selector", "#jobs").text
    # the bottleneck: at barrier 3 (the last written in every table that moves), the job
    # with the largest own cost on the critical path of its last table, as `lockstep delay`
    marked = driver.find_elements("css selector", '#topology g.job[data-bottleneck="true"]')
    assert [node.get_attribute("data-name") for node in marked] == ["sum_price"]
    path = pipeline["ls"].delay("user_item_price", barriers=2).paths[0]
    assert (path.barrier_id, path.bottleneck.job) == (3, "sum_price")
    note = driver.find_element("css selector", "#bottleneck-note")
    assert (note.get_attribute("data-job"), note.get_attribute("data-barrier")) == (
        "sum_price",
        "3",
    )
    assert "load_shopping → sum_price" in note.text
    critical = driver.find_elements("css selector", "#topology path.edge.critical")
    assert len(critical) == 3  # load_shopping -> shopping -> sum_price -> user_item_price


def test_auto_refresh_keeps_the_scroll_position(pipeline: dict[str, Any], browser: Any) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser(1100, 700)
    driver.get(pipeline["page"])
    y = driver.execute_script(
        "window.__samePage = 'yes';"
        "window.scrollTo(0, Math.min(600, document.documentElement.scrollHeight - innerHeight));"
        "return window.scrollY;"
    )
    assert y > 300  # the page is long enough to scroll

    pipeline["clock"].advance(1)
    assert pipeline["ls"].issue_barrier().barrier_id == 5

    def latest(d: Any) -> Any:
        return d.execute_script("return document.querySelector('#latest-barrier b').textContent")

    WebDriverWait(driver, 30, poll_frequency=0.2).until(lambda d: latest(d) == "5")
    assert driver.execute_script("return window.__samePage") == "yes"  # swapped, not reloaded
    assert driver.execute_script("return window.scrollY") == y
    assert driver.find_element("css selector", "#refresh-note").get_attribute("class") == "live"
    assert driver.find_elements("css selector", '.barrier[data-barrier="5"]')


def test_phone_width_has_no_horizontal_overflow(pipeline: dict[str, Any], browser: Any) -> None:
    driver = browser(375, 740, phone=True)
    driver.get(pipeline["page"])
    width = driver.execute_script("return window.innerWidth")
    assert width == 375
    assert driver.execute_script("return document.documentElement.scrollWidth") <= width
    # the topology scrolls inside its own box; tables become cards; charts fit
    box = driver.execute_script(
        "var b = document.getElementById('topology-scroll');"
        "return [b.scrollWidth, b.clientWidth, b.getBoundingClientRect().right];"
    )
    assert box[0] > box[1]  # scrollable inside
    assert box[2] <= width  # the box itself fits
    assert (
        driver.execute_script(
            "return getComputedStyle(document.querySelector('#jobs thead')).display"
        )
        == "none"
    )
    for chart in driver.execute_script(READ_CHARTS):
        assert 250 < chart["shownWidth"] <= width
