// Surge live dashboard: polls /v1/dashboard/state once a second and draws it. No framework and
// no build step; the charts are plain canvas. The same page serves one replica (`surge serve`)
// and a fleet (`surge gateway`, whose state lists each upstream).
"use strict";

const params = new URLSearchParams(location.search);
const SLO = {
  ttft: parseFloat(params.get("slo_ttft") || "1.0"),   // seconds
  tpot: parseFloat(params.get("slo_tpot") || "0.1"),
};
const INTERVAL_MS = parseInt(params.get("interval_ms") || "1000", 10);
const $ = (id) => document.getElementById(id);

function fmtNum(x, digits = 1) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (Math.abs(x) >= 1000) return Math.round(x).toLocaleString("en-US");
  return x.toFixed(digits);
}
function fmtInt(x) { return x === null || x === undefined ? "–" : String(Math.round(x)); }
function fmtPct(x) { return x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%"; }
function fmtSec(x) {
  if (x === null || x === undefined) return "–";
  return x < 1 ? (1000 * x).toFixed(0) + " ms" : x.toFixed(2) + " s";
}
function setText(id, text, cls) {
  const el = $(id);
  if (!el) return;
  el.textContent = text;
  if (cls !== undefined) el.className = cls;
}
function sloClass(x, limit) {
  if (x === null || x === undefined) return "";
  return x <= limit ? "ok" : x <= 2 * limit ? "warn" : "bad";
}

function drawChart(canvas, t, series) {
  // series: [{values, color, label}], all on one y axis from 0.
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight || 140;
  canvas.width = w * dpr; canvas.height = h * dpr;
  const ctx = canvas.getContext("2d");
  ctx.scale(dpr, dpr);
  ctx.clearRect(0, 0, w, h);
  const pad = { l: 40, r: 8, t: 8, b: 18 };
  let ymax = 0;
  for (const s of series) for (const v of s.values) ymax = Math.max(ymax, v);
  ymax = ymax > 0 ? ymax * 1.15 : 1;
  const tmin = t.length ? t[0] : 0, tmax = t.length ? Math.max(t[t.length - 1], tmin + 1) : 1;
  const x = (v) => pad.l + ((v - tmin) / (tmax - tmin)) * (w - pad.l - pad.r);
  const y = (v) => h - pad.b - (v / ymax) * (h - pad.t - pad.b);
  ctx.strokeStyle = "#26313d"; ctx.fillStyle = "#8b98a5"; ctx.font = "11px system-ui";
  for (let i = 0; i <= 2; i++) {
    const v = (ymax * i) / 2;
    ctx.beginPath(); ctx.moveTo(pad.l, y(v)); ctx.lineTo(w - pad.r, y(v)); ctx.stroke();
    ctx.fillText(fmtNum(v, ymax < 3 ? 2 : 0), 2, y(v) + 4);
  }
  series.forEach((s, k) => {
    ctx.strokeStyle = s.color; ctx.lineWidth = 2; ctx.beginPath();
    s.values.forEach((v, i) => (i ? ctx.lineTo(x(t[i]), y(v)) : ctx.moveTo(x(t[i]), y(v))));
    ctx.stroke();
    ctx.fillStyle = s.color; ctx.fillText(s.label, pad.l + 6 + 80 * k, h - 4);
  });
}

function renderBottleneck(b) {
  if (!b) return;
  setText("bottleneck", b.kind, "kind k-" + b.kind);
  setText("bottleneck-for", b.for_s === null || b.for_s === undefined ? "" : `for ${fmtNum(b.for_s, 0)} s`);
  setText("bottleneck-reason", b.reason || "");
  setText("bottleneck-action", b.action || "");
  const table = $("evidence");
  table.replaceChildren();
  for (const [k, v] of Object.entries(b.evidence || {})) {
    const tr = table.insertRow();
    tr.insertCell().textContent = k;
    tr.insertCell().textContent = fmtNum(v, 3);
  }
}

function renderTenants(tenants) {
  const box = $("tenants");
  box.replaceChildren();
  if (!tenants || !tenants.length) { box.textContent = "none"; box.className = "muted"; return; }
  box.className = "";
  for (const t of tenants) {
    const row = document.createElement("div"); row.className = "tenant";
    const name = document.createElement("span"); name.textContent = t.tenant;
    const bar = document.createElement("div"); bar.className = "bar";
    bar.style.width = Math.max(2, 100 * t.share) + "%";
    const pct = document.createElement("span"); pct.textContent = fmtPct(t.share);
    row.append(name, bar, pct); box.append(row);
  }
}

function renderResources(r) {
  const table = $("resources");
  table.replaceChildren();
  const rows = [];
  if (r) {
    rows.push(["HTTP process CPU", r.api_cpu_percent === undefined ? "–" : fmtNum(r.api_cpu_percent) + "%"]);
    rows.push(["Engine CPU", r.engine_cpu_percent === undefined ? "–" : fmtNum(r.engine_cpu_percent) + "%"]);
    rows.push(["Engine busy (in step)", fmtPct(r.engine_busy)]);
    for (const g of r.gpus || []) {
      const mem = g.memory_total_bytes ? fmtPct(g.memory_used_bytes / g.memory_total_bytes) : fmtNum(g.memory_used_bytes / 2 ** 30, 2) + " GiB";
      rows.push([`GPU ${g.index}`, `util ${fmtNum(g.utilization_percent)}% · memory ${mem}`]);
    }
  }
  for (const [k, v] of rows) {
    const tr = table.insertRow();
    tr.insertCell().textContent = k; tr.insertCell().textContent = v;
  }
}

function renderReplicas(replicas) {
  const body = $("replicas").tBodies[0];
  body.replaceChildren();
  for (const r of replicas) {
    const s = r.state || {};
    const tr = body.insertRow();
    tr.dataset.url = r.url;
    const cells = [
      r.url, r.healthy ? (r.group === "fallback" ? "fallback" : "in rotation") : "out",
      r.breaker, fmtInt(r.in_flight), fmtInt(s.running), fmtInt(s.waiting),
      fmtNum(s.tokens_per_s), fmtPct(s.kv_usage), fmtSec(s.ttft_p99_s), fmtSec(s.tpot_p99_s),
      s.bottleneck ? s.bottleneck.kind : (r.error || "–"),
    ];
    cells.forEach((c, i) => {
      const td = tr.insertCell(); td.textContent = c;
      if (i === 1) td.className = r.healthy ? "ok" : "bad";
      if (i === 2) td.className = r.breaker === "closed" ? "ok" : r.breaker === "open" ? "bad" : "warn";
      if (i === 8) td.className = sloClass(s.ttft_p99_s, SLO.ttft);
      if (i === 9) td.className = sloClass(s.tpot_p99_s, SLO.tpot);
    });
  }
}

function renderBatch(b) {
  $("batch-panel").hidden = !b;
  if (!b) return;
  const lines = b.lines || {};
  setText("batch-error", b.available && b.storage_ok ? "" : "unavailable: " + (b.error || "storage"),
    b.available && b.storage_ok ? "muted" : "bad");
  setText("batch-pending", fmtInt(lines.pending));
  setText("batch-in-flight", fmtInt(lines.in_flight));
  setText("batch-limit", fmtInt(b.concurrency_limit));
  setText("batch-completed", fmtInt(lines.completed));
  setText("batch-failed", fmtInt(lines.failed));
  setText("batch-running", fmtInt(Object.values(b.batches || {}).reduce((a, x) => a + x, 0)));
  setText("batch-rate", fmtNum(b.lines_per_second, 2));
  const left = b.window_seconds_left;
  setText("batch-window", left === null || left === undefined ? "–"
    : left >= 3600 ? (left / 3600).toFixed(1) + " h" : left >= 60 ? (left / 60).toFixed(1) + " min"
    : fmtSec(left));
}

function render(st) {
  setText("mode", st.kind === "fleet" ? `fleet · ${st.replicas.length} upstream(s)` : "replica");
  setText("model", st.model ? "model " + st.model : "");
  setText("running", fmtInt(st.running));
  setText("waiting", fmtInt(st.waiting));
  setText("tokens_per_s", fmtNum(st.tokens_per_s));
  setText("kv_usage", fmtPct(st.kv_usage));
  setText("ttft_p50", fmtSec(st.ttft_p50_s), sloClass(st.ttft_p50_s, SLO.ttft));
  setText("ttft_p99", fmtSec(st.ttft_p99_s), sloClass(st.ttft_p99_s, SLO.ttft));
  setText("tpot_p50", fmtSec(st.tpot_p50_s), sloClass(st.tpot_p50_s, SLO.tpot));
  setText("tpot_p99", fmtSec(st.tpot_p99_s), sloClass(st.tpot_p99_s, SLO.tpot));
  setText("prefix_hit_rate", fmtPct(st.prefix_hit_rate));
  setText("requests_finished_total", fmtInt(st.requests_finished_total));
  setText("generation_tokens_total", fmtInt(st.generation_tokens_total));
  renderBottleneck(st.bottleneck);
  renderTenants(st.tenants);
  renderResources(st.resources);
  renderBatch(st.batch);
  $("replicas-panel").hidden = st.kind !== "fleet";
  if (st.kind === "fleet") renderReplicas(st.replicas);
  const a = st.autoscaler;
  $("autoscaler").hidden = !a;
  if (a) {
    setText("as-desired", fmtInt(a.desired)); setText("as-ready", fmtInt(a.ready));
    setText("as-starting", fmtInt(a.starting)); setText("as-draining", fmtInt(a.draining));
    setText("as-forecast", fmtNum(a.forecast_rps, 2));
  }
  const h = st.history || { t: [] };
  drawChart($("chart-tokens"), h.t, [{ values: h.tokens_per_s || [], color: "#58a6ff", label: "tokens/s" }]);
  drawChart($("chart-queue"), h.t, [
    { values: h.running || [], color: "#3fb950", label: "running" },
    { values: h.waiting || [], color: "#d29922", label: "waiting" },
  ]);
  drawChart($("chart-kv"), h.t, [{ values: (h.kv_usage || []).map((v) => 100 * v), color: "#bc8cff", label: "KV %" }]);
  document.body.dataset.updates = String(parseInt(document.body.dataset.updates || "0", 10) + 1);
  setText("updated", "updated " + new Date().toLocaleTimeString(), "muted");
}

async function poll() {
  try {
    const resp = await fetch("/v1/dashboard/state", { cache: "no-store" });
    if (!resp.ok) throw new Error("HTTP " + resp.status);
    render(await resp.json());
  } catch (e) {
    setText("updated", "cannot reach the server: " + e.message, "bad");
  } finally {
    setTimeout(poll, INTERVAL_MS);
  }
}

setText("slo-ttft", fmtSec(SLO.ttft));
setText("slo-tpot", fmtSec(SLO.tpot));
poll();
