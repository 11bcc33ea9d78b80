"""The html report's script: draws its plots from the JSON embedded in the page, sorts its
tables, and shows any one workload's timeline.

Hand-written SVG and canvas, not plotly.js: the report needs step lines, a box per queue
and a heat map, which take a few hundred lines, while plotly.js inlined (so the page works
offline) weighed 4.8 MB of a 4.9 MB page. Loaded once per page.
"""

from __future__ import annotations

SCRIPT = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("report-data").textContent);
const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];
const tip = document.getElementById("tip");

function svg(tag, attrs, parent) {
  const e = document.createElementNS(SVG, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}
function text(parent, x, y, s, attrs) {
  const t = svg("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
  t.textContent = s;
  return t;
}
function ticks(lo, hi, n) {
  if (!(hi > lo)) hi = lo + 1;
  const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    out.push(+v.toFixed(9));
  }
  return out;
}
// Ticks for an axis from 0 whose last tick is at or above the largest value.
function axisTicks(hi, n) {
  const out = ticks(0, hi, n), step = out.length > 1 ? out[1] - out[0] : 1;
  while (out[out.length - 1] < hi) out.push(+(out[out.length - 1] + step).toFixed(9));
  return out;
}
function num(v) {
  return Math.abs(v) >= 100 ? Math.round(v).toLocaleString() : String(+v.toFixed(2));
}
function duration(s) {
  if (s < 1) return s > 0 ? Math.round(s * 1000) + "ms" : "0s";
  if (s < 60) return s < 10 ? s.toFixed(1) + "s" : Math.round(s) + "s";
  const t = Math.round(s), d = Math.floor(t / 86400), h = Math.floor((t % 86400) / 3600);
  const m = Math.floor((t % 3600) / 60), sec = t % 60, two = (x) => String(x).padStart(2, "0");
  if (d) return d + "d" + h + "h";
  if (h) return h + "h" + two(m) + "m";
  return m + "m" + two(sec) + "s";
}
function showTip(ev, html) {
  tip.innerHTML = html;
  tip.style.display = "block";
  tip.style.left = ev.pageX + 14 + "px";
  tip.style.top = ev.pageY + 10 + "px";
}
function hideTip() { tip.style.display = "none"; }
function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => "&#" + c.charCodeAt(0) + ";");
}

// A step chart: each value holds from its start to the next one's (the last to DATA.end).
// stacked: each series drawn on top of the ones before it, filled.
function stepChart(parent, spec) {
  const W = spec.width || 440, H = 226, L = 56, R = 12, T = 44, B = 40;
  const xs = spec.x, end = DATA.end;
  const tops = [];
  let acc = xs.map(() => 0);
  for (const s of spec.series) {
    acc = spec.stacked ? acc.map((v, i) => v + s.y[i]) : s.y;
    tops.push(acc);
  }
  const ymax = Math.max(1e-9, ...tops.map((t) => Math.max(0, ...t)));
  const yt = axisTicks(ymax * 1.05, 4), yhi = yt[yt.length - 1];
  const X = (v) => L + ((W - L - R) * v) / (end || 1), Y = (v) => T + (H - T - B) * (1 - v / yhi);
  const root = svg("svg", { width: W, height: H, class: "chart", role: "img" }, parent);
  text(root, L, 16, spec.title, { class: "title" });
  for (const v of yt) {
    svg("line", { x1: L, x2: W - R, y1: Y(v), y2: Y(v), class: "grid" }, root);
    text(root, L - 5, Y(v) + 4, num(v), { "text-anchor": "end" });
  }
  const mid = { "text-anchor": "middle" }, yMid = (T + H - B) / 2;
  for (const v of ticks(0, end, 5)) text(root, X(v), H - B + 15, num(v), mid);
  text(root, (L + W - R) / 2, H - 6, "simulated time (" + DATA.timeUnit + ")", mid);
  text(root, 12, yMid, spec.axis, Object.assign({ transform: `rotate(-90 12 ${yMid})` }, mid));
  const path = (y) => {
    let d = `M${X(xs[0]).toFixed(1)},${Y(y[0]).toFixed(1)}`;
    for (let i = 1; i < xs.length; i++) d += `H${X(xs[i]).toFixed(1)}V${Y(y[i]).toFixed(1)}`;
    return d + `H${X(end).toFixed(1)}`;
  };
  // Stacked areas from the top one down, so each lower one shows over it; lines in order,
  // so a dashed fair share stays visible where it equals the usage.
  const order = tops.map((_, k) => k);
  if (spec.stacked) order.reverse();
  for (const k of xs.length ? order : []) {
    const s = spec.series[k], color = s.color || COLORS[k % COLORS.length];
    if (spec.stacked) {
      const area = path(tops[k]) + `V${Y(0)}H${X(xs[0])}Z`;
      svg("path", { d: area, fill: color, "fill-opacity": 0.55, stroke: "none" }, root);
    }
    svg("path", { d: path(tops[k]), fill: "none", stroke: color, "stroke-width": 1.6,
      "stroke-dasharray": s.dash ? "5 3" : "none" }, root);
  }
  // The legend on its own line under the title: a long title never runs into it.
  let lx = L;
  spec.series.forEach((s, k) => {
    svg("line", { x1: lx, x2: lx + 16, y1: 28, y2: 28,
      stroke: s.color || COLORS[k % COLORS.length], "stroke-width": 2,
      "stroke-dasharray": s.dash ? "5 3" : "none" }, root);
    const t = text(root, lx + 20, 32, s.name, { class: "legend" });
    lx += 34 + (t.getComputedTextLength ? t.getComputedTextLength() : 7 * s.name.length);
  });
  const cursor = svg("line", { y1: T, y2: H - B, class: "cursor", visibility: "hidden" }, root);
  const hit = svg("rect", { x: L, y: T, width: W - L - R, height: H - T - B,
    fill: "transparent" }, root);
  hit.addEventListener("mousemove", (ev) => {
    const box = root.getBoundingClientRect(), v = ((ev.clientX - box.left - L) / (W - L - R)) * end;
    let i = 0;
    while (i + 1 < xs.length && xs[i + 1] <= v) i++;
    cursor.setAttribute("x1", X(v)); cursor.setAttribute("x2", X(v));
    cursor.setAttribute("visibility", "visible");
    const rows = spec.series.map((s) => `${esc(s.name)}: <b>${num(s.y[i])}</b>`).join("<br>");
    showTip(ev, `${num(v)} ${DATA.timeUnit}<br>${rows}`);
  });
  hit.addEventListener("mouseleave", () => {
    cursor.setAttribute("visibility", "hidden");
    hideTip();
  });
  return root;
}

