// The explorer's report: draws the analysis embedded in #explorer-data (see
// analysis.py for its fields). Plain DOM, SVG and canvas; no libraries.
// window.neuronExplorer exposes the state the browser test reads.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("explorer-data").textContent);
  const S = D.strings;
  const SUM = D.summary;
  const TARGET_BOUND_COLORS = { compute: "#2563eb", memory: "#f59e0b", launch: "#ef4444" };
  const KIND_COLORS = { op: "#3b82f6", fused: "#f59e0b", compiled: "#8b5cf6", nki: "#10b981", copy: "#6b7280" };
  const CAUSE_COLORS = { queued: "#a78bfa", sync: "#ef4444", host_bound: "#f59e0b", empty_queue: "#94a3b8" };
  const ENGINE_COLORS = { Tensor: "#3b82f6", Vector: "#f59e0b", Scalar: "#10b981", GpSimd: "#8b5cf6", DMA: "#6b7280" };

  // ---------------------------------------------------------------- helpers
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return node;
  }
  // Replace a node's children; arrays are flattened, null and undefined skipped.
  function setChildren(node, ...children) {
    node.replaceChildren();
    for (const c of children.flat(2)) {
      if (c === null || c === undefined) continue;
      node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
  }
  // Text with `code` spans, as the recommendations write them.
  function richText(tag, text) {
    return el(tag, {}, String(text).split("`").map((part, i) => (i % 2 ? el("code", { text: part }) : part)));
  }
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    for (const c of children.flat()) if (c) node.appendChild(c);
    return node;
  }
  function fmtUs(us) {
    if (us === null || us === undefined) return "";
    const a = Math.abs(us);
    if (a >= 1e6) return (us / 1e6).toFixed(2) + " s";
    if (a >= 1e3) return (us / 1e3).toFixed(2) + " ms";
    return us.toFixed(a >= 100 ? 0 : 1) + " us";
  }
  function fmtNs(ns) { return ns >= 1e3 ? (ns / 1e3).toFixed(2) + " us" : ns.toFixed(0) + " ns"; }
  function fmtBytes(n) {
    const units = [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
    for (const [u, s] of units) if (Math.abs(n) >= s) return (n / s).toFixed(1) + " " + u;
    return n + " B";
  }
  function pct(x) { return (100 * x).toFixed(x < 0.1 ? 1 : 0) + "%"; }
  function colorOf(name) {
    let h = 0;
    for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
    return "hsl(" + (h % 360) + ",55%,62%)";
  }
  function kindColor(kind) { return KIND_COLORS[kind] || "#0ea5e9"; }
  function setupCanvas(canvas, cssHeight) {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || canvas.parentElement.clientWidth || 800;
    canvas.style.height = cssHeight + "px";
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(cssHeight * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    return { ctx, width, height: cssHeight };
  }
  function stackNode(stackId) {
    const frames = D.stacks[stackId] || [];
    const user = D.stack_user[stackId] || [];
    if (!frames.length) return el("div", { class: "stack muted", text: "(no Python stack: profile with with_stack=True)" });
    // Innermost first, down to the outermost frame of the user's code and a few below it.
    const lastUser = user.lastIndexOf(true);
    const shown = Math.min(frames.length, Math.max(lastUser + 3, 12));
    return el("div", { class: "stack" }, frames.slice(0, shown).map((f, i) => el("div", { class: user[i] ? "user" : "", text: S[f] })),
      shown < frames.length ? el("div", { class: "muted", text: "\u2026 " + (frames.length - shown) + " outer frames" }) : null);
  }

  // Task fields (see analysis.py: tasks_table).
  const T = { row: 0, ts: 1, dur: 2, name: 3, kind: 4, op: 5, queued: 6, members: 7, corr: 8, operator: 9 };
  const O = { row: 0, ts: 1, dur: 2, name: 3, lane: 4, cat: 5, stack: 6, ext: 7 };
  const taskName = (t) => S[t[T.name]];
  const taskKind = (t) => S[t[T.kind]];
  const opName = (o) => S[o[O.name]];
  const operatorRow = {};
  D.operators.forEach((r, i) => { operatorRow[r.name] = i; });

  const state = { view: "summary", selectedTasks: new Set(), selectedOp: null, tlRows: [] };
  const errors = [];
  window.addEventListener("error", (e) => errors.push(String(e.message)));

  // ---------------------------------------------------------------- views
  function showView(name) {
    state.view = name;
    document.querySelectorAll(".view").forEach((v) => v.classList.toggle("active", v.id === "view-" + name));
    document.querySelectorAll("#tabs button").forEach((b) => b.classList.toggle("active", b.dataset.view === name));
    if (name === "timeline") timeline.draw();
    if (name === "memory") memoryView.draw();
    if (name === "nki") nkiView.draw();
  }
  document.querySelectorAll("#tabs button").forEach((b) => b.addEventListener("click", () => showView(b.dataset.view)));

  if (SUM.synthetic_device_rows) {
    const banner = document.getElementById("banner");
    banner.hidden = false;
    banner.textContent = "The device rows in this report are synthetic (made by a test helper from the host operators), not measured.";
  }

  // ---------------------------------------------------------------- summary
  function stackedBar(parts, total, width, height) {
    const g = svg("svg", { width: width, height: height, viewBox: "0 0 " + width + " " + height, class: "bar" });
    let x = 0;
    for (const p of parts) {
      const w = total > 0 ? (p.value / total) * width : 0;
      if (w <= 0) continue;
      const r = svg("rect", { x: x, y: 0, width: w, height: height, fill: p.color });
      r.appendChild(svg("title", {})).textContent = p.label + ": " + p.text;
      g.appendChild(r);
      x += w;
    }
    if (x < width) g.appendChild(svg("rect", { x: x, y: 0, width: width - x, height: height, fill: "#eef1f4" }));
    return g;
  }
  function legend(items) {
    return el("div", { class: "legend" }, items.map((i) => {
      const s = el("span", { text: i.label + (i.text ? " " + i.text : "") });
      s.style.setProperty("--c", i.color);
      return s;
    }));
  }
  function hbars(rows, width) {
    const rowH = 18, labelW = 210;
    const max = Math.max(1e-9, ...rows.map((r) => r.value));
    const g = svg("svg", { width: width, height: rows.length * rowH + 4, class: "hbars" });
    rows.forEach((r, i) => {
      const y = i * rowH;
      const label = svg("text", { x: 0, y: y + 13, "font-size": 12 });
      label.textContent = r.label.length > 30 ? r.label.slice(0, 29) + "\u2026" : r.label;
      label.appendChild(svg("title", {})).textContent = r.label;
      g.appendChild(label);
      const w = ((width - labelW - 90) * r.value) / max;
      g.appendChild(svg("rect", { x: labelW, y: y + 3, width: Math.max(w, 1), height: rowH - 6, fill: r.color || "#3b82f6" }));
      const t = svg("text", { x: labelW + w + 6, y: y + 13, "font-size": 12, fill: "#6b7480" });
      t.textContent = r.text;
      g.appendChild(t);
    });
    return g;
  }

  function renderSummary() {
    const root = document.getElementById("view-summary");
    const grid = el("div", { class: "grid" });
    root.appendChild(grid);

    const recs = el("div", { class: "card wide", id: "recommendations" }, el("h2", { text: "Recommendations" }));
    if (!SUM.recommendations.length) recs.appendChild(el("p", { class: "muted", text: "Nothing stands out." }));
    else recs.appendChild(el("ol", { class: "recs" }, SUM.recommendations.map((r) =>
      el("li", { "data-kind": r.kind },
        el("div", { class: "title" }, richText("span", r.title)),
        el("ul", {}, r.evidence.map((e) => richText("li", e))),
        richText("div", r.advice)))));
    grid.appendChild(recs);

    grid.appendChild(el("div", { class: "card" }, el("h2", { text: "Profile" }),
      el("dl", { class: "kv" },
        el("dt", { text: "window" }), el("dd", { text: fmtUs(SUM.window_us) }),
        el("dt", { text: "host threads" }), el("dd", { text: String(SUM.host_threads) }),
        el("dt", { text: "host ranges" }), el("dd", { text: String(SUM.host_ops) }),
        el("dt", { text: "device tasks" }), el("dd", { text: String(SUM.device_tasks) }),
        el("dt", { text: "device time" }), el("dd", { text: fmtUs(SUM.device_time_us) }))));

    const cores = el("div", { class: "card", id: "card-cores" }, el("h2", { text: "Device busy and idle, per core" }));
    if (!SUM.cores.length) cores.appendChild(el("p", { class: "muted", text: "No device rows in this trace: the host side only. Profile with ProfilerActivity.PrivateUse1 to see device time." }));
    for (const c of SUM.cores) {
      cores.appendChild(el("h3", { text: c.label + ": busy " + fmtUs(c.busy_us) + " (" + pct(c.utilization) + "), " + c.tasks + " tasks" }));
      const parts = [{ label: "busy", value: c.busy_us, color: "#2563eb", text: fmtUs(c.busy_us) }];
      for (const cause of Object.keys(D.idle_labels)) parts.push({ label: D.idle_labels[cause], value: c.idle[cause], color: CAUSE_COLORS[cause], text: fmtUs(c.idle[cause]) });
      cores.appendChild(stackedBar(parts, c.window_us, 360, 16));
    }
    if (SUM.cores.length) cores.appendChild(legend([{ label: "busy", color: "#2563eb" }].concat(Object.keys(D.idle_labels).map((c) =>
      ({ label: D.idle_labels[c], color: CAUSE_COLORS[c], text: SUM.idle_us > 0 ? pct(SUM.idle_share[c]) : "" })))));
    grid.appendChild(cores);

    const ov = SUM.overlap;
    grid.appendChild(el("div", { class: "card", id: "card-overlap" }, el("h2", { text: "Host and device overlap" }),
      el("dl", { class: "kv" },
        el("dt", { text: "host issuing (in operators, not waiting)" }), el("dd", { text: fmtUs(ov.host_active_us) }),
        el("dt", { text: "device busy (any core)" }), el("dd", { text: fmtUs(ov.device_busy_us) }),
        el("dt", { text: "both at once" }), el("dd", { text: fmtUs(ov.overlap_us) + " (" + pct(ov.share_of_device_busy) + " of device busy)" }))));

    const top = el("div", { class: "card", id: "card-top-ops" }, el("h2", { text: "Top operators by device time" }));
    if (SUM.top_device_ops.length) top.appendChild(hbars(SUM.top_device_ops.slice(0, 10).map((r) => ({
      label: r.name, value: r.device_us, text: fmtUs(r.device_us) + " \u00b7 " + pct(r.share), color: "#3b82f6" })), 360));
    else {
      const hostTop = D.operators.filter((r) => r.cat === "cpu_op").sort((a, b) => b.host_self_us - a.host_self_us).slice(0, 10);
      top.appendChild(el("p", { class: "muted", text: "No device time; top operators by host self time:" }));
      top.appendChild(hbars(hostTop.map((r) => ({ label: r.name, value: r.host_self_us, text: fmtUs(r.host_self_us), color: "#94a3b8" })), 360));
    }
    grid.appendChild(top);

    const kinds = el("div", { class: "card", id: "card-kinds" }, el("h2", { text: "Fused against unfused device time" }));
    const kparts = Object.entries(SUM.kinds).map(([k, v]) => ({ label: k, value: v.us, color: kindColor(k), text: fmtUs(v.us) + " (" + v.tasks + " tasks)" }));
    kinds.appendChild(stackedBar(kparts, SUM.device_time_us, 360, 16));
    kinds.appendChild(legend(kparts.map((p) => ({ label: p.label, color: p.color, text: p.text }))));
    if (SUM.fused_groups.length) {
      kinds.appendChild(el("h3", { text: "Largest fused groups" }));
      kinds.appendChild(el("table", {}, el("tbody", {}, SUM.fused_groups.slice(0, 6).map((g) =>
        el("tr", {}, el("td", { class: "name", text: g.members.join(" + ") }), el("td", { text: g.tasks + "\u00d7" }), el("td", { text: fmtUs(g.us) }))))));
    }
    grid.appendChild(kinds);

    const mem = el("div", { class: "card", id: "card-memory" }, el("h2", { text: "Allocator" }));
    if (!SUM.memory.length) mem.appendChild(el("p", { class: "muted", text: "No memory events: profile with profile_memory=True." }));
    for (const m of SUM.memory) mem.appendChild(el("dl", { class: "kv" },
      el("dt", { text: m.label }), el("dd", { text: "peak allocated " + fmtBytes(m.peak_allocated) + ", peak reserved " + fmtBytes(m.peak_reserved) +
        (m.peak_reserved > 0 ? ", fragmentation " + pct(m.fragmentation) : "") })));
    grid.appendChild(mem);

    const tm = SUM.target;
    if (tm) {
      const card = el("div", { class: "card wide", id: "card-target" },
        el("h2", { text: "Modelled on " + (tm.device || tm.target) + " (" + tm.target + ", LNC=" + tm.lnc + "): not measured" }));
      card.appendChild(el("dl", { class: "kv" },
        el("dt", { text: "modelled device time" }), el("dd", { text: fmtUs(tm.device_us) + " in " + tm.launches + " launches" + (tm.steps ? ", " + fmtUs(tm.device_us / tm.steps) + " per step" : "") }),
        el("dt", { text: "compiles on the target" }), el("dd", { text: tm.eager_compiles + " eager signatures, " + tm.graph_compiles + " graphs (modelled " + tm.compile_s.toFixed(0) + " s cold)" }),
        el("dt", { text: "findings" }), el("dd", { text: tm.churn.length + " shape churn site(s), " + tm.wide_findings + " 64-bit value(s) the target changes" })));
      const bounds = Object.entries(tm.bound_us).map(([k, v]) => ({ label: k, value: v, color: TARGET_BOUND_COLORS[k] || "#94a3b8", text: fmtUs(v) }));
      card.appendChild(el("h3", { text: "By bound" }));
      card.appendChild(stackedBar(bounds, tm.device_us, 360, 16));
      card.appendChild(legend(bounds.map((p) => ({ label: p.label, color: p.color, text: p.text }))));
      card.appendChild(el("h3", { text: "Top operators to fix" }));
      card.appendChild(hbars(tm.top_ops.slice(0, 10).map((r) => ({ label: r.op, value: r.us, text: fmtUs(r.us) + " \u00b7 " + pct(r.share) + " \u00b7 " + r.bound, color: TARGET_BOUND_COLORS[r.bound] || "#94a3b8" })), 640));
      if (tm.assumptions.length) card.appendChild(el("p", { class: "muted", text: "Assumed: " + tm.assumptions.join("; ") + " (docs/target.md)" }));
      grid.appendChild(card);
    }

    const hs = SUM.host_samples;
    if (hs) {
      const rows = [];
      if (hs.cpu) rows.push(el("dt", { text: "host CPU busy" }), el("dd", { text: "mean " + hs.cpu.mean_pct.toFixed(1) + " %, max " + hs.cpu.max_pct.toFixed(1) + " % (" + hs.cpu.samples + " samples)" }));
      if (hs.cpu && hs.cpu.process_mean_pct !== null) rows.push(el("dt", { text: "this process" }), el("dd", { text: "mean " + hs.cpu.process_mean_pct.toFixed(1) + " % of one CPU" }));
      if (hs.memory) rows.push(el("dt", { text: "host memory used" }), el("dd", { text: "peak " + fmtBytes(hs.memory.peak_used) + ", process peak " + fmtBytes(hs.memory.peak_process_rss) }));
      grid.appendChild(el("div", { class: "card", id: "card-host" }, el("h2", { text: "Host (sampled)" }), el("dl", { class: "kv" }, rows)));
    }
    const np = SUM.neuron_profile;
    if (np) {
      const rows = [el("dt", { text: "rank" }), el("dd", { text: String(np.rank) }),
        el("dt", { text: "modes" }), el("dd", { text: (np.modes || []).join(", ") }),
        el("dt", { text: "files" }), el("dd", { text: (np.files || []).join(", ") })];
      const dropped = Object.values(np.dropped_tasks_per_nc || {}).reduce((a, b) => a + b, 0);
      if (dropped) rows.push(el("dt", { text: "dropped tasks" }), el("dd", { text: dropped + " (max_events_per_nc " + np.max_events_per_nc + ")" }));
      for (const [mode, why] of Object.entries(np.not_produced || {})) rows.push(el("dt", { text: "not produced: " + mode }), el("dd", { text: why }));
      grid.appendChild(el("div", { class: "card", id: "card-neuron-profile" }, el("h2", { text: "Neuron profile" }), el("dl", { class: "kv" }, rows)));
    }

    if (SUM.sync_sites.length) {
      grid.appendChild(el("div", { class: "card", id: "card-sync" }, el("h2", { text: "Synchronising calls" }),
        el("table", {}, el("thead", {}, el("tr", {}, ["call", "where", "calls", "device idle", "host time"].map((h) => el("th", { text: h })))),
          el("tbody", {}, SUM.sync_sites.map((s) => el("tr", {},
            el("td", { text: s.label }), el("td", { class: "name", text: s.frame_label || "" }), el("td", { text: String(s.calls) }),
            el("td", { text: fmtUs(s.idle_us) }), el("td", { text: fmtUs(s.host_us) })))))));
    }
  }

  // ---------------------------------------------------------------- timeline
  const timeline = (function () {
    const canvas = document.getElementById("timeline");
    const tooltip = document.getElementById("tl-tooltip");
    const LABEL_W = 190, LANE_H = 14, TASK_H = 18, MEM_H = 44, GAP = 6, AXIS_H = 22;
    const MAX_LANES = 12;
    const end = Math.max(SUM.window_us, 1e-3);
    let v0 = 0, v1 = end, rows = [], hits = [], width = 0;
    const memRows = D.memory.filter((m) => m.device_type !== 0);
    const counterRows = memRows.length ? memRows : D.memory.slice(0, 1);

    // Rows: host threads (one lane per nesting level), device streams, memory counters.
    function layout() {
      rows = [];
      let y = AXIS_H;
      D.host_rows.forEach((r, i) => {
        const lanes = Math.min(r.lanes, MAX_LANES);
        rows.push({ kind: "host", index: i, label: r.label, y: y, h: lanes * LANE_H, lanes: lanes });
        y += lanes * LANE_H + GAP;
      });
      D.stream_rows.forEach((r, i) => { rows.push({ kind: "device", index: i, label: r.label, y: y, h: TASK_H }); y += TASK_H + GAP; });
      counterRows.forEach((m, i) => { rows.push({ kind: "memory", index: i, label: m.label + " memory", y: y, h: MEM_H, mem: m }); y += MEM_H + GAP; });
      return y;
    }
    const hostRowOf = {}, deviceRowOf = {};
    function xOf(t) { return LABEL_W + ((t - v0) / (v1 - v0)) * (width - LABEL_W); }

    function draw() {
      if (state.view !== "timeline") return;
      const height = layout();
      rows.forEach((r) => { if (r.kind === "host") hostRowOf[r.index] = r; else if (r.kind === "device") deviceRowOf[r.index] = r; });
      const c = setupCanvas(canvas, Math.max(height, 80));
      const ctx = c.ctx;
      width = c.width;
      hits = [];
      ctx.clearRect(0, 0, c.width, c.height);
      ctx.font = "11px system-ui, sans-serif";
      ctx.textBaseline = "middle";
      const drawn = rows.map(() => 0);
      const anySelected = state.selectedTasks.size > 0;
      // Axis.
      ctx.fillStyle = "#6b7480";
      const span = v1 - v0;
      const step = Math.pow(10, Math.floor(Math.log10(span / 6)));
      const tick = [1, 2, 5, 10].map((m) => m * step).find((s) => span / s <= 10) || step * 10;
      for (let t = Math.ceil(v0 / tick) * tick; t <= v1; t += tick) {
        const x = xOf(t);
        ctx.fillRect(x, AXIS_H - 6, 1, 6);
        ctx.fillText(fmtUs(t), x + 2, 8);
      }
      ctx.strokeStyle = "#d9dee4";
      ctx.beginPath(); ctx.moveTo(LABEL_W, AXIS_H - 0.5); ctx.lineTo(width, AXIS_H - 0.5); ctx.stroke();
      ctx.save();
      ctx.beginPath(); ctx.rect(LABEL_W, 0, width - LABEL_W, c.height); ctx.clip();
      // Host operators.
      D.ops.forEach((o, i) => {
        const row = hostRowOf[o[O.row]];
        if (!row || o[O.lane] >= row.lanes) return;
        const s = o[O.ts], e = s + o[O.dur];
        if (e < v0 || s > v1) return;
        const x0 = xOf(s), w = Math.max(xOf(e) - x0, 1);
        const y = row.y + o[O.lane] * LANE_H;
        const selected = state.selectedOp !== null && D.operators[state.selectedOp].events_set.has(i);
        ctx.globalAlpha = anySelected && !selected ? 0.35 : 1;
        ctx.fillStyle = S[o[O.cat]] === "user_annotation" ? "#cbd5e1" : colorOf(opName(o));
        ctx.fillRect(x0, y + 1, w, LANE_H - 2);
        if (selected) { ctx.strokeStyle = "#111"; ctx.lineWidth = 1.5; ctx.strokeRect(x0, y + 1, w, LANE_H - 2); }
        if (w > 40) { ctx.fillStyle = "#111"; ctx.fillText(opName(o).slice(0, Math.floor(w / 6)), x0 + 2, y + LANE_H / 2); }
        drawn[rows.indexOf(row)]++;
        hits.push({ x0: x0, x1: x0 + w, y0: y, y1: y + LANE_H, type: "op", index: i });
      });
      // Device tasks.
      D.tasks.forEach((t, i) => {
        const row = deviceRowOf[t[T.row]];
        const s = t[T.ts], e = s + t[T.dur];
        if (!row || e < v0 || s > v1) return;
        const x0 = xOf(s), w = Math.max(xOf(e) - x0, 1);
        const selected = state.selectedTasks.has(i);
        ctx.globalAlpha = anySelected && !selected ? 0.3 : 1;
        ctx.fillStyle = kindColor(taskKind(t));
        ctx.fillRect(x0, row.y + 1, w, TASK_H - 2);
        if (selected) { ctx.strokeStyle = "#111"; ctx.lineWidth = 1.5; ctx.strokeRect(x0, row.y + 1, w, TASK_H - 2); }
        if (w > 40) { ctx.fillStyle = "#fff"; ctx.fillText(taskName(t).slice(0, Math.floor(w / 6)), x0 + 2, row.y + TASK_H / 2); }
        drawn[rows.indexOf(row)]++;
        hits.push({ x0: x0, x1: x0 + w, y0: row.y, y1: row.y + TASK_H, type: "task", index: i });
      });
      ctx.globalAlpha = 1;
      // Memory counters: allocated (filled) and reserved (line), each row on its own scale.
      rows.filter((r) => r.kind === "memory").forEach((r) => {
        const series = r.mem.series;
        const top = Math.max(1, ...series.map((p) => Math.max(p[1], p[2])));
        const yOf = (v) => r.y + r.h - (v / top) * (r.h - 4);
        ctx.fillStyle = "rgba(16,185,129,0.35)"; ctx.strokeStyle = "#0f766e"; ctx.lineWidth = 1;
        ctx.beginPath(); ctx.moveTo(LABEL_W, r.y + r.h);
        let last = 0;
        for (const p of series) { const x = xOf(p[0]); ctx.lineTo(x, yOf(last)); ctx.lineTo(x, yOf(p[1])); last = p[1]; }
        ctx.lineTo(width, yOf(last)); ctx.lineTo(width, r.y + r.h); ctx.closePath(); ctx.fill();
        ctx.strokeStyle = "#b45309"; ctx.beginPath(); last = 0; ctx.moveTo(LABEL_W, yOf(0));
        for (const p of series) { const x = xOf(p[0]); ctx.lineTo(x, yOf(last)); ctx.lineTo(x, yOf(p[2])); last = p[2]; }
        ctx.lineTo(width, yOf(last)); ctx.stroke();
        drawn[rows.indexOf(r)] = series.length;
      });
      // Flows, launching operator to task: for the selection, or all when few are visible.
      if (document.getElementById("tl-flows").checked) {
        const visible = hits.filter((h) => h.type === "task").map((h) => h.index);
        const flowTasks = anySelected ? [...state.selectedTasks] : (visible.length <= 300 ? visible : []);
        ctx.strokeStyle = "rgba(30,41,59,0.7)"; ctx.fillStyle = "rgba(30,41,59,0.7)"; ctx.lineWidth = 1;
        for (const i of flowTasks) {
          const t = D.tasks[i], oi = t[T.op];
          if (oi < 0) continue;
          const o = D.ops[oi], hr = hostRowOf[o[O.row]], dr = deviceRowOf[t[T.row]];
          if (!hr || !dr) continue;
          const launch = t[T.queued] !== null ? t[T.queued] : o[O.ts];
          const xa = xOf(launch), ya = hr.y + Math.min(o[O.lane], hr.lanes - 1) * LANE_H + LANE_H / 2;
          const xb = xOf(t[T.ts]), yb = dr.y + TASK_H / 2;
          ctx.beginPath(); ctx.moveTo(xa, ya); ctx.bezierCurveTo(xa, (ya + yb) / 2, xb, (ya + yb) / 2, xb, yb); ctx.stroke();
          ctx.beginPath(); ctx.moveTo(xb, yb); ctx.lineTo(xb - 4, yb - 6); ctx.lineTo(xb + 4, yb - 6); ctx.closePath(); ctx.fill();
        }
      }
      ctx.restore();
      // Row labels.
      ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, LABEL_W - 2, c.height);
      rows.forEach((r) => {
        ctx.fillStyle = r.kind === "device" ? "#1d4ed8" : r.kind === "memory" ? "#0f766e" : "#1d232a";
        ctx.fillText(r.label.slice(0, 30), 6, r.y + Math.min(r.h, TASK_H) / 2);
        ctx.fillStyle = "#eef1f4"; ctx.fillRect(0, r.y + r.h + GAP / 2, width, 1);
      });
      state.tlRows = rows.map((r, i) => ({ kind: r.kind, label: r.label, drawn: drawn[i] }));
      document.getElementById("tl-range").textContent = fmtUs(v0) + " \u2013 " + fmtUs(v1) + " (" + fmtUs(v1 - v0) + ")";
    }

    function hitAt(x, y) {
      for (let i = hits.length - 1; i >= 0; i--) {
        const h = hits[i];
        if (x >= h.x0 - 1 && x <= h.x1 + 1 && y >= h.y0 && y <= h.y1) return h;
      }
      return null;
    }
    function describe(h) {
      if (h.type === "task") {
        const t = D.tasks[h.index];
        const lines = [taskName(t), "kind " + taskKind(t) + ", " + fmtUs(t[T.dur]) + " at " + fmtUs(t[T.ts])];
        if (t[T.queued] !== null) lines.push("queued " + fmtUs(t[T.ts] - t[T.queued]) + " before it started");
        if (t[T.op] >= 0) lines.push("launched by " + opName(D.ops[t[T.op]]));
        else if (t[T.operator] >= 0) lines.push("operator " + S[t[T.operator]]);
        if (t[T.members] >= 0) lines.push("fused: " + D.fused_lists[t[T.members]].map((m) => S[m]).join(" + "));
        return lines.join("\n");
      }
      const o = D.ops[h.index];
      return opName(o) + "\n" + fmtUs(o[O.dur]) + " at " + fmtUs(o[O.ts]);
    }
    function zoom(factor, atX) {
      const t = v0 + ((atX - LABEL_W) / (width - LABEL_W)) * (v1 - v0);
      let n0 = t - (t - v0) * factor, n1 = t + (v1 - t) * factor;
      if (n1 - n0 < 1e-3) return;
      n0 = Math.max(n0, -0.05 * end); n1 = Math.min(n1, end * 1.05);
      v0 = n0; v1 = n1; draw();
    }
    function focus(s, e) {
      const pad = Math.max((e - s) * 0.1, 1);
      v0 = Math.max(s - pad, -0.05 * end); v1 = Math.min(e + pad, end * 1.05); draw();
    }
    let drag = null;
    canvas.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      zoom(ev.deltaY > 0 ? 1.25 : 0.8, ev.offsetX);
    }, { passive: false });
    canvas.addEventListener("mousedown", (ev) => { drag = { x: ev.offsetX, v0: v0, v1: v1, moved: false }; });
    window.addEventListener("mouseup", () => { setTimeout(() => { drag = null; }, 0); });
    canvas.addEventListener("mousemove", (ev) => {
      if (drag && (ev.buttons & 1)) {
        const dx = ev.offsetX - drag.x;
        if (Math.abs(dx) > 2) drag.moved = true;
        const dt = (dx / (width - LABEL_W)) * (drag.v1 - drag.v0);
        v0 = drag.v0 - dt; v1 = drag.v1 - dt; draw();
        return;
      }
      const h = hitAt(ev.offsetX, ev.offsetY);
      if (!h) { tooltip.hidden = true; return; }
      tooltip.textContent = describe(h);
      tooltip.style.left = Math.min(ev.offsetX + 12, width - 300) + "px";
      tooltip.style.top = (ev.offsetY + 14) + "px";
      tooltip.hidden = false;
    });
    canvas.addEventListener("mouseleave", () => { tooltip.hidden = true; });
    canvas.addEventListener("click", (ev) => {
      if (drag && drag.moved) return;
      const h = hitAt(ev.offsetX, ev.offsetY);
      if (!h) { selectTasks([], null); return; }
      if (h.type === "task") showTaskDetails(h.index);
      else showOpEventDetails(h.index);
    });
    canvas.addEventListener("dblclick", () => { v0 = 0; v1 = end; draw(); });
    document.getElementById("tl-reset").addEventListener("click", () => { v0 = 0; v1 = end; draw(); });
    document.getElementById("tl-zoom-in").addEventListener("click", () => zoom(0.5, (LABEL_W + width) / 2));
    document.getElementById("tl-zoom-out").addEventListener("click", () => zoom(2, (LABEL_W + width) / 2));
    document.getElementById("tl-flows").addEventListener("change", () => draw());
    window.addEventListener("resize", () => draw());
    return { draw: draw, focus: focus };
  })();

  function selectTasks(tasks, opRow) {
    state.selectedTasks = new Set(tasks);
    state.selectedOp = opRow;
    if (state.view === "timeline") timeline.draw();
  }
  function showTaskDetails(i) {
    const t = D.tasks[i];
    const box = document.getElementById("tl-details");
    box.replaceChildren(el("h3", { text: taskName(t) }), el("dl", { class: "kv" },
      el("dt", { text: "stream" }), el("dd", { text: D.stream_rows[t[T.row]].label }),
      el("dt", { text: "kind" }), el("dd", { text: taskKind(t) }),
      el("dt", { text: "start, duration" }), el("dd", { text: fmtUs(t[T.ts]) + ", " + fmtUs(t[T.dur]) }),
      el("dt", { text: "queued for" }), el("dd", { text: t[T.queued] !== null ? fmtUs(t[T.ts] - t[T.queued]) : "(not recorded)" }),
      el("dt", { text: "correlation" }), el("dd", { text: String(t[T.corr]) }),
      el("dt", { text: "fused members" }), el("dd", { text: t[T.members] >= 0 ? D.fused_lists[t[T.members]].map((m) => S[m]).join(" + ") : "\u2013" }),
      el("dt", { text: "launched by" }), el("dd", {}, t[T.op] >= 0 ? opLink(opName(D.ops[t[T.op]])) : (t[T.operator] >= 0 ? S[t[T.operator]] : "(unknown)"))));
    if (t[T.op] >= 0) box.appendChild(stackNode(D.ops[t[T.op]][O.stack]));
    selectTasks([i], null);
  }
  function showOpEventDetails(i) {
    const o = D.ops[i];
    const row = operatorRow[opName(o)];
    const mine = [];
    D.tasks.forEach((t, k) => { if (t[T.op] === i) mine.push(k); });
    const box = document.getElementById("tl-details");
    box.replaceChildren(el("h3", {}, opLink(opName(o))), el("dl", { class: "kv" },
      el("dt", { text: "thread" }), el("dd", { text: D.host_rows[o[O.row]].label }),
      el("dt", { text: "start, duration" }), el("dd", { text: fmtUs(o[O.ts]) + ", " + fmtUs(o[O.dur]) }),
      el("dt", { text: "tasks it launched" }), el("dd", { text: String(mine.length) })), stackNode(o[O.stack]));
    selectTasks(mine, row !== undefined ? row : null);
  }
  function opLink(name) {
    return el("a", { class: "link", text: name, onclick: () => { showView("operators"); selectOperator(name); } });
  }

  // ---------------------------------------------------------------- operators
  const COLS = [
    { key: "name", label: "operator", fmt: (v) => v },
    { key: "calls", label: "calls", fmt: String },
    { key: "host_total_us", label: "host total", fmt: fmtUs },
    { key: "host_self_us", label: "host self", fmt: fmtUs },
    { key: "device_self_us", label: "device self", fmt: fmtUs },
    { key: "device_total_us", label: "device total", fmt: fmtUs },
    { key: "ntasks", label: "tasks", fmt: String },
  ];
  D.operators.forEach((r) => { r.ntasks = r.tasks.length; r.events_set = new Set(r.events); });
  const opTable = { key: SUM.has_device_rows ? "device_total_us" : "host_total_us", asc: false, filter: "" };
  function renderOpTable() {
    const thead = document.querySelector("#op-table thead");
    const tbody = document.querySelector("#op-table tbody");
    thead.replaceChildren(el("tr", {}, COLS.map((c) => el("th", {
      "data-key": c.key, class: opTable.key === c.key ? "sorted" + (opTable.asc ? " asc" : "") : null,
      text: c.label, onclick: () => { opTable.asc = opTable.key === c.key ? !opTable.asc : c.key === "name"; opTable.key = c.key; renderOpTable(); },
    }))));
    const f = opTable.filter.toLowerCase();
    const rows = D.operators.map((r, i) => i).filter((i) => !f || D.operators[i].name.toLowerCase().includes(f));
    const k = opTable.key, sign = opTable.asc ? 1 : -1;
    rows.sort((a, b) => {
      const x = D.operators[a][k], y = D.operators[b][k];
      return (x < y ? -1 : x > y ? 1 : 0) * sign;
    });
    const frag = document.createDocumentFragment();
    for (const i of rows.slice(0, 2000)) {
      const r = D.operators[i];
      frag.appendChild(el("tr", { "data-op": r.name, class: state.selectedOp === i ? "selected" : "", onclick: () => selectOperator(r.name) },
        COLS.map((c) => el("td", { class: c.key === "name" ? "name" : "", title: c.key === "name" ? r.name : null, text: c.fmt(r[c.key]) }))));
    }
    tbody.replaceChildren(frag);
    document.getElementById("op-count").textContent = rows.length + " of " + D.operators.length + " operators";
  }
  document.getElementById("op-filter").addEventListener("input", (ev) => { opTable.filter = ev.target.value; renderOpTable(); });

  function selectOperator(name) {
    const i = operatorRow[name];
    if (i === undefined) return false;
    const r = D.operators[i];
    selectTasks(r.tasks, i);
    document.querySelectorAll("#op-table tbody tr").forEach((tr) => tr.classList.toggle("selected", tr.dataset.op === name));
    const box = document.getElementById("op-details");
    const shown = r.tasks.slice(0, 300);
    setChildren(box,
      el("h2", { text: r.name }),
      el("dl", { class: "kv" },
        el("dt", { text: "calls" }), el("dd", { text: String(r.calls) }),
        el("dt", { text: "host total / self" }), el("dd", { text: fmtUs(r.host_total_us) + " / " + fmtUs(r.host_self_us) }),
        el("dt", { text: "device total / self" }), el("dd", { text: fmtUs(r.device_total_us) + " / " + fmtUs(r.device_self_us) })),
      el("h3", { text: "Call stacks" }),
      r.stacks.length ? r.stacks.map(([s, n]) => el("div", {}, el("div", { class: "muted", text: n + " call(s)" }), stackNode(s)))
        : el("p", { class: "muted", text: "No Python stack recorded (with_stack=True records it)." }),
      el("h3", { text: "Device tasks (" + r.tasks.length + ", launched by it or the operators it called)" }),
      r.tasks.length ? el("button", { text: "Show in timeline", onclick: () => {
        showView("timeline");
        const ts = r.tasks.map((k) => D.tasks[k]);
        timeline.focus(Math.min(...ts.map((t) => t[T.ts])), Math.max(...ts.map((t) => t[T.ts] + t[T.dur])));
      } }) : null,
      el("table", { id: "op-tasks", "data-count": String(r.tasks.length) },
        el("thead", {}, el("tr", {}, ["task", "stream", "kind", "start", "duration", "queued"].map((h) => el("th", { text: h })))),
        el("tbody", {}, shown.map((k) => {
          const t = D.tasks[k];
          return el("tr", { "data-task": String(k), onclick: () => { showView("timeline"); timeline.focus(t[T.ts], t[T.ts] + t[T.dur]); showTaskDetails(k); } },
            el("td", { class: "name", text: taskName(t) }), el("td", { text: D.stream_rows[t[T.row]].label }),
            el("td", { text: taskKind(t) }), el("td", { text: fmtUs(t[T.ts]) }), el("td", { text: fmtUs(t[T.dur]) }),
            el("td", { text: t[T.queued] !== null ? fmtUs(t[T.ts] - t[T.queued]) : "" }));
        }))),
      r.tasks.length > shown.length ? el("p", { class: "muted", text: (r.tasks.length - shown.length) + " more not listed" }) : null);
    return true;
  }

  // ---------------------------------------------------------------- memory
  const memoryView = (function () {
    const root = document.getElementById("view-memory");
    let built = false;
    const charts = [];
    function liveAt(m, t) {
      return m.allocations.filter((a) => a.t <= t && (a.end === null || a.end > t)).sort((a, b) => b.bytes - a.bytes);
    }
    function allocTable(m, t, box) {
      const live = liveAt(m, t);
      box.replaceChildren(el("h3", { text: live.length + " allocations live at " + fmtUs(t) + " (" + fmtBytes(live.reduce((s, a) => s + a.bytes, 0)) + ")" }),
        el("table", { class: "alloc-table" }, el("thead", {}, el("tr", {}, ["size", "allocated at", "freed at", "operator", "task"].map((h) => el("th", { text: h })))),
          el("tbody", {}, live.slice(0, 60).map((a) => el("tr", {},
            el("td", { text: fmtBytes(a.bytes) }), el("td", { text: fmtUs(a.t) }), el("td", { text: a.end === null ? "(live at end)" : fmtUs(a.end) }),
            el("td", { class: "name" }, a.op >= 0 ? opLink(opName(D.ops[a.op])) : "(no operator)"),
            el("td", { class: "name" }, a.task >= 0 ? el("a", { class: "link", text: taskName(D.tasks[a.task]), onclick: () => {
              const tk = D.tasks[a.task]; showView("timeline"); timeline.focus(tk[T.ts], tk[T.ts] + tk[T.dur]); showTaskDetails(a.task);
            } }) : "\u2013"))))));
    }
    function build() {
      built = true;
      if (!D.memory.length) { root.appendChild(el("p", { class: "muted", text: "No memory events in this trace: profile with profile_memory=True." })); return; }
      const ordered = D.memory.filter((m) => m.device_type !== 0).concat(D.memory.filter((m) => m.device_type === 0));
      for (const m of ordered) {
        const canvas = el("canvas", { class: "chart memory-chart", "data-device": m.label });
        const box = el("div", { class: "details" });
        root.appendChild(el("div", { class: "card", style: "margin-bottom:12px" },
          el("h2", { text: m.label + ": peak allocated " + fmtBytes(m.peak_allocated) + ", peak reserved " + fmtBytes(m.peak_reserved) +
            (m.peak_reserved > 0 ? ", fragmentation " + pct(m.fragmentation) : "") }),
          el("p", { class: "muted", text: "green: allocated, brown: reserved. Click the chart to list the allocations live at that time." }),
          canvas, box));
        charts.push({ m: m, canvas: canvas });
        canvas.addEventListener("click", (ev) => {
          const t = (ev.offsetX / canvas.clientWidth) * SUM.window_us;
          allocTable(m, t, box);
        });
        if (m.peak_allocated_t !== null) allocTable(m, m.peak_allocated_t, box);
      }
    }
    function draw() {
      if (!built) build();
      for (const { m, canvas } of charts) {
        const c = setupCanvas(canvas, 140);
        const ctx = c.ctx;
        const top = Math.max(1, ...m.series.map((p) => Math.max(p[1], p[2])));
        const xOf = (t) => (t / Math.max(SUM.window_us, 1e-3)) * c.width;
        const yOf = (v) => c.height - 4 - (v / top) * (c.height - 16);
        for (const [col, color, fill] of [[1, "#0f766e", "rgba(16,185,129,0.35)"], [2, "#b45309", null]]) {
          ctx.beginPath(); ctx.moveTo(0, yOf(0));
          let last = 0;
          for (const p of m.series) { ctx.lineTo(xOf(p[0]), yOf(last)); ctx.lineTo(xOf(p[0]), yOf(p[col])); last = p[col]; }
          ctx.lineTo(c.width, yOf(last));
          if (fill) { ctx.lineTo(c.width, yOf(0)); ctx.closePath(); ctx.fillStyle = fill; ctx.fill(); }
          else { ctx.strokeStyle = color; ctx.lineWidth = 1.5; ctx.stroke(); }
        }
        ctx.fillStyle = "#6b7480"; ctx.font = "11px system-ui, sans-serif";
        ctx.fillText(fmtBytes(top), 4, 10);
      }
    }
    return { draw: draw };
  })();

  // ---------------------------------------------------------------- NKI
  const nkiView = (function () {
    const root = document.getElementById("view-nki");
    let built = false, current = 0, hits = [];
    let canvas, occCanvas, sourceBox, infoBox;
    function build() {
      built = true;
      if (!D.nki.length) {
        root.appendChild(el("p", { class: "muted", id: "nki-empty", text: "No NKI kernel traces in this trace (the top-level \"neuronNkiKernels\" list)." }));
        return;
      }
      const select = el("select", { id: "nki-kernel", onchange: (ev) => { current = Number(ev.target.value); draw(); } },
        D.nki.map((k, i) => el("option", { value: String(i), text: k.kernel })));
      canvas = el("canvas", { class: "chart", id: "nki-engines" });
      occCanvas = el("canvas", { class: "chart", id: "nki-occupancy" });
      infoBox = el("div", { class: "details", id: "nki-info" });
      sourceBox = el("div", { class: "details", id: "nki-source" });
      root.append(el("div", { class: "toolbar" }, "kernel ", select), el("h3", { text: "Instructions per engine (click one for its source line)" }), canvas,
        el("h3", { text: "SBUF and PSUM occupancy over the kernel" }), occCanvas, infoBox, sourceBox);
      canvas.addEventListener("click", (ev) => {
        const h = hits.find((x) => ev.offsetX >= x.x0 - 1 && ev.offsetX <= x.x1 + 1 && ev.offsetY >= x.y0 && ev.offsetY <= x.y1);
        if (h) showSource(D.nki[current], h.ins);
      });
    }
    function showSource(k, ins) {
      const m = /:(\d+)\s*$/.exec(ins.line || "");
      const line = m ? Number(m[1]) : -1;
      const parts = [el("h3", { text: ins.engine + " " + ins.name + ", " + fmtNs(ins.end_ns - ins.start_ns) + " at " + fmtNs(ins.start_ns) + (ins.line ? " \u2013 " + ins.line : "") })];
      if (k.source && k.source.includes("\n")) {
        const pre = el("pre", { class: "source" }, k.source.split("\n").map((text, i) =>
          el("div", { class: i + 1 === line ? "hl" : "", "data-line": String(i + 1) }, el("span", { class: "ln", text: String(i + 1) }), text)));
        parts.push(pre);
        sourceBox.replaceChildren(...parts);
        const hl = pre.querySelector(".hl");
        if (hl) pre.scrollTop = Math.max(0, hl.offsetTop - pre.clientHeight / 2);
      } else {
        parts.push(el("p", { class: "muted", text: "source: " + (k.source || "(not in the trace)") + (line > 0 ? ", line " + line : "") }));
        sourceBox.replaceChildren(...parts);
      }
      sourceBox.dataset.line = String(line);
    }
    function draw() {
      if (!built) build();
      if (!D.nki.length) return;
      const k = D.nki[current];
      const LABEL = 80, ROW = 22;
      const c = setupCanvas(canvas, k.engines.length * ROW + 24);
      const ctx = c.ctx;
      const t0 = Math.min(...k.instructions.map((i) => i.start_ns), 0);
      const span = Math.max(k.span_ns, 1);
      const xOf = (t) => LABEL + ((t - t0) / span) * (c.width - LABEL - 8);
      hits = [];
      ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "middle";
      k.engines.forEach((eng, r) => {
        const y = 20 + r * ROW;
        ctx.fillStyle = "#1d232a";
        ctx.fillText(eng + " " + (k.engine_busy_ns[eng] > 0 ? Math.round((100 * k.engine_busy_ns[eng]) / span) + "%" : ""), 4, y + ROW / 2);
        ctx.fillStyle = "#f1f4f7"; ctx.fillRect(LABEL, y + 2, c.width - LABEL - 8, ROW - 4);
        for (const ins of k.instructions) {
          if (ins.engine !== eng) continue;
          const x0 = xOf(ins.start_ns), w = Math.max(xOf(ins.end_ns) - x0, 1);
          ctx.fillStyle = ENGINE_COLORS[eng] || colorOf(eng);
          ctx.fillRect(x0, y + 3, w, ROW - 6);
          hits.push({ x0: x0, x1: x0 + w, y0: y, y1: y + ROW, ins: ins });
        }
      });
      ctx.fillStyle = "#6b7480"; ctx.fillText("0", LABEL, 8); ctx.fillText(fmtNs(span), c.width - 70, 8);
      // Occupancy: each buffer on its own scale (its peak, or its capacity when the peak comes near it).
      const o = setupCanvas(occCanvas, 120);
      const octx = o.ctx;
      const ox = (t) => LABEL + ((t - t0) / span) * (o.width - LABEL - 8);
      const half = (o.height - 8) / 2;
      octx.font = "11px system-ui, sans-serif"; octx.textBaseline = "middle";
      [[1, k.sbuf_capacity, "#10b981", "SBUF", k.peak_sbuf], [2, k.psum_capacity, "#8b5cf6", "PSUM", k.peak_psum]].forEach(([col, cap, color, label, peak], r) => {
        const y0 = 4 + r * half;
        const top = cap > 0 && peak > cap / 2 ? cap : Math.max(1, peak * 1.1);
        const oy = (v) => y0 + half - 4 - (v / top) * (half - 10);
        octx.fillStyle = "#1d232a";
        octx.fillText(label, 4, y0 + half / 2 - 6);
        octx.fillStyle = "#6b7480";
        octx.fillText(cap > 0 ? pct(peak / cap) + " peak" : fmtBytes(peak), 4, y0 + half / 2 + 8);
        octx.strokeStyle = color; octx.lineWidth = 1.5; octx.beginPath(); octx.moveTo(LABEL, oy(0));
        let last = 0;
        for (const p of k.occupancy) { octx.lineTo(ox(p[0]), oy(last)); octx.lineTo(ox(p[0]), oy(p[col])); last = p[col]; }
        octx.lineTo(o.width - 8, oy(last)); octx.stroke();
        octx.fillStyle = "#6b7480"; octx.fillText(fmtBytes(top), o.width - 70, y0 + 6);
      });
      infoBox.replaceChildren(el("dl", { class: "kv" },
        el("dt", { text: "instructions" }), el("dd", { text: String(k.instructions.length) }),
        el("dt", { text: "span" }), el("dd", { text: fmtNs(k.span_ns) }),
        el("dt", { text: "peak SBUF" }), el("dd", { text: fmtBytes(k.peak_sbuf) + (k.sbuf_capacity ? " of " + fmtBytes(k.sbuf_capacity) : "") }),
        el("dt", { text: "peak PSUM" }), el("dd", { text: fmtBytes(k.peak_psum) + (k.psum_capacity ? " of " + fmtBytes(k.psum_capacity) : "") })));
    }
    return { draw: draw, showSource: (i) => showSource(D.nki[current], D.nki[current].instructions[i]) };
  })();

  // ---------------------------------------------------------------- start
  renderSummary();
  renderOpTable();
  showView("summary");
  window.neuronExplorer = {
    ready: true,
    errors: errors,
    data: D,
    showView: showView,
    selectOperator: selectOperator,
    timelineRows: () => state.tlRows.slice(),
    selectedTaskCount: () => state.selectedTasks.size,
    clearSelection: () => { selectTasks([], null); document.querySelectorAll("#op-table tbody tr.selected").forEach((tr) => tr.classList.remove("selected")); },
    focus: (s, e) => timeline.focus(s, e),
    nkiShowSource: (i) => nkiView.showSource(i),
  };
})();
