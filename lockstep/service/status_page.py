"""The status page's HTML: one self-contained document (inline CSS, SVG and a small script).

Everything that changes lives in ``<main id="live">``. With scripting on, the page fetches
itself every few seconds and swaps that element in place, keeping the window's and the
topology's scroll positions; without it, a ``<noscript>`` meta refresh reloads the page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape
from typing import TYPE_CHECKING, Any

from lockstep.service.status_style import PAGE_CSS, REFRESH_JS
from lockstep.service.status_svg import delay_chart, duration, topological_order, topology_svg

if TYPE_CHECKING:
    from lockstep.service.status import Status

TIMELINE_BARRIERS = 8  # the timeline shows this many of the window's barriers


def render_status_page(status: Status, *, refresh_s: int = 3) -> str:
    """The whole page for ``status`` (:func:`lockstep.service.status.collect_status`)."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Lockstep status</title>
<noscript><meta http-equiv="refresh" content="{refresh_s}"></noscript>
<style>{PAGE_CSS}</style></head>
<body data-refresh-s="{refresh_s}">
<header class="top"><h1>Lockstep</h1>
<span id="refresh-note" class="live">live · refreshes every {refresh_s} s</span></header>
{_live(status)}
<script>{REFRESH_JS}</script>
</body></html>"""


def _live(status: Status) -> str:
    return f"""<main id="live" data-generated="{_iso(status.now)}">
{_summary(status)}{_issuer_note(status.issuer, status.now)}
<section id="topology-section"><h2>Topology</h2>{_legend()}
<div class="scroll-x" id="topology-scroll" data-keep-scroll>
{topology_svg(status.tables, status.jobs, status.edges, status.bottleneck)}</div>
{_bottleneck_note(status.bottleneck)}</section>
<div class="two-up">
<section><h2>Jobs</h2>{_jobs_table(status.jobs)}</section>
<section><h2>Tables</h2>{_tables_table(status.tables)}</section>
</div>
<section><h2>End-to-end delay per table <small>last {status.window} barriers</small></h2>
{_charts(status)}</section>
<section><h2>Barrier timeline <small>issued → PROCESSED → WRITTEN, per table</small></h2>
{_timeline(status)}</section>
{_about(status)}
</main>"""


def _summary(status: Status) -> str:
    latest = status.latest_barrier
    issued = status.barriers[0]["issued_at"] if status.barriers else None
    counts = {a: sum(j["activity"] == a for j in status.jobs) for a in _ACTIVITIES}
    lag = max((t["freshness_lag_s"] or 0.0 for t in status.tables), default=None)
    chips = [
        (
            "latest-barrier",
            "latest barrier issued",
            f"<b>{latest if latest is not None else 'none yet'}</b>"
            + (f" <small>{_clock(issued)}</small>" if issued else ""),
        ),
        ("worst-lag", "largest freshness lag", f"<b>{duration(lag)}</b>"),
        (
            "job-counts",
            "jobs",
            " ".join(
                f'<span class="dot {a.replace(" ", "-")}"></span><b>{n}</b> {a}'
                for a, n in counts.items()
            ),
        ),
    ]
    if status.bottleneck is not None:
        chips.append(("bottleneck", "bottleneck", f"<b>{escape(status.bottleneck['job_id'])}</b>"))
    if status.issuer is not None:
        chips.append(("issuer", "barrier issuer", _issuer_chip(status.issuer)))
    return (
        '<div class="chips">'
        + "".join(
            f'<div class="chip" id="{key}"><span class="label">{label}</span> {value}</div>'
            for key, label, value in chips
        )
        + "</div>"
    )


_ACTIVITIES = ("running", "waiting", "not running")


def _issuer_chip(issuer: Mapping[str, Any]) -> str:
    """This replica's barrier issuer: holding back, issuing (its policy), or standing by."""
    hold = issuer["holding_back"]
    if hold is not None:
        return f'<b class="held">holding back</b> <small>{hold["in_flight"]} in flight</small>'
    if issuer["leading"]:
        return f"<b>issuing</b> <small>{escape(issuer['policy'])}</small>"
    return "<b>standby</b> <small>another issuer leads</small>"