function usageCharts() {
  const box = document.getElementById("usage");
  const byQueue = new Map();
  for (const s of DATA.usage) {
    if (!byQueue.has(s.queue)) byQueue.set(s.queue, []);
    byQueue.get(s.queue).push(s);
  }
  let open = 0;
  for (const [queue, list] of byQueue) {
    const details = document.createElement("details");
    details.className = "queue";
    details.dataset.queue = queue;
    const summary = document.createElement("summary");
    summary.textContent =
      `Queue ${queue}: usage against fair share (${list.length} flavor/resources)`;
    details.appendChild(summary);
    const grid = document.createElement("div");
    grid.className = "grid";
    details.appendChild(grid);
    // Drawn when first opened: a tree of hundreds of queues stays quick to load.
    const draw = () => {
      if (grid.childElementCount) return;
      for (const s of list) {
        stepChart(grid, { title: s.title, axis: s.axis, x: DATA.starts,
          series: [{ name: "usage", y: s.usage }, { name: "fair share", y: s.fair, dash: true }] });
      }
    };
    details.addEventListener("toggle", () => { if (details.open) draw(); });
    if (open++ < 8) details.open = true;
    box.appendChild(details);
    if (details.open) draw();
  }
}

function waitChart() {
  const box = document.getElementById("waits"), rows = DATA.waits;
  if (!rows.length) { box.textContent = "No workload waited."; return; }
  const top = Math.max(1, ...rows.map((r) => r.max));
  const [scale, unit] =
    top >= 3 * 3600 ? [3600, "hours"] : top >= 180 ? [60, "minutes"] : [1, "seconds"];
  const W = 720, L = 150, R = 20, T = 10, row = 30, H = T + row * rows.length + 40;
  const xt = axisTicks(top / scale, 6), hi = xt[xt.length - 1];
  const X = (s) => L + ((W - L - R) * s) / scale / hi;
  const root = svg("svg", { width: W, height: H, class: "chart" }, box);
  for (const v of xt) {
    svg("line", { x1: X(v * scale), x2: X(v * scale), y1: T, y2: H - 40, class: "grid" }, root);
    text(root, X(v * scale), H - 25, num(v), { "text-anchor": "middle" });
  }
  text(root, (L + W - R) / 2, H - 6, `wait (${unit})`, { "text-anchor": "middle" });
  rows.forEach((r, i) => {
    const y = T + i * row + row / 2, g = svg("g", {}, root);
    text(g, L - 8, y + 4, r.queue, { "text-anchor": "end" });
    svg("line", { x1: X(r.min), x2: X(r.max), y1: y, y2: y, stroke: "#555" }, g);
    svg("rect", { x: X(r.q1), y: y - 9, width: Math.max(1, X(r.q3) - X(r.q1)), height: 18,
      fill: COLORS[i % COLORS.length], "fill-opacity": 0.5, stroke: "#333" }, g);
    svg("line", { x1: X(r.median), x2: X(r.median), y1: y - 9, y2: y + 9, stroke: "#000",
      "stroke-width": 2 }, g);
    const says = `${esc(r.queue)}<br>shortest ${duration(r.min)}, p25 ${duration(r.q1)}, ` +
      `median ${duration(r.median)}, p75 ${duration(r.q3)}, longest ${duration(r.max)}`;
    g.addEventListener("mousemove", (ev) => showTip(ev, says));
    g.addEventListener("mouseleave", hideTip);
  });
}

