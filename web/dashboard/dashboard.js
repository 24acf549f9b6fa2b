// The trainguard dashboard: one page over the controller's HTTP API
// (docs/api.md). Everything it shows comes from the API; it refreshes when the
// live event stream says something happened, and every 2 s for the clocks.
// Data is put in the page as text (never as HTML).
"use strict";

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function absent(text) { return el("p", { class: "absent" }, text); }

function seconds(v) { return v == null ? "–" : v.toFixed(2) + " s"; }

async function getJson(path) {
  const r = await fetch(path, { cache: "no-store" });
  const body = await r.json().catch(() => ({ error: "not JSON" }));
  if (!r.ok) throw Object.assign(new Error(body.error || r.statusText), { status: r.status });
  return body;
}

function showJob(job) {
  document.title = "trainguard " + job.job_id + " " + job.state;
  $("job-id").textContent = job.job_id;
  $("job-state").textContent = job.state;
  $("job-state").className = "state " + job.state;
  $("step").textContent = job.step >= 0 ? job.step : "no step yet";
  $("checkpoint").textContent = job.checkpoint_step >= 0 ? "checkpoint " + job.checkpoint_step : "no checkpoint yet";
  $("rate").textContent = job.steps_per_second > 0 ? job.steps_per_second.toFixed(2) : "–";
  $("world").textContent = job.active_nnodes + " of " + job.nnodes + " nodes, world size " + job.world_size;
  $("ettr").textContent = job.ettr == null ? "unknown" : (100 * job.ettr).toFixed(1) + " %";
  $("wall").textContent = job.ettr == null ? "no rank reported a step yet" : "over " + seconds(job.wall_s) + " of wall time";
  $("restarts").textContent = job.restart_count + " / " + job.max_restarts;
  $("generation").textContent = "generation " + job.generation + (job.incident_open ? ", an incident is being handled" : "");
}

const TERMS = [
  ["startup_s", "startup (launch to first step)", "#8e9aaf"],
  ["lost_work_s", "lost work", "#c0392b"],
  ["detection_s", "detection", "#e67e22"],
  ["shutdown_s", "shutdown", "#f1c40f"],
  ["restart_s", "restart", "#9b59b6"],
  ["tail_s", "tail (since the last step)", "#95a5a6"],
  ["checkpoint_overhead_s", "checkpoint overhead", "#3498db"],
];

function showDowntime(d) {
  const body = $("downtime").querySelector("tbody");
  const bar = $("downtime-bar");
  body.replaceChildren();
  bar.replaceChildren();
  const wall = d.wall_s || 0;
  const rows = [];
  if (d.productive_s != null) rows.push(["productive", d.productive_s, "#1f8a4c"]);
  for (const [key, name, colour] of TERMS) rows.push([name, d.downtime[key], colour]);
  for (const [name, value, colour] of rows) {
    const share = wall > 0 ? (100 * value) / wall : 0;
    body.append(el("tr", { "data-term": name }, el("td", {}, name), el("td", {}, value.toFixed(2)),
                   el("td", {}, share.toFixed(1) + " %")));
    if (share > 0) {
      const part = el("div", { title: name + " " + value.toFixed(2) + " s" });
      part.style.width = share + "%";
      part.style.background = colour;
      bar.append(part);
    }
  }
  if (d.productive_s == null) body.append(el("tr", {}, el("td", { colspan: 3, class: "absent" },
      "productive time and ETTR are unknown: no rank reported a step")));
  // Storage's share, inside the terms above (of productive, of checkpoint overhead).
  const storage = d.storage || {};
  for (const [key, name] of [["data_wait_s", "of productive: waiting for data"],
                             ["checkpoint_wait_s", "of checkpoint overhead: waiting for the previous save's write"]]) {
    if (storage[key] == null) continue;
    const share = wall > 0 ? (100 * storage[key]) / wall : 0;
    body.append(el("tr", { "data-part": key, class: "part" }, el("td", {}, name),
                   el("td", {}, storage[key].toFixed(2)), el("td", {}, share.toFixed(1) + " %")));
  }
  if (storage.line) body.append(el("tr", { class: "storage" }, el("td", { colspan: 3 }, storage.line)));
  // What the checkpoint interval cost, against the optimum for the job's own figures.
  const checkpoints = d.checkpoints || {};
  if (checkpoints.line) body.append(el("tr", { class: "checkpoints" }, el("td", { colspan: 3 }, checkpoints.line)));
}

