"""The dashboard page's HTML template and its script (inline: the page opens from a file).

The script reads the series (`dashboard_data.series`) from `<script id="data">` and draws one
small SVG plot per (head, pass) of the chosen machine, dtype, batch and metric, a line per
backend, a point's value in its tooltip (`<title>`), one shared legend above the plots. Points
of a % of roofline measured under the old ceiling model, or above 100%, are drawn hollow and
grey, and left out of the line. Filters (machine, dtype, pass, batch, metric) also hide the
table rows that do not match; the URL fragment sets them.

When it has run, it marks the body for the browser test: `data-status="ready" data-plots=N
data-blank=K data-errors=... data-summarytop=Y` (K: plots without a point; Y: the summary
table's top in CSS pixels, to check it is on the first screen).
"""

TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>glai-kernels benchmark dashboard</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 0 1.5em 1.5em; color: #222; }}
h1 {{ font-size: 20px; margin: .5em 0 .2em; }} h2 {{ font-size: 16px; margin: 1em 0 .3em; }}
p.lead {{ margin: .2em 0; font-size: 13px; }}
table {{ border-collapse: collapse; font-size: 12px; }}
td, th {{ border: 1px solid #ddd; padding: 2px 6px; text-align: right; }}
th {{ background: #f4f4f4; }}
tr.winner td {{ background: #e8f5e9; font-weight: 600; }}
#summary small {{ color: #555; }} #summary small span {{ color: #000; padding: 0 2px; }}
#summary .worse {{ background: #f8c9c2; }} #summary .better {{ background: #cdebc8; }}
#filters {{ position: sticky; top: 0; z-index: 1; background: #fff; padding: .4em 0;
  border-bottom: 1px solid #eee; font-size: 13px; }}
label {{ margin-right: 1.2em; }} [hidden] {{ display: none !important; }}
#legend span {{ margin-right: 1.2em; font-size: 12px; white-space: nowrap; }}
#legend i {{ display: inline-block; width: 18px; height: 3px; vertical-align: middle;
  margin-right: 4px; }}
.plotrow {{ display: flex; flex-wrap: wrap; gap: 4px; margin-bottom: .4em; }}
.plotrow h3 {{ width: 100%; font-size: 13px; margin: .4em 0 0; }}
svg.plot {{ border: 1px solid #e4e4e4; background: #fff; }}
svg.plot text {{ font-size: 9px; fill: #444; }} svg.plot .title {{ font-size: 11px; fill: #000; }}
</style></head>
<body data-status="loading">
<h1>glai-kernels benchmark dashboard</h1>
<p class="lead">{n_records} recorded runs on {machines}; latest: {latest_run}.
Speedup = the baseline backend's time ({baselines}) over the backend's, same run.</p>
<div id="filters">{filters} <span id="shown"></span></div>
<h2>What changed: latest run, B = {batch}, speedup over the baseline</h2>
<p class="lead">Each cell: the latest speedup; change vs the previous run · vs the best of the
{best_of} runs before it. <b style="background:#f8c9c2">Red</b>: worse,
<b style="background:#cdebc8">green</b>: better, beyond the noise band ±{band}: {band_source}
(the history has no repeated runs of unchanged code to measure its own spread).</p>
<table id="summary"><thead><tr><th>machine</th><th>dtype</th><th>pass</th><th>head</th>
{summary_head}</tr></thead>
<tbody>
{summary}
</tbody></table>
<h2>Across runs, one plot per head and pass</h2>
<p class="lead">Oldest run left; hover a point for its value. Hollow grey points: a % of
roofline from a run before the physical ceilings (issue 15: no native FMA peak recorded, the
library GEMM's rate as the ceiling) or above 100%; they are left out of the lines.</p>
<div id="legend"></div>
<div id="plots"></div>
<h2>Latest run, every measurement</h2>
<p>Bold green: the fastest backend that matched the float64 oracle for that shape. Absolute
times on shared machines are noise: read the ratios.</p>
<table id="latest"><thead><tr><th>machine</th><th>backend</th><th>head</th><th>B</th><th>I</th>
<th>P</th><th>O</th><th>μ %</th><th>dtype</th><th>pass</th><th>median ms</th><th>speedup</th>
<th>% roofline</th><th>GFLOP/s</th><th>status</th></tr></thead>
<tbody>
{latest}
</tbody></table>
<h2>Runs</h2>
<table id="runs"><thead><tr><th>date</th><th>commit</th><th>machine</th><th>device</th>
<th>preset</th><th>measurements</th><th>load avg</th><th>command</th></tr></thead>
<tbody>
{runs}
</tbody></table>
<p>Generated {generated} by <code>glai-bench dashboard</code> (<code>nox -s dashboard</code>)
from <code>reports/history/</code>.</p>
<script type="application/json" id="data">{data}</script>
<script>
{script}
</script>
</body></html>
"""

SCRIPT = """
"use strict";
const errors = [];
window.addEventListener("error", (e) => { errors.push(String(e.message)); report(); });
const consoleError = console.error.bind(console);
console.error = (...args) => { errors.push(args.map(String).join(" ")); consoleError(...args); };
const DATA = JSON.parse(document.getElementById("data").textContent);
const filters = Array.from(document.querySelectorAll("select[data-filter]"));
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                "#7f7f7f", "#bcbd22", "#17becf"];
const METRIC = {speedup: ["s", "speedup (×)"], roof: ["r", "% of roofline"],
                ms: ["t", "median ms"]};
const SVG = "http://www.w3.org/2000/svg";
const W = 215, H = 150, L = 36, R = 8, T = 16, B = 36;

function want() {
  const w = {};
  for (const f of filters) w[f.dataset.filter] = f.value;
  return w;
}

function applyFilters() {
  const w = want();
  for (const el of document.querySelectorAll("tr[data-machine]")) {
    el.hidden = !["machine", "dtype", "pass"].every((k) => {
      const have = el.dataset[k === "pass" ? "pass_" : k];
      return !w[k] || have === undefined || have === w[k];
    });
  }
  const shown = drawPlots(w);
  document.getElementById("shown").textContent = shown + " plots shown";
  const hash = Object.entries(w).filter(([k, v]) => v && v !== DATA.defaults[k])
    .map(([k, v]) => k + "=" + encodeURIComponent(v)).join("&");
  history.replaceState(null, "", hash ? "#" + hash : location.pathname);
}

function fromHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  for (const f of filters) {
    const v = params.get(f.dataset.filter);
    if (v !== null && Array.from(f.options).some((o) => o.value === v)) f.value = v;
  }
}

function el(tag, attrs, parent, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

function fmt(v) { return Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3); }

function suspect(metric, runs, i, v) {
  return metric === "roof" && (runs[i].old_model || v > 100);
}

function plot(head, lines, runs, metric, colors) {
  const key = METRIC[metric][0];
  const svg = el("svg", {class: "plot", width: W, height: H, "data-head": head});
  // ratios and times on a log scale (a 2x change looks the same at any level); shares linear
  const log = metric !== "roof";
  const f = log ? (v) => Math.log(Math.max(v, 1e-12)) : (v) => v;
  const inv = log ? Math.exp : (v) => v;
  const values = [];
  for (const s of lines) for (const v of s[key]) if (v !== null) values.push(f(v));
  if (metric === "speedup") values.push(0);
  let lo = Math.min(...values), hi = Math.max(...values);
  if (hi - lo < 1e-9 * Math.max(1, Math.abs(hi))) { lo -= 0.5; hi += 0.5; }
  const pad = 0.06 * (hi - lo); lo -= pad; hi += pad;
  const n = runs.length;
  const x = (i) => L + (n > 1 ? i * (W - L - R) / (n - 1) : (W - L - R) / 2);
  const y = (v) => T + (hi - f(v)) * (H - T - B) / (hi - lo);
  el("text", {x: L, y: 11, class: "title"}, svg, head);
  for (const share of [0, 0.5, 1]) {
    const v = inv(lo + pad + share * (hi - lo - 2 * pad));
    el("line", {x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#eee"}, svg);
    el("text", {x: L - 3, y: y(v) + 3, "text-anchor": "end"}, svg, fmt(v));
  }
  if (metric === "speedup") {
    el("line", {x1: L, x2: W - R, y1: y(1), y2: y(1), stroke: "#999",
                "stroke-dasharray": "3 2"}, svg);
  }
  // commit labels: short hashes, rotated, at most six (always the latest run)
  const step = Math.max(1, Math.ceil(n / 6));
  for (let i = 0; i < n; i += 1) {
    if ((n - 1 - i) % step !== 0) continue;
    el("text", {x: x(i), y: H - B + 10, "text-anchor": "end",
                transform: `rotate(-40 ${x(i)} ${H - B + 10})`}, svg, runs[i].commit);
  }
  let points = 0;
  for (const s of lines) {
    const color = colors[s.k];
    let path = "";
    s[key].forEach((v, i) => {
      if (v === null) return;
      const odd = suspect(metric, runs, i, v);
      if (!odd) path += (path ? " L" : "M") + x(i).toFixed(1) + " " + y(v).toFixed(1);
      const dot = el("circle", {cx: x(i), cy: y(v), r: 2.6, fill: odd ? "none" : color,
                                stroke: odd ? "#999" : color}, svg);
      const note = odd ? (runs[i].old_model ? " (old roofline model)" : " (above 100%)") : "";
      el("title", {}, dot,
         `${s.k}: ${fmt(v)} ${METRIC[metric][1]}${note}\\n${runs[i].commit} ${runs[i].date}`);
      points += 1;
    });
    if (path) {
      svg.insertBefore(el("path", {d: path, fill: "none", stroke: color, "stroke-width": 1.4}),
                       svg.querySelector("circle"));
    }
  }
  svg.dataset.points = String(points);
  return svg;
}

function drawPlots(w) {
  const box = document.getElementById("plots");
  box.textContent = "";
  const machine = w.machine || DATA.defaults.machine;
  const runs = DATA.runs[machine];
  const metric = w.metric || "speedup";
  const batch = Number(w.batch || DATA.defaults.batch);
  const chosen = DATA.series.filter((s) => s.m === machine && s.b === batch &&
    (!w.dtype || s.d === w.dtype) && (!w.pass || s.p === w.pass) &&
    !(metric === "speedup" && DATA.baselines.includes(s.k)) &&
    s[METRIC[metric][0]].some((v) => v !== null));
  const backends = [...new Set(DATA.series.map((s) => s.k))].sort();
  const colors = {};
  backends.forEach((k, i) => { colors[k] = COLORS[i % COLORS.length]; });
  const used = new Set(chosen.map((s) => s.k));
  const legend = document.getElementById("legend");
  legend.innerHTML = `<b>${machine}</b>, B = ${batch}, ${METRIC[metric][1]}: ` +
    backends.filter((k) => used.has(k))
      .map((k) => `<span><i style="background:${colors[k]}"></i>${k}</span>`).join("");
  let shown = 0;
  const groups = [...new Set(chosen.map((s) => s.d + "\\u0000" + s.p))]
    .sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  for (const g of groups) {
    const [dtype, pass] = g.split("\\u0000");
    const row = document.createElement("div");
    row.className = "plotrow";
    Object.assign(row.dataset, {machine, dtype, pass_: pass, batch: String(batch), metric});
    const title = document.createElement("h3");
    title.textContent = `${dtype} · ${pass}`;
    row.appendChild(title);
    const mine = chosen.filter((s) => s.d === dtype && s.p === pass);
    for (const head of DATA.heads) {
      const lines = mine.filter((s) => s.h === head);
      if (!lines.length) continue;
      row.appendChild(plot(head, lines, runs, metric, colors));
      shown += 1;
    }
    box.appendChild(row);
  }
  if (!shown) box.textContent = "Nothing measured for this choice.";
  return shown;
}

function rank(group) {
  const [dtype, pass] = group.split("\\u0000");
  const d = DATA.dtypes.indexOf(dtype), p = DATA.passes.indexOf(pass);
  return 100 * (d < 0 ? 99 : d) + (p < 0 ? 99 : p);
}

function report() {
  document.body.dataset.errors = errors.join(" | ");
}

function check() {
  const plots = Array.from(document.querySelectorAll("svg.plot"));
  document.body.dataset.plots = String(plots.length);
  document.body.dataset.blank = String(plots.filter((p) => p.dataset.points === "0").length);
  const top = document.getElementById("summary").getBoundingClientRect().top + window.scrollY;
  document.body.dataset.summarytop = String(Math.round(top));
  report();
  document.body.dataset.status = "ready";
}

for (const f of filters) f.addEventListener("change", applyFilters);
try { fromHash(); applyFilters(); } catch (e) { errors.push(String(e)); report(); }
window.addEventListener("load", () => {
  try { check(); } catch (e) { errors.push(String(e)); report(); }
});
"""