// White (idle) to dark blue (full): occupancy reads at a glance, and empty nodes stand out.
function shade(f) {
  const stops = [[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
  const p = Math.min(1, Math.max(0, f)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(p)), r = p - i;
  return `rgb(${stops[i].map((c, k) => Math.round(c + (stops[i + 1][k] - c) * r)).join(",")})`;
}

function heatMap(parent, n) {
  const rows = n.nodes.length, cols = n.starts.length, L = 150, T = 8, B = 40, W = 900;
  const rh = Math.max(3, Math.min(18, Math.floor(640 / Math.max(1, rows))));
  const H = T + Math.max(rh * rows, 40) + B, cw = (W - L - 100) / (DATA.end || 1);
  const title = document.createElement("h3");
  title.textContent = n.title;
  parent.appendChild(title);
  const canvas = document.createElement("canvas");
  canvas.width = W; canvas.height = H; canvas.className = "heat";
  parent.appendChild(canvas);
  const g = canvas.getContext("2d"), X = (v) => L + v * cw;
  g.font = "11px system-ui, sans-serif";
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const x0 = X(n.starts[c]), x1 = c + 1 < cols ? X(n.starts[c + 1]) : X(DATA.end);
      g.fillStyle = shade(n.used[r][c] / (n.max || 1));
      g.fillRect(x0, T + r * rh, Math.max(1, x1 - x0 + 0.5), rh);
    }
    if (rh >= 9 || r % Math.ceil(9 / rh) === 0) {
      g.fillStyle = "#222"; g.textAlign = "right";
      g.fillText(n.nodes[r], L - 6, T + r * rh + rh / 2 + 4);
    }
  }
  g.fillStyle = "#222"; g.textAlign = "center";
  for (const v of ticks(0, DATA.end, 6)) g.fillText(num(v), X(v), T + rows * rh + 15);
  g.fillText("simulated time (" + DATA.timeUnit + ")", (L + X(DATA.end)) / 2, H - 8);
  const cx = W - 80;
  for (let y = 0; y < rows * rh; y++) {
    g.fillStyle = shade(1 - y / (rows * rh));
    g.fillRect(cx, T + y, 14, 1);
  }
  g.fillStyle = "#222"; g.textAlign = "left";
  g.fillText(num(n.max) + " " + n.unit, cx + 18, T + 10);
  g.fillText("0", cx + 18, T + rows * rh);
  canvas.addEventListener("mousemove", (ev) => {
    const box = canvas.getBoundingClientRect(), x = ev.clientX - box.left, y = ev.clientY - box.top;
    const r = Math.floor((y - T) / rh), v = (x - L) / cw;
    if (r < 0 || r >= rows || v < 0 || v > DATA.end) { hideTip(); return; }
    let c = 0;
    while (c + 1 < cols && n.starts[c + 1] <= v) c++;
    showTip(ev, `${esc(n.nodes[r])}<br>${num(n.starts[c])} ${DATA.timeUnit}<br>` +
      `<b>${num(n.used[r][c])}</b> of ${num(n.max)} ${n.unit} in use`);
  });
  canvas.addEventListener("mouseleave", hideTip);
}

function nodeCharts() {
  const box = document.getElementById("nodes");
  if (!box) return;
  for (const n of DATA.nodes) {
    heatMap(box, n);
    stepChart(box, { title: n.freeTitle, axis: n.axis, x: n.starts, width: 900, stacked: true,
      series: [{ name: "free on partly used nodes", y: n.partial, color: "#ff7f0e" },
               { name: "free on empty nodes", y: n.whole, color: "#2ca02c" }] });
  }
}

function levelCharts() {
  const box = document.getElementById("levels");
  if (!box) return;
  for (const c of DATA.levels) {
    stepChart(box, { title: c.title, axis: c.axis, x: c.starts, width: 900, series: c.series });
  }
}

