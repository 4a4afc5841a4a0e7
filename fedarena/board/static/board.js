// fedarena board: the pages' behaviour (filter/sort, live curves, comparison, lineage, profile charts).
// Data from the server arrives as JSON (the #board-data block and /api/ endpoints); every string from a run
// folder is put into the page with textContent or, for Plotly, HTML-escaped (Plotly renders a subset of
// HTML in its labels and turns entities back into text).
"use strict";

const DATA = JSON.parse(document.getElementById("board-data").textContent || "{}");
const POLL_MS = DATA.poll_ms || 1000;
const PLOT_CONFIG = { displaylogo: false, responsive: true, displayModeBar: false };  // drag zooms, double-click resets

function esc(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

function layout(title, extra) {
  const legend = !extra || extra.showlegend !== false;
  return Object.assign({
    title: { text: esc(title), font: { size: 13 } }, height: legend ? 320 : 280,
    margin: { l: 55, r: 15, t: 36, b: legend ? 85 : 40 },
    font: { size: 11 }, showlegend: legend, legend: { orientation: "h", y: -0.3 }, uirevision: "keep",
  }, extra || {});
}

async function getJSON(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    for (const item of [].concat(v)) q.append(k, item);
  }
  const r = await fetch(path + "?" + q.toString(), { cache: "no-store" });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function xLabel(xkey) {
  return { step: "step", wall_time: "wall time (s)", env_steps: "environment steps" }[xkey] || xkey;
}

function isNum(v) { return typeof v === "number" && isFinite(v); }

function scalarKeys(rows) {
  const keys = new Set();
  for (const r of rows) for (const [k, v] of Object.entries(r)) {
    if (k !== "step" && k !== "wall_time" && typeof v === "number") keys.add(k);
  }
  return [...keys];
}

const MAX_POINTS = 4000;  // a longer curve is drawn from every k-th point (and its last)

function series(rows, key, xkey) {
  let x = [], y = [];
  for (const r of rows) {
    if (key in r && xkey in r) { x.push(r[xkey]); y.push(isNum(r[key]) ? r[key] : null); }
  }
  if (x.length > MAX_POINTS) {
    const k = Math.ceil(x.length / MAX_POINTS), keep = (_, i) => i % k === 0 || i === x.length - 1;
    x = x.filter(keep); y = y.filter(keep);
  }
  return { x, y };
}

// The kind's default curves among the metric names `keys` (fedarena/board/curves.py's DefaultCurve.pick).
function defaultMetrics(curve, keys) {
  if (!curve) return [];
  const exact = curve.names.filter((n) => keys.includes(n));
  const bySuffix = keys.filter((k) => !exact.includes(k) && curve.suffixes.some((s) => k.endsWith("/" + s)));
  return exact.concat(bySuffix).slice(0, 6);
}

// A run's metric rows, read incrementally from /api/metrics a page at a time (reset when the file was replaced).
class MetricsFeed {
  constructor(id) { this.id = id; this.rows = []; this.offset = 0; this.file = ""; this.malformed = 0; }
  async poll() {
    let grew = false;
    for (let page = 0; page < 64; page++) {  // at most 64 pages a poll; the next poll goes on
      const d = await getJSON("/api/metrics", { id: this.id, offset: this.offset, file: this.file });
      if (d.reset) { this.rows = []; this.malformed = 0; }
      for (const r of d.rows) this.rows.push(r);
      this.offset = d.offset; this.file = d.file; this.malformed += d.malformed;
      grew = grew || d.rows.length > 0 || d.reset;
      if (!d.more) break;
    }
    return grew;
  }
}

// ---------------------------------------------------------------- runs list
function runsPage() {
  const table = document.getElementById("runs");
  const rows = [...table.querySelectorAll("tbody tr")];
  const filter = document.getElementById("filter");
  const kind = document.getElementById("kind-filter");
  const state = document.getElementById("state-filter");
  const count = document.getElementById("shown-count");
  const compare = document.getElementById("compare-selected");
  function apply() {
    const q = filter.value.trim().toLowerCase();
    let shown = 0;
    for (const tr of rows) {
      const d = tr.dataset;
      const text = [d.kind, d.name, d.state, d.id].join(" ").toLowerCase();
      const ok = (!q || text.includes(q)) && (!kind.value || d.kind === kind.value) && (!state.value || d.state === state.value);
      tr.hidden = !ok;
      if (ok) shown += 1;
    }
    count.textContent = shown + " of " + rows.length + " shown";
  }
  for (const c of [filter, kind, state]) c.addEventListener("input", apply);
  apply();
  for (const th of table.querySelectorAll("th[data-key]")) {
    th.classList.add("sort-key");
    th.addEventListener("click", () => {
      const key = th.dataset.key, numeric = th.dataset.type === "number";
      const asc = !th.classList.contains("sorted-asc");
      for (const o of table.querySelectorAll("th")) o.classList.remove("sorted-asc", "sorted-desc");
      th.classList.add(asc ? "sorted-asc" : "sorted-desc");
      rows.sort((a, b) => {
        let x = a.dataset[key], y = b.dataset[key];
        if (numeric) { x = parseFloat(x); y = parseFloat(y); }
        const c = x < y ? -1 : x > y ? 1 : 0;
        return asc ? c : -c;
      });
      const body = table.querySelector("tbody");
      for (const tr of rows) body.appendChild(tr);
    });
  }
  const boxes = [...table.querySelectorAll(".select-run")];
  const selected = () => boxes.filter((b) => b.checked).map((b) => b.value);
  for (const b of boxes) b.addEventListener("change", () => { compare.disabled = selected().length < 2; });
  compare.addEventListener("click", () => {
    const q = new URLSearchParams();
    for (const id of selected()) q.append("id", id);
    window.location.href = "/compare?" + q.toString();
  });
  drawGroupBands();
  // status and progress of the listed runs, refreshed every 5 s (new run folders are counted, not inserted)
  const note = document.getElementById("new-runs");
  async function refresh() {
    const runs = await getJSON("/api/runs", {});
    const byId = new Map(rows.map((tr) => [tr.dataset.id, tr]));
    let fresh = 0;
    for (const r of runs) {
      const tr = byId.get(r.id);
      if (!tr) { fresh += 1; continue; }
      tr.dataset.state = r.state;
      tr.dataset.progress = String(r.progress === null ? -1 : r.progress);
      tr.className = "run-row state-" + r.state;
      const badge = tr.querySelector(".state");
      badge.textContent = r.state; badge.className = "state state-" + r.state;
      const bar = tr.querySelector("progress");
      if (bar && r.progress !== null) bar.value = r.progress;
      const step = tr.querySelector(".step-text");
      if (step && r.progress_text) step.textContent = r.progress_text;
    }
    note.textContent = fresh ? fresh + " new run" + (fresh > 1 ? "s" : "") + " since this page loaded: reload to list them" : "";
  }
  const loop = () => refresh().catch(() => {}).finally(() => setTimeout(loop, 5 * POLL_MS));
  setTimeout(loop, 5 * POLL_MS);
}

// The band over seeds of each group's default curve, as a sparkline (min-max area, mean line) beside its final value.
async function drawGroupBands() {
  if (!(DATA.groups || []).length) return;
  const groups = await getJSON("/api/groups", {});
  const fmt = (v) => (v === null || v === undefined ? "-" : Number(v).toPrecision(4));
  const NS = "http://www.w3.org/2000/svg";
  for (const g of groups) {
    const tr = document.querySelector('#groups tr[data-id="' + CSS.escape(g.id) + '"]');
    if (!tr) continue;
    const cell = tr.querySelector(".band"), final = tr.querySelector(".band-final");
    if (!g.band) { cell.querySelector(".band-label").textContent = "no default curve logged"; continue; }
    const s = g.band.svg;
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("width", s.width); svg.setAttribute("height", s.height); svg.setAttribute("class", "sparkline");
    const area = document.createElementNS(NS, "polygon");
    area.setAttribute("points", s.band); area.setAttribute("class", "band-area");
    const line = document.createElementNS(NS, "polyline");
    line.setAttribute("points", s.mean); line.setAttribute("class", "band-mean");
    svg.append(area, line);
    cell.prepend(svg);
    cell.dataset.metric = g.band.metric;
    cell.querySelector(".band-label").textContent = " " + g.band.metric + " vs " + (g.band.x === "env_steps" ? "environment steps" : g.band.x) + ", " + g.band.seeds + " seeds";
    final.textContent = fmt(g.band.final.mean) + " [" + fmt(g.band.final.min) + ", " + fmt(g.band.final.max) + "]";
  }
}

// ---------------------------------------------------------------- run page
function runPage() {
  const feed = new MetricsFeed(DATA.id);
  const picker = document.getElementById("metric-picker");
  const charts = document.getElementById("charts");
  const info = document.getElementById("rows-info");
  const live = document.getElementById("live-indicator");
  const checkedX = document.querySelector("input[name=xaxis]:checked");
  let state = DATA.state, known = [], chosen = null, xkey = checkedX ? checkedX.value : "step", flLoaded = false;

  for (const r of document.querySelectorAll("input[name=xaxis]")) {
    r.addEventListener("change", () => { xkey = r.value; charts.replaceChildren(); draw(); });
  }

  function updatePicker() {
    const keys = scalarKeys(feed.rows);
    if (chosen === null && keys.length) {  // the kind's default curves, else the summary's metrics, else any
      const byKind = defaultMetrics(DATA.curve, keys);
      const pref = (DATA.summary_keys || []).filter((k) => keys.includes(k));
      chosen = new Set((byKind.length ? byKind : pref.length ? pref : keys).slice(0, 6));
    }
    for (const k of keys) {
      if (known.includes(k)) continue;
      known.push(k);
      const label = el("label", { class: "metric-choice" });
      const box = el("input", { type: "checkbox" });
      box.checked = chosen.has(k);
      box.dataset.metric = k;
      box.addEventListener("change", () => { if (box.checked) chosen.add(k); else chosen.delete(k); draw(); });
      label.append(box, document.createTextNode(" " + k));
      picker.appendChild(label);
    }
  }

  function chartFor(i, key) {
    let div = document.getElementById("chart-" + i);
    if (!div) {
      div = el("div", { id: "chart-" + i, class: "chart metric-chart" });
      div.dataset.metric = key;
      charts.appendChild(div);
    }
    return div;
  }

  function draw() {
    if (xkey !== "step" && xkey !== "wall_time" && feed.rows.length && !feed.rows.some((r) => xkey in r)) {
      xkey = "step";  // the kind's x axis (env_steps) is not in this run's rows: fall back to the step
      const radio = document.querySelector("input[name=xaxis][value=step]");
      if (radio) radio.checked = true;
    }
    document.getElementById("no-metrics").hidden = feed.rows.length > 0;
    info.textContent = "(" + feed.rows.length + " rows" + (feed.malformed ? ", " + feed.malformed + " malformed lines skipped" : "") + ")";
    known.forEach((key, i) => {
      const div = document.getElementById("chart-" + i);
      if (!chosen.has(key)) { if (div) div.remove(); return; }
      const s = series(feed.rows, key, xkey);
      const d = chartFor(i, key);
      d.dataset.points = String(s.x.length);
      Plotly.react(d, [{ x: s.x, y: s.y, mode: s.x.length > 200 ? "lines" : "lines+markers", name: esc(key),
        marker: { size: 4 }, line: { width: 1.5 } }],
      layout(key, { showlegend: false, xaxis: { title: { text: xLabel(xkey) } } }), PLOT_CONFIG);
    });
    // keep the charts in the picker's order
    known.forEach((key, i) => { const d = document.getElementById("chart-" + i); if (d) charts.appendChild(d); });
    if (DATA.fl) drawFLRounds();
  }

  function drawFLRounds() {
    const rows = feed.rows;
    const acc = [];
    const names = { test_acc: "global model, test set", client_acc_mean: "clients' held-out: mean",
      client_acc_p10: "clients: 10th percentile", client_acc_worst: "worst client" };
    for (const k of ["client_acc_worst", "client_acc_p10", "client_acc_mean", "test_acc"]) {
      const s = series(rows, k, "step");
      if (!s.x.length) continue;
      acc.push({ x: s.x, y: s.y, name: names[k], mode: "lines+markers", marker: { size: 4 },
        fill: k === "client_acc_p10" || k === "client_acc_mean" ? "tonexty" : "none", line: { width: k === "test_acc" ? 2.5 : 1.2 } });
    }
    Plotly.react("fl-accuracy", acc, layout("accuracy per round", { xaxis: { title: { text: "round" } }, yaxis: { range: [0, 1] } }), PLOT_CONFIG);
    const bytes = [];
    for (const [k, n] of [["bytes_up", "up"], ["bytes_down", "down"]]) {
      const s = series(rows, k, "step");
      if (s.x.length) bytes.push({ x: s.x, y: s.y.map((v) => (v === null ? null : v / 1e3)), name: n, type: "bar" });
    }
    Plotly.react("fl-bytes", bytes, layout("kB per round (exact encoded bytes)", { barmode: "group", xaxis: { title: { text: "round" } } }), PLOT_CONFIG);
  }

  async function drawFLData() {
    const d = await getJSON("/api/fl", { id: DATA.id });
    const probs = document.getElementById("fl-problems");
    probs.textContent = d.problems.join("; ");
    if (d.label_histogram) {
      const h = d.label_histogram, classes = h.length ? h[0].length : 0, x = h.map((_, i) => i);
      const traces = [];
      for (let c = 0; c < classes; c++) traces.push({ x, y: h.map((row) => row[c]), name: "class " + c, type: "bar" });
      const title = "label histogram per client" + (d.clients > d.clients_shown ? " (first " + d.clients_shown + " of " + d.clients + ")" : "");
      Plotly.react("fl-labels", traces, layout(title, { barmode: "stack", xaxis: { title: { text: "client" } }, yaxis: { title: { text: "examples" } } }), PLOT_CONFIG);
    } else {
      document.getElementById("fl-labels").textContent = "no label_histogram.npy in this run";
    }
    const box = document.getElementById("fl-clients");
    if (d.personalization) {
      const p = d.personalization, clean = (a) => a.filter((v) => v !== null);
      Plotly.react(box, [
        { x: clean(p.before), type: "histogram", name: "global model", opacity: 0.7, xbins: { start: 0, end: 1.0001, size: 0.05 } },
        { x: clean(p.after), type: "histogram", name: "after local fine-tuning", opacity: 0.7, xbins: { start: 0, end: 1.0001, size: 0.05 } },
      ], layout("per-client held-out accuracy, final model (" + clean(p.before).length + " clients)", { barmode: "overlay", xaxis: { title: { text: "accuracy" } }, yaxis: { title: { text: "clients" } } }), PLOT_CONFIG);
    } else {
      const s = ["client_acc_worst", "client_acc_p10", "client_acc_mean"].map((k) => series(feed.rows, k, "step"));
      const last = (a) => (a.y.length ? a.y[a.y.length - 1] : null);
      box.textContent = "";
      Plotly.react(box, [{ type: "bar", x: ["worst", "10th percentile", "mean"], y: s.map(last), name: "last round" }],
        layout("per-client held-out accuracy, last round (the run logs worst / p10 / mean; personalize_epochs saves every client's)", { showlegend: false, yaxis: { range: [0, 1] } }), PLOT_CONFIG);
    }
  }

  async function drawLeague() {
    const d = await getJSON("/api/league", { id: DATA.id });
    const probs = [...d.problems];
    const box = document.getElementById("league-ratings");
    for (const [system, byPlayer] of Object.entries(d.ratings)) {
      const div = el("div", { class: "chart league-rating-chart" });
      div.dataset.system = system;
      box.appendChild(div);
      const players = Object.keys(byPlayer);
      Plotly.react(div, players.map((p) => ({ x: byPlayer[p].map((v) => v[0]), y: byPlayer[p].map((v) => v[1]), name: esc(p), mode: "lines+markers", marker: { size: 3 } })),
        layout(system + " over time (" + d.ratings_source + ")", { xaxis: { title: { text: "step" } } }), PLOT_CONFIG);
    }
    if (!Object.keys(d.ratings).length) probs.push("no ratings (ratings.jsonl, or elo/<player> metrics)");
    if (d.payoff) {
      const names = d.payoff.players.map(esc);
      const trace = { z: d.payoff.matrix, x: names, y: names, type: "heatmap", colorscale: "RdBu", reversescale: true,
        zmid: d.payoff.label === "win rate" ? 0.5 : 0, hoverongaps: false };
      if (d.payoff.games) { trace.customdata = d.payoff.games; trace.hovertemplate = "%{y} vs %{x}: %{z:.3f} (%{customdata} games)<extra></extra>"; }
      Plotly.react("league-payoff", [trace], layout("payoff: " + d.payoff.label + " of row vs column" + (d.payoff.games ? " (blank: never played)" : ""),
        { showlegend: false, height: 520, margin: { l: 150, r: 15, t: 36, b: 120 }, yaxis: { autorange: "reversed" } }), PLOT_CONFIG);
    } else probs.push("no payoff.json");
    document.getElementById("league-problems").textContent = probs.join("; ");
  }

  async function refreshRun() {
    const r = await getJSON("/api/run", { id: DATA.id });
    state = r.state;
    const s = document.getElementById("run-state");
    s.textContent = r.state; s.className = "state state-" + r.state;
    document.getElementById("run-progress").textContent = r.progress_text;
    document.getElementById("log").textContent = r.log;
    if (r.state === "failed" || r.state === "interrupted") {
      document.getElementById("failure").hidden = false;
      document.getElementById("failure-type").textContent = r.error_type || "";
      document.getElementById("failure-message").textContent = r.error || "";
    }
  }

  async function tick() {
    try {
      const grew = await feed.poll();
      updatePicker();
      if (grew || !charts.childElementCount) draw();
      if (state === "running") await refreshRun();
      if (DATA.fl && (!flLoaded || (grew && state !== "running"))) { flLoaded = true; await drawFLData(); }
    } catch (e) {
      info.textContent = "(board: " + e.message + ")";
    }
    live.hidden = state !== "running";
    if (state === "running") setTimeout(tick, POLL_MS);
    else if (!tick.final) { tick.final = true; setTimeout(tick, 0); }  // one more read after the run ends
  }
  tick();
  if (DATA.league) drawLeague().catch((e) => { document.getElementById("league-problems").textContent = e.message; });
}

// ---------------------------------------------------------------- compare
function comparePage() {
  if (!DATA.runs || !DATA.runs.length) return;
  const feeds = DATA.runs.map((r) => new MetricsFeed(r.id));
  const select = document.getElementById("compare-metric");
  let metric = null;
  select.addEventListener("change", () => { metric = select.value; draw(); });
  function draw() {
    const keysPer = feeds.map((f) => scalarKeys(f.rows));
    const all = [...new Set(keysPer.flat())];
    if (select.options.length !== all.length) {
      select.replaceChildren(...all.map((k) => el("option", { value: k }, k)));
    }
    const common = all.filter((k) => keysPer.every((ks) => ks.includes(k)));
    if (metric === null || !all.includes(metric)) {  // the kind's default curve, else the first shared summary metric
      const summary = DATA.runs.flatMap((r) => r.summary_keys);
      metric = defaultMetrics(DATA.curve, common)[0] || common.find((k) => summary.includes(k)) || common[0] || all[0] || null;
    }
    if (metric === null) return;
    select.value = metric;
    // the kind's x axis (environment steps for RL kinds) when every run logged it, else the step
    const x = DATA.curve && feeds.every((f) => f.rows.some((r) => DATA.curve.x in r)) ? DATA.curve.x : "step";
    for (const [div, xkey, title] of [["compare-step", x, "by " + xLabel(x)], ["compare-wall", "wall_time", "by wall time (s)"]]) {
      const traces = feeds.map((f, i) => {
        const s = series(f.rows, metric, xkey);
        return { x: s.x, y: s.y, name: esc(DATA.runs[i].label), mode: "lines+markers", marker: { size: 4 } };
      });
      Plotly.react(div, traces, layout(metric + " " + title, { xaxis: { title: { text: xLabel(xkey) } } }), PLOT_CONFIG);
      document.getElementById(div).dataset.traces = String(traces.filter((t) => t.x.length).length);
      document.getElementById(div).dataset.x = xkey;
      document.getElementById(div).dataset.metric = metric;
    }
  }
  async function tick() {
    let grew = false;
    for (const f of feeds) grew = (await f.poll()) || grew;
    if (grew || metric === null) draw();
    if (DATA.runs.some((r) => r.state === "running")) setTimeout(tick, 2 * POLL_MS);
  }
  tick().catch((e) => { select.replaceChildren(el("option", {}, e.message)); });
}

// ---------------------------------------------------------------- lineage
function lineagePage() {
  const div = document.getElementById("parcoords");
  if (!div) return;
  const dims = DATA.dimensions || [];
  if (!dims.length || !DATA.runs.length) { div.textContent = "Nothing to plot: no finished run with final numbers."; return; }
  const colorDim = dims.find((d) => d.label === DATA.color) || dims[dims.length - 1];
  const dimensions = dims.map((d) => {
    const o = { label: esc(d.label), values: d.values };
    if (d.ticktext) { o.tickvals = d.tickvals; o.ticktext = d.ticktext.map(esc); }
    return o;
  });
  Plotly.newPlot(div, [{ type: "parcoords", dimensions,
    line: { color: colorDim.values, colorscale: "Viridis", showscale: true, colorbar: { title: { text: esc(colorDim.label) } } } }],
  { height: 440, margin: { l: 70, r: 70, t: 100, b: 30 }, font: { size: 11 },
    title: { text: esc("config values vs final metrics, " + DATA.runs.length + " finished runs of " + DATA.kind), font: { size: 13 }, y: 0.97 } }, PLOT_CONFIG);
  div.dataset.dimensions = String(dims.length);
}

// ---------------------------------------------------------------- profile
function profilePage() {
  const p = DATA.profile;
  if (!p) return;
  const prims = Object.entries(p.by_primitive || {}).slice(0, 15).reverse();
  Plotly.newPlot("by-primitive", [{ type: "bar", orientation: "h", y: prims.map((kv) => esc(kv[0])), x: prims.map((kv) => kv[1] * 1e6) }],
    layout("time per primitive (µs, summed over its equations)", { showlegend: false, margin: { l: 130, r: 15, t: 36, b: 40 }, height: 360 }), PLOT_CONFIG);
  const blocks = ((p.memory || {}).blocks || []).filter((b) => b.offset !== null && b.offset !== undefined);
  if (blocks.length) {
    Plotly.newPlot("memory-plan", [{ type: "bar", x: blocks.map((b) => (b.first + b.last) / 2), width: blocks.map((b) => b.last - b.first + 1),
      base: blocks.map((b) => b.offset), y: blocks.map((b) => b.bytes), text: blocks.map((b) => esc(b.value)), textposition: "none",
      hovertemplate: "%{text}<br>%{y} B at offset %{base}<extra></extra>", marker: { line: { width: 1, color: "#333" } } }],
    layout("memory plan: arena offset (bytes) of each value over its lifetime (equations)", { showlegend: false, height: 360,
      xaxis: { title: { text: "equation" } }, yaxis: { title: { text: "byte offset" } }, bargap: 0 }), PLOT_CONFIG);
    document.getElementById("memory-plan").dataset.blocks = String(blocks.length);
  } else {
    document.getElementById("memory-plan").textContent = "no packed arena in this plan";
  }
}

const PAGES = { runs: runsPage, run: runPage, compare: comparePage, lineage: lineagePage, profile: profilePage };
(PAGES[document.body.dataset.page] || (() => {}))();