def _issuer_note(issuer: Mapping[str, Any] | None, now: datetime | None) -> str:
    """While the issuer holds the next barrier back: whom it waits for, and since when."""
    hold = None if issuer is None else issuer["holding_back"]
    if hold is None:
        return ""
    held = None if now is None else (now - hold["since"]).total_seconds()
    they = "that job catches up" if len(hold["jobs"]) == 1 else "those jobs catch up"
    return (
        f'<p class="note" id="issuer-note" data-jobs="{escape(" ".join(hold["jobs"]))}" '
        f'data-in-flight="{hold["in_flight"]}"><b>Issuer holding back</b> '
        f"({duration(held)} so far): {escape(hold['text'])}. The next barrier is issued when "
        f"{they}; a job that is not running holds the barriers back until it runs again "
        "(start it, or unregister it).</p>"
    )


def _legend() -> str:
    return (
        '<p class="legend"><span class="key table-key"></span>table '
        '<span class="key job-key running"></span>job running '
        '<span class="key job-key waiting"></span>waiting '
        '<span class="key job-key not-running"></span>not running '
        '<span class="key hot-key"></span>bottleneck and its critical path</p>'
    )


def _bottleneck_note(bottleneck: Mapping[str, Any] | None) -> str:
    if bottleneck is None:
        return (
            '<p class="note" id="bottleneck-note">No bottleneck yet: '
            "no table was WRITTEN in this window.</p>"
        )
    if bottleneck["written_in_all"]:
        which = "the last barrier written in every table"
    elif bottleneck["complete"]:
        which = "the last barrier written in every table that moves (not all tables do)"
    else:
        which = "the barrier written in the most tables (none in the window is complete)"
    return (
        f'<p class="note" id="bottleneck-note" data-job="{escape(bottleneck["job_id"])}" '
        f'data-barrier="{bottleneck["barrier_id"]}"><b>Bottleneck: '
        f"{escape(bottleneck['job_id'])}</b>, {duration(bottleneck['own_cost_s'])} of own cost "
        f"(waited {duration(bottleneck['wait_s'])}) within the "
        f"{duration(bottleneck['e2e_delay_s'])} e2e delay of "
        f"<b>{escape(bottleneck['table'])}</b> at barrier {bottleneck['barrier_id']}, {which}. "
        "It is the job with the largest own cost on that table's critical path "
        f"({' → '.join(escape(j) for j in bottleneck['path_jobs'])}), "
        "as <code>lockstep delay TABLE</code> reports it.</p>"
    )


def _cell(label: str, value: Any, cls: str = "") -> str:
    if value is None:
        text = "-"
    elif isinstance(value, float):
        text = f"{value:,.1f}"
    else:
        text = escape(str(value))
    return f'<td data-label="{label}"{f" class={cls!r}" if cls else ""}>{text}</td>'


def _jobs_table(jobs: Sequence[Mapping[str, Any]]) -> str:
    rows = "".join(
        f'<tr data-job="{escape(j["job_id"])}" data-activity="{j["activity"]}">'
        f'<td data-label="job" class="key-cell">{escape(j["job_id"])}</td>'
        f'<td data-label="state" class="state">'
        f'<span class="pill {j["activity"].replace(" ", "-")}">{j["activity"]}</span>'
        f"{_detail(j)}</td>"
        + _cell("type", j["job_type"])
        + _cell("last written", j["last_written"], "num")
        + _cell("fencing token", j["fencing_token"], "num")
        + "</tr>"
        for j in jobs
    )
    return (
        '<table id="jobs" class="cards"><thead><tr><th>job</th><th>state</th><th>type</th>'
        f'<th class="num">last written</th><th class="num">token</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>"
    )


def _detail(job: Mapping[str, Any]) -> str:
    return "" if job["state"] == job["activity"] else f" <small>{escape(job['state'])}</small>"


