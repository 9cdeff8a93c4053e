"""The status page's inline stylesheet and refresh script (no external asset)."""

from __future__ import annotations

PAGE_CSS = """
:root { --ink: #202124; --muted: #5f6368; --line: #dadce0; --bg: #f8f9fa;
  --run: #188038; --run-bg: #e6f4ea; --wait: #1a73e8; --wait-bg: #e8f0fe;
  --off: #c5221f; --off-bg: #fce8e6; --hot: #e8710a; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
  color: var(--ink); background: var(--bg); }
header.top { display: flex; align-items: baseline; gap: 16px; flex-wrap: wrap;
  padding: 12px 24px; background: #fff; border-bottom: 1px solid var(--line);
  position: sticky; top: 0; z-index: 1; }
h1 { font-size: 20px; margin: 0; }
h2 { font-size: 16px; margin: 0 0 10px; }
h2 small { color: var(--muted); font-weight: normal; }
main { max-width: 1280px; margin: 0 auto; padding: 16px 24px 40px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px;
  padding: 14px 16px; margin: 0 0 16px; min-width: 0; }
#refresh-note { font-size: 13px; color: var(--muted); }
#refresh-note.live::before { content: "● "; color: var(--run); }
#refresh-note.stale { color: var(--off); }
.chips { display: flex; flex-wrap: wrap; gap: 8px; margin: 0 0 16px; }
.chip { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 6px 12px; }
.chip .label { color: var(--muted); font-size: 13px; margin-right: 4px; }
#bottleneck { border-color: var(--hot); }
.chip .held, #issuer-note b:first-child { color: var(--off); }
#issuer-note { margin: -6px 0 16px; }
.dot { display: inline-block; width: 9px; height: 9px; border-radius: 50%; margin-left: 6px; }
.dot.running { background: var(--run); } .dot.waiting { background: var(--wait); }
.dot.not-running { background: var(--off); }
.scroll-x { overflow-x: auto; -webkit-overflow-scrolling: touch; }
#topology { display: block; max-width: 100%; height: auto; min-width: 520px; }
svg text { font: 13px system-ui, -apple-system, "Segoe UI", sans-serif; fill: var(--ink); }
svg text.name { font-weight: 600; } svg text.barrier, svg text.tick { fill: var(--muted); }
svg text.tick { font-size: 11px; }
svg text.badge { fill: #fff; font-size: 11px; font-weight: 600; }
.job-shape { stroke-width: 1.5; }
.job.running .job-shape { fill: var(--run-bg); stroke: var(--run); }
.job.waiting .job-shape { fill: var(--wait-bg); stroke: var(--wait); }
.job.not-running .job-shape { fill: var(--off-bg); stroke: var(--off); }
.job.running text.activity { fill: var(--run); } .job.waiting text.activity { fill: var(--wait); }
.job.not-running text.activity { fill: var(--off); }
.job.running .activity-dot { fill: var(--run); } .job.waiting .activity-dot { fill: var(--wait); }
.job.not-running .activity-dot { fill: var(--off); }
.legend { color: var(--muted); font-size: 13px; margin: -4px 0 8px; }
.key { display: inline-block; width: 16px; height: 11px; margin: 0 4px 0 10px;
  vertical-align: -1px; border: 1.5px solid; }
.key:first-child { margin-left: 0; }
.table-key { border-color: var(--muted); background: #fff; border-radius: 2px; }
.job-key { border-radius: 6px; }
.job-key.running { background: var(--run-bg); border-color: var(--run); }
.job-key.waiting { background: var(--wait-bg); border-color: var(--wait); }
.job-key.not-running { background: var(--off-bg); border-color: var(--off); }
.seg-key { border: none; border-radius: 2px; }
.hot-key { border: none; height: 3px; background: var(--hot); vertical-align: 3px; }
.note { margin: 10px 0 0; font-size: 14px; }
#bottleneck-note b:first-child { color: var(--hot); }
.two-up { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr));
  gap: 0 16px; }
table.cards { border-collapse: collapse; width: 100%; font-size: 14px; }
table.cards th { text-align: left; color: var(--muted); font-weight: 500; font-size: 13px;
  border-bottom: 1px solid var(--line); padding: 4px 8px; }
table.cards td { padding: 6px 8px; border-bottom: 1px solid #f1f3f4; vertical-align: top; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
.key-cell { font-weight: 600; overflow-wrap: anywhere; }
td.state small { color: var(--muted); display: block; }
.pill { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px;
  font-weight: 600; white-space: nowrap; }
.pill.running { background: var(--run-bg); color: var(--run); }
.pill.waiting { background: var(--wait-bg); color: var(--wait); }
.pill.not-running { background: var(--off-bg); color: var(--off); }
.pill.commit { background: var(--run-bg); color: var(--run); }
.pill.precommit { background: var(--wait-bg); color: var(--wait); }
.pill.issued { background: #fef7e0; color: #b06000; }
.pill.skipped { background: var(--off-bg); color: var(--off); }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr));
  gap: 12px; }
figure.chart { margin: 0; border: 1px solid #f1f3f4; border-radius: 6px; padding: 8px; }
figure.chart figcaption { display: flex; justify-content: space-between; gap: 8px;
  flex-wrap: wrap; font-size: 13px; color: var(--muted); }
figure.chart figcaption .key-cell { color: var(--ink); }
.delay-chart { display: block; width: 100%; height: auto; }
.delay-chart .grid { stroke: #e8eaed; } .delay-chart .line { fill: none; stroke: var(--wait);
  stroke-width: 2; } .delay-chart .area { fill: var(--wait-bg); }
.delay-chart .point { fill: #fff; stroke: var(--wait); stroke-width: 2; }
.barrier { padding: 8px 0; border-top: 1px solid #f1f3f4; }
.barrier:first-child { border-top: none; padding-top: 0; }
.barrier-head small { color: var(--muted); }
.lane { display: grid; grid-template-columns: minmax(7em, 13em) 1fr 13em; gap: 2px 10px;
  align-items: center; font-size: 13px; margin-top: 3px; }
.lane-name { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.lane-times { color: var(--muted); font-variant-numeric: tabular-nums; white-space: nowrap; }
.track { position: relative; height: 12px; background: #f1f3f4; border-radius: 3px;
  overflow: hidden; }
.seg { position: absolute; top: 0; bottom: 0; }
.seg.proc, .seg-key.proc { background: #aecbfa; }
.seg.write, .seg-key.write { background: var(--wait); }
.seg.pending, .seg-key.pending {
  background: repeating-linear-gradient(45deg, #dadce0 0 5px, #f1f3f4 5px 10px); }
.about ul { margin: 0; padding-left: 20px; color: var(--muted); font-size: 14px; }
.empty { color: var(--muted); }
@media (max-width: 640px) {
  body { font-size: 14px; }
  header.top { padding: 10px 12px; }
  main { padding: 12px 10px 32px; }
  section { padding: 12px 10px; }
  .two-up { grid-template-columns: minmax(0, 1fr); }
  #topology { max-width: none; min-width: 0; width: calc(var(--w) * 0.8px); }
  .charts { grid-template-columns: minmax(0, 1fr); }
  table.cards thead { display: none; }
  table.cards tr { display: grid; grid-template-columns: 1fr 1fr; gap: 2px 12px;
    padding: 8px 0; border-bottom: 1px solid var(--line); }
  table.cards td { border: none; padding: 0; text-align: left; }
  table.cards td.key-cell, table.cards td.state { grid-column: 1 / -1; }
  table.cards td:not(.key-cell):not(.state)::before { content: attr(data-label) ": ";
    color: var(--muted); }
  .lane { grid-template-columns: 1fr auto; }
  .lane .track { grid-column: 1 / -1; grid-row: 2; }
}
"""