function showIncidents(incidents) {
  const box = $("incidents");
  box.replaceChildren();
  if (incidents.length === 0) { box.append(absent("No incidents.")); return; }
  for (const inc of incidents.slice().reverse()) {
    const culprit = [];
    if ((inc.culprit_ranks || []).length) culprit.push("rank " + inc.culprit_ranks.join(", "));
    if ((inc.culprit_nodes || []).length) culprit.push("on " + inc.culprit_nodes.join(", "));
    // Below the acting threshold the reading is a guess, and says so.
    const sure = typeof inc.confidence === "number"
      ? (inc.determined === false
        ? "undetermined: confidence " + inc.confidence.toFixed(2) + " below " + (inc.acting_threshold || 0).toFixed(2)
        : "confidence " + inc.confidence.toFixed(2))
      : "";
    const div = el("div", { class: "incident", "data-incident": inc.incident },
      el("div", { class: "title" }, "#" + inc.incident + " " + inc.failure_kind + ": ",
         el("span", { class: "category" }, inc.category || "not attributed yet"),
         inc.hardware ? " (hardware" : " (software", ", " + (inc.persistence || "persistence unknown") + ") ",
         el("span", { class: inc.determined === false ? "confidence undetermined" : "confidence" }, sure)),
      el("div", { class: "culprit" }, "culprit: " + (culprit.length ? culprit.join(" ") : "unknown")),
      el("div", { class: "decision" }, "decision: " + (inc.decision || "pending") + (inc.reason ? " — " + inc.reason : "")),
      el("div", {}, "downtime: detection " + seconds(inc.detection_s) + ", lost work " + seconds(inc.lost_s) +
         " (" + inc.lost_steps + " steps), shutdown " + seconds(inc.shutdown_s) + ", restart " + seconds(inc.restart_s)));
    const corroboration = corroborationText(inc.corroboration);
    if (corroboration) div.append(el("div", { class: "corroboration" }, "corroboration: " + corroboration));
    for (const ev of (inc.evidence || []).slice(0, 4)) {
      div.append(el("div", { class: "evidence" }, "[" + (ev.role || "") + "] " + (ev.line || "")));
    }
    box.append(div);
  }
}

// What the culprit nodes' own signals said of a verdict read from log lines.
function corroborationText(c) {
  if (!c || !c.log_only) return "";
  const parts = Object.entries(c.support || {}).map(([node, lines]) => node + ": " + (lines[0] || ""));
  if ((c.unsupported || []).length) parts.push("nothing of " + c.unsupported.join(", ") + "'s own agrees (suspected)");
  return parts.join("; ");
}

function diagnosticsText(d) {
  if (!d) return "none";
  const figures = d.figures || [];
  const failed = figures.filter((f) => f.error);
  return figures.length + " figures (" + d.mode + ")" + (failed.length ? ", " + failed.length + " failed" : "");
}

// Each node's standing naming from /api/v1/stragglers: its newest
// "straggler" event not followed by a "straggler_cleared" (the same event
// the event list, the API and the heatmap show).
function standingNamings(findings) {
  const named = {};
  for (const e of findings || []) {
    if (e.kind === "straggler") named[e.node] = e;
    else if (e.kind === "straggler_cleared") delete named[e.node];
  }
  return named;
}

function stragglerText(n, e) {
  if (!n.straggler && !e) return "no";
  if (!e) return "yes";
  const d = e.detail || {};
  const pct = typeof d.slowdown === "number" ? (100 * d.slowdown).toFixed(1) + " % slower" : "";
  return [(d.signal || "") + " straggler since step " + d.first_step + " (named at step " + e.step + ")",
          d.phase ? "in " + d.phase : "", pct, d.measure ? "by " + d.measure.replace("_", " ") : "",
          d.evict ? "evictable" : "", "cause: " + (d.cause || "unknown")].filter((x) => x).join(", ");
}

function showNodes(nodes, named) {
  const body = $("nodes").querySelector("tbody");
  body.replaceChildren();
  if (nodes.length === 0) {
    body.append(el("tr", {}, el("td", { colspan: 10, class: "absent" }, "No node has registered yet.")));
    return;
  }
  for (const n of nodes) {
    const health = n.health || { status: "ok", reason: "" };
    const cordoned = health.status === "cordoned";
    const button = el("button", { type: "button", "data-node": n.node_id, class: cordoned ? "uncordon" : "cordon" },
                      cordoned ? "Uncordon" : "Cordon");
    button.addEventListener("click", () => nodeAction(n.node_id, cordoned ? "uncordon" : "cordon"));
    const naming = named[n.node_id];
    const straggler = el("td", naming ? { class: "straggler", "data-step": naming.step, "data-phase": naming.detail.phase || "",
                                          "data-cause": naming.detail.cause || "" } : {},
                         stragglerText(n, naming));
    body.append(el("tr", { "data-node": n.node_id },
      el("td", {}, n.node_id), el("td", {}, n.role + (n.connected ? "" : " (disconnected)")),
      el("td", {}, n.group_rank >= 0 ? n.group_rank : "–"), el("td", {}, (n.ranks || []).join(", ") || "–"),
      el("td", {}, n.rack || "–"),
      el("td", {}, n.heartbeat_age_s == null ? "none yet" : n.heartbeat_age_s.toFixed(1) + " s ago"),
      el("td", { class: "health-" + health.status }, health.status + (health.reason ? ": " + health.reason : "")),
      straggler, el("td", {}, diagnosticsText(n.diagnostics)), el("td", {}, button)));
  }
}