def _tables_table(tables: Sequence[Mapping[str, Any]]) -> str:
    rows = "".join(
        f'<tr data-table="{escape(t["table_name"])}">'
        f'<td data-label="table" class="key-cell">{escape(t["table_name"])}</td>'
        + _cell("writer", t["writer_job"])
        + _cell("written", t["latest_written"], "num")
        + _cell("processed", t["latest_processed"], "num")
        + f'<td data-label="freshness lag" class="num">{duration(t["freshness_lag_s"])}</td>'
        + "</tr>"
        for t in tables
    )
    return (
        '<table id="tables" class="cards"><thead><tr><th>table</th><th>writer</th>'
        '<th class="num">written</th><th class="num">processed</th>'
        f'<th class="num">freshness lag</th></tr></thead><tbody>{rows}</tbody></table>'
    )


def _charts(status: Status) -> str:
    if not status.barriers:
        return '<p class="empty">No barrier issued yet.</p>'
    first, last = status.barriers[-1]["barrier_id"], status.barriers[0]["barrier_id"]
    cards = []
    for name in topological_order([t["table_name"] for t in status.tables], status.edges):
        rows = status.delays.get(name, [])
        delays = [r["e2e_delay_s"] for r in rows]
        figures = (
            f"latest <b>{duration(delays[-1])}</b> · max {duration(max(delays))}"
            if delays
            else "no data"
        )
        logged = [r["log_delay_s"] for r in rows if r.get("log_delay_s") is not None]
        if logged:  # the table has a log (docs/log.md): its tier's delay beside
            figures += f' · <span class="log-delay">log {duration(logged[-1])}</span>'

        cards.append(
            f'<figure class="chart" data-table="{escape(name)}"><figcaption>'
            f'<span class="key-cell">{escape(name)}</span><span>{figures}</span></figcaption>'
            f"{delay_chart(name, rows, first, last)}</figure>"
        )
    return f'<div class="charts">{"".join(cards)}</div>'


def _timeline(status: Status) -> str:
    shown = status.barriers[:TIMELINE_BARRIERS]
    if not shown:
        return '<p class="empty">No barrier issued yet.</p>'
    scale = _timeline_scale(shown, status.now)
    rank = {
        t: i
        for i, t in enumerate(
            topological_order([t["table_name"] for t in status.tables], status.edges)
        )
    }
    legend = (
        '<p class="legend"><span class="key seg-key proc"></span>issued → PROCESSED '
        '<span class="key seg-key write"></span>PROCESSED → WRITTEN '
        '<span class="key seg-key pending"></span>not finished yet '
        f"· full width = {duration(scale)} after the issue</p>"
    )
    return (
        f'{legend}<div id="timeline" data-scale-s="{scale!r}">'
        + "".join(_barrier(b, scale, status.now, rank) for b in shown)
        + "</div>"
    )


def _offsets(
    barrier: Mapping[str, Any], table: Mapping[str, Any]
) -> tuple[float | None, float | None]:
    """Seconds from the barrier's issue to the table's PROCESSED and WRITTEN (None: not yet)."""
    issued: datetime = barrier["issued_at"]
    processed, written = table["processed_at"], table["written_at"]
    return (
        None if processed is None else (processed - issued).total_seconds(),
        None if written is None else (written - issued).total_seconds(),
    )


def _timeline_scale(barriers: Sequence[Mapping[str, Any]], now: datetime | None) -> float:
    """One time scale for every barrier shown (so bars compare): the longest finished step;
    an unfinished one runs off the end rather than squash the rest."""
    ends = [o for b in barriers for t in b["tables"] for o in _offsets(b, t) if o is not None]
    if not ends and now is not None:
        ends = [(now - barriers[-1]["issued_at"]).total_seconds()]
    return max([*ends, 1e-3])