# Fetches the page itself and swaps <main id="live">, keeping the scroll of the window and
# of the topology's box; stops asking while the tab is hidden; says when it failed.
REFRESH_JS = """
(function () {
  var every = Number(document.body.getAttribute("data-refresh-s")) * 1000 || 3000;
  var note = document.getElementById("refresh-note");
  function swap(fresh) {
    var x = window.scrollX, y = window.scrollY, inner = {};
    document.querySelectorAll("[data-keep-scroll]").forEach(function (el) {
      inner[el.id] = el.scrollLeft;
    });
    document.getElementById("live").replaceWith(document.adoptNode(fresh));
    Object.keys(inner).forEach(function (id) {
      var el = document.getElementById(id);
      if (el) { el.scrollLeft = inner[id]; }
    });
    window.scrollTo(x, y);
  }
  function refresh() {
    if (document.hidden) { setTimeout(refresh, every); return; }
    fetch(location.href, {cache: "no-store", credentials: "same-origin"})
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.text();
      })
      .then(function (text) {
        var page = new DOMParser().parseFromString(text, "text/html");
        var fresh = page.getElementById("live");
        if (!fresh) { throw new Error("the answer was not a status page"); }
        swap(fresh);
        note.className = "live";
        note.textContent = "live · updated " + new Date().toLocaleTimeString();
      })
      .catch(function (e) {
        note.className = "stale";
        note.textContent = "not updated: " + e.message + " (retrying)";
      })
      .then(function () { setTimeout(refresh, every); });
  }
  setTimeout(refresh, every);
})();
"""