async function nodeAction(node, action) {
  const secret = $("secret").value.trim();
  const reason = $("reason").value.trim();
  const result = $("action-result");
  sessionStorage.setItem("trainguard-secret", secret);
  try {
    const r = await fetch("/api/v1/nodes/" + encodeURIComponent(node) + "/" + action, {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: "Bearer " + secret },
      body: JSON.stringify({ reason }),
    });
    const body = await r.json().catch(() => ({}));
    result.textContent = r.ok ? "node " + node + ": " + body.status + " (was " + body.was + ")"
                              : action + " " + node + " refused: " + (body.error || r.statusText);
  } catch (e) {
    result.textContent = action + " " + node + " failed: " + e.message;
  }
  refresh();
}

function showHang(hang) {
  const box = $("hang");
  box.replaceChildren();
  if (!hang) { box.append(absent("No hang in this job.")); return; }
  box.append(el("p", {}, "Incident #" + hang.incident + ": " + hang.description));
  box.append(el("pre", {}, hang.text || ""));
}

function showHeatmap(available) {
  const box = $("heatmap");
  if (!available) { box.replaceChildren(absent("No step timings yet.")); return; }
  const img = el("img", { alt: "per-node phase heatmap", src: "/api/v1/heatmap?format=svg&t=" + Date.now() });
  box.replaceChildren(img);
}

// The GPU series' SM clocks (GPUs x time, throttled GPUs marked); a job
// whose nodes report no GPU has none (the API answers 404).
function showGpuHeatmap() {
  const box = $("gpu-heatmap");
  const img = el("img", { alt: "per-GPU SM clock heatmap", src: "/api/v1/heatmap?gpu=sm_clock&format=svg&t=" + Date.now() });
  img.addEventListener("error", () => box.replaceChildren(absent("No GPU series yet (no GPU reported).")));
  img.addEventListener("load", () => box.replaceChildren(img));
}

let refreshing = false, again = false;
async function refresh() {
  if (refreshing) { again = true; return; }
  refreshing = true;
  try {
    const [job, nodes, incidents, downtime, stragglers] = await Promise.all([
      getJson("/api/v1/job"), getJson("/api/v1/nodes"), getJson("/api/v1/incidents"), getJson("/api/v1/downtime"),
      getJson("/api/v1/stragglers")]);
    showJob(job);
    showNodes(nodes.nodes, standingNamings(stragglers.findings));
    showIncidents(incidents.incidents);
    showDowntime(downtime);
    const hang = await getJson("/api/v1/hang").catch(() => null);
    showHang(hang);
  } catch (e) {
    $("live").textContent = "API: " + e.message;
  } finally {
    refreshing = false;
    if (again) { again = false; refresh(); }
  }
}

let timingsShown = false;
async function refreshHeatmap() {
  const t = await getJson("/api/v1/timings").catch(() => ({ timings: [] }));
  const have = t.timings.length > 0;
  if (have || !timingsShown) showHeatmap(have);
  timingsShown = have;
  showGpuHeatmap();
}

function listen() {
  const stream = new EventSource("/api/v1/events/stream?plain=1");
  const list = $("events");
  let pending = null;
  stream.onopen = () => { $("live").textContent = "live"; $("live").className = "live on"; };
  stream.onerror = () => { $("live").textContent = "stream closed; reconnecting"; $("live").className = "live off"; };
  const onEvent = (msg) => {
    const e = JSON.parse(msg.data);
    const time = new Date(e.unix_ms).toLocaleTimeString();
    list.prepend(el("li", { "data-kind": e.kind }, time + " " + e.kind + (e.node ? " " + e.node : "") + ": " + e.message));
    while (list.children.length > 200) list.lastChild.remove();
    if (!pending) pending = setTimeout(() => { pending = null; refresh(); }, 300);
  };
  stream.onmessage = onEvent;
  stream.addEventListener("end", () => { stream.close(); $("live").textContent = "the controller has stopped"; $("live").className = "live off"; });
}

$("secret").value = sessionStorage.getItem("trainguard-secret") || "";
refresh();
refreshHeatmap();
listen();
setInterval(refresh, 2000);
setInterval(refreshHeatmap, 10000);