def _barrier(
    barrier: Mapping[str, Any], scale: float, now: datetime | None, rank: Mapping[str, int]
) -> str:
    state = barrier["state"]
    words = {
        "COMMIT": "written in all",
        "PRECOMMIT": "processed in all",
        "ISSUED": "in flight",
        "SKIPPED": "skipped by a catch-up run",
    }
    done = [w for t in barrier["tables"] if (w := _offsets(barrier, t)[1]) is not None]
    took = f" · done after {duration(max(done))}" if state == "COMMIT" and done else ""
    tables = sorted(barrier["tables"], key=lambda t: rank.get(t["table_name"], len(rank)))
    lanes = "".join(_lane(barrier, t, scale, now) for t in tables)
    return (
        f'<div class="barrier" data-barrier="{barrier["barrier_id"]}" data-state="{state}">'
        f'<div class="barrier-head"><b>#{barrier["barrier_id"]}</b> '
        f'<span class="pill {state.lower()}">{words.get(state, state)} '
        f"{barrier['tables_written']}/{barrier['tables_in_scope']}</span> "
        f"<small>issued {_clock(barrier['issued_at'])}{took}</small></div>{lanes}</div>"
    )


def _lane(
    barrier: Mapping[str, Any], table: Mapping[str, Any], scale: float, now: datetime | None
) -> str:
    processed, written = _offsets(barrier, table)
    pending = (
        (now - barrier["issued_at"]).total_seconds() if now is not None and written is None else 0
    )

    def pct(seconds: float) -> float:
        return min(max(seconds / scale * 100, 0.0), 100.0)

    segments = []
    if processed is not None:
        segments.append(("proc", 0.0, processed))
    if written is not None:
        segments.append(("write", processed or 0.0, written))
    elif pending:
        segments.append(("pending", written or processed or 0.0, pending))
    bars = "".join(
        f'<span class="seg {cls}" style="left:{pct(a):.2f}%;'
        f'width:{max(pct(b) - pct(a), 0.6):.2f}%"></span>'
        for cls, a, b in segments
    )
    times = (
        f"P +{duration(processed)} · W +{duration(written)}"
        if written is not None
        else (
            f"P +{duration(processed)} · not WRITTEN yet"
            if processed is not None
            else "not PROCESSED yet"
        )
    )
    return (
        f'<div class="lane" data-table="{escape(table["table_name"])}" '
        f'data-processed-s="{processed if processed is not None else ""}" '
        f'data-written-s="{written if written is not None else ""}">'
        f'<span class="lane-name">{escape(table["table_name"])}</span>'
        f'<span class="track">{bars}</span><span class="lane-times">{times}</span></div>'
    )


def _about(status: Status) -> str:
    return f"""<section class="about"><h2>Reading this page</h2><ul>
<li><b>e2e delay</b> of a table at a barrier: from the barrier's issue to the table's version
being WRITTEN (<code>__META_DELAY</code>). Hover a point for its writer's wait and own cost.</li>
<li><b>log</b>, for a table with a log tier: the latest barrier's delay from its issue to its
changes being in the table's Kafka log (<code>__META_DELAY.log_delay_s</code>).</li>
<li><b>bottleneck</b>: take the last barrier written in every table and its last table to be
WRITTEN; on that table's critical path (follow the source that became available last, up to a
root) it is the job with the largest own cost (WRITTEN - started).</li>
<li><b>running</b>: a live instance works on a barrier; <b>waiting</b>: a live instance waits
for its next barrier; <b>not running</b>: no heartbeat for a while, or never attached.</li>
<li><b>barrier issuer</b> (a replica running the barrier ticker): issuing, on standby (another
issuer leads), or holding back: as many barriers in flight as its cap allows, waiting for the
jobs that write the slowest tables.</li>
<li><b>timeline</b>: per table, from the barrier's issue to PROCESSED (light) and to WRITTEN
(dark); striped: not finished yet.</li>
<li>Cost: each refresh reads the last {status.window} barriers only, never a whole history.
The same data as JSON: <code>GET /v1/status</code>.</li></ul></section>"""


def _clock(at: datetime | None) -> str:
    return "-" if at is None else at.strftime("%H:%M:%S UTC")


def _iso(at: datetime | None) -> str:
    return "" if at is None else at.isoformat()