// A workload's states between its events, for the bar above its timeline.
const STATE = { submitted: "pending", requeued: "pending", admitted: "running", resized: "running",
  evicted: "evicting", preempted: "evicting", reclaimed: "evicting", finished: null };
const STATE_COLOR = { pending: "#bbb", running: "#2ca02c", evicting: "#ff7f0e" };

function showWorkload(w) {
  const out = document.getElementById("workload");
  out.innerHTML = "";
  if (!w) return;
  const head = document.createElement("p");
  head.textContent = `${w.name}: queue ${w.queue} (ClusterQueue ${w.clusterQueue}), ` +
    `priority ${w.priority}, ${w.evictions} eviction(s)`;
  out.appendChild(head);
  const W = 900, H = 34, L = 10, R = 10, end = DATA.end * DATA.timeScale;
  const X = (t) => L + ((W - L - R) * t) / (end || 1);
  const bar = svg("svg", { width: W, height: H, class: "chart" }, out);
  let state = null, since = 0;
  const spans = [];
  for (const [at, kind] of w.events) {
    if (!(kind in STATE)) continue;
    if (state) spans.push([since, at, state]);
    state = STATE[kind]; since = at;
  }
  if (state) spans.push([since, end, state]);
  for (const [a, b, s] of spans) {
    const r = svg("rect", { x: X(a), y: 6, width: Math.max(1, X(b) - X(a)), height: 16,
      fill: STATE_COLOR[s] }, bar);
    svg("title", {}, r).textContent = `${s} ${duration(a)} to ${duration(b)}`;
  }
  text(bar, L, H - 1, "0s", { class: "small" });
  text(bar, W - R, H - 1, duration(end), { class: "small", "text-anchor": "end" });
  const table = document.createElement("table");
  table.className = "timeline";
  table.innerHTML = "<thead><tr><th>At</th><th>Event</th><th>Reason</th></tr></thead>";
  const body = table.createTBody();
  for (const [at, kind, reason] of w.events) {
    const tr = body.insertRow();
    tr.className = "ev-" + kind;
    tr.insertCell().textContent = duration(at);
    tr.insertCell().textContent = kind;
    tr.insertCell().textContent = DATA.workloads.reasons[reason];
  }
  out.appendChild(table);
}

function workloadPicker() {
  const select = document.getElementById("pick"), filter = document.getElementById("filter");
  const list = DATA.workloads.list;
  const fill = () => {
    const f = filter.value.toLowerCase(), chosen = select.value;
    select.innerHTML = "";
    for (const [i, w] of list.entries()) {
      if (f && !w.name.toLowerCase().includes(f) && !w.queue.toLowerCase().includes(f)) continue;
      const o = document.createElement("option");
      o.value = i;
      const evicted = w.evictions ? `, evicted ${w.evictions}x` : "";
      o.textContent = `${w.name} (${w.clusterQueue}${evicted})`;
      select.appendChild(o);
    }
    if ([...select.options].some((o) => o.value === chosen)) select.value = chosen;
    showWorkload(list[select.value]);
  };
  filter.addEventListener("input", fill);
  select.addEventListener("change", () => showWorkload(list[select.value]));
  fill();
  // Start on the most eventful workload: the one whose timeline says the most.
  let best = 0;
  list.forEach((w, i) => { if (w.events.length > list[best].events.length) best = i; });
  if (list.length) { select.value = String(best); showWorkload(list[best]); }
}

function sortableTables() {
  document.querySelectorAll("table.sortable th").forEach((th) => {
    th.title = "sort";
    th.addEventListener("click", () => {
      const body = th.closest("table").tBodies[0], index = th.cellIndex;
      const up = th.dataset.dir !== "up";
      th.closest("tr").querySelectorAll("th").forEach((h) => delete h.dataset.dir);
      th.dataset.dir = up ? "up" : "down";
      const key = (row) => {
        const cell = row.cells[index], v = cell.dataset.sort ?? cell.textContent;
        const n = parseFloat(v);
        return isNaN(n) ? v : n;
      };
      [...body.rows].sort((a, b) => {
        const x = key(a), y = key(b);
        // Numbers before text ("-"), whichever way: mixed comparisons would be unordered.
        if (typeof x !== typeof y) return typeof x === "number" ? -1 : 1;
        return (x < y ? -1 : x > y ? 1 : 0) * (up ? 1 : -1);
      }).forEach((row) => body.appendChild(row));
    });
  });
}

sortableTables();
usageCharts();
waitChart();
nodeCharts();
levelCharts();
workloadPicker();
"""
