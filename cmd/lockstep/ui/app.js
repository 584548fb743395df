// The Lockstep page: fetches /api/overview every second and renders it.
// Plain DOM, no dependencies; text goes through textContent only.
"use strict";

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return e;
}

function duration(ms) {
  if (ms == null) return "-";
  if (ms < 0) return "none";
  if (ms < 1000) return ms + "ms";
  const s = ms / 1000;
  if (s < 60) return s.toFixed(1) + "s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m" + Math.floor(s % 60) + "s";
  return Math.floor(m / 60) + "h" + (m % 60) + "m";
}

function when(ms, now) {
  if (!ms) return "-";
  return new Date(ms).toISOString().replace("T", " ").replace("Z", "") + " (" + duration(now - ms) + " ago)";
}

function taskLink(id) {
  if (!id) return "-";
  return el("a", { href: "tasks/" + encodeURIComponent(id), class: "task", "data-task": id }, id);
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function renderLocks(o) {
  const rows = o.locks.map((l) =>
    el("tr", { "data-resource": l.resource },
      el("td", {}, l.limit > 1 ? l.resource + " [" + l.permit + "/" + l.limit + "]" : l.resource), el("td", {}, l.holder || "-"), el("td", {}, taskLink(l.task_id)),
      el("td", {}, l.type || "-"), el("td", { class: "num" }, l.fence), el("td", { class: "num" }, duration(l.ttl_ms)),
      el("td", { class: "num" }, duration(l.held_ms)), el("td", { class: "num" }, l.waiters),
      el("td", { class: "num" }, l.progress_ms == null ? "-" : duration(l.progress_ms) + " ago")));
  fill($("locks").tBodies[0], rows);
  $("locks-count").textContent = o.locks_error ? "" : "(" + o.locks.length + ")";
  $("locks-empty").hidden = o.locks.length > 0;
  if (o.locks_error) { $("locks-empty").hidden = false; $("locks-empty").textContent = o.locks_error; }
}

function renderRates(o) {
  const rows = o.rates.map((r) =>
    el("tr", { "data-key": r.key },
      el("td", {}, r.key), el("td", { class: "num" }, r.interval_us < 1000 ? r.interval_us + "µs" : duration(Math.round(r.interval_us / 1000))),
      el("td", { class: "num" }, r.burst_left + "/" + r.burst), el("td", { class: "num" }, r.wait_ms > 0 ? "in " + duration(r.wait_ms) : "now")));
  fill($("rates").tBodies[0], rows);
  $("rates-count").textContent = o.rates_error ? "" : "(" + o.rates.length + ")";
  $("rates-empty").hidden = o.rates.length > 0;
  if (o.rates_error) { $("rates-empty").hidden = false; $("rates-empty").textContent = o.rates_error; }
}

function renderFair(o) {
  const rows = o.fair.map((f) =>
    el("tr", { "data-tenant": f.tenant },
      el("td", {}, f.queue), el("td", {}, f.type), el("td", {}, f.tenant), el("td", { class: "num" }, f.weight),
      el("td", { class: "num" }, f.backlog), el("td", { class: "num" }, (100 * f.share).toFixed(1) + "%")));
  fill($("fair").tBodies[0], rows);
  $("fair-count").textContent = o.fair_error ? "" : "(" + o.fair.length + ")";
  $("fair-empty").hidden = o.fair.length > 0;
  if (o.fair_error) { $("fair-empty").hidden = false; $("fair-empty").textContent = o.fair_error; }
}

function renderWaiters(o) {
  const blocks = Object.keys(o.waiters).sort().map((res) =>
    el("div", { class: "waiters", "data-resource": res },
      el("h3", {}, res),
      el("table", {},
        el("thead", {}, el("tr", {}, ...["#", "job", "type", "queue", "state", "waited"].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...o.waiters[res].map((w) =>
          el("tr", {}, el("td", {}, w.position),
            el("td", {}, w.kind === "call" ? "WithLock " + (w.holder || "?") : taskLink(w.task_id)), el("td", {}, w.type || "-"),
            el("td", {}, w.queue || "-"), el("td", {}, w.state), el("td", {}, duration(w.waited_ms))))))));
  $("waiters").replaceChildren(...blocks);
  $("waiters-empty").hidden = blocks.length > 0;
}

function renderSchedules(o) {
  const err = $("schedules-error");
  err.hidden = !o.schedules_error;
  err.textContent = o.schedules_error || "";
  const list = Array.isArray(o.schedules) ? o.schedules : [];
  fill($("schedules").tBodies[0], list.map((s) =>
    el("tr", { "data-schedule": s.name },
      el("td", {}, s.name), el("td", {}, s.cron), el("td", {}, s.timezone), el("td", {}, s.task),
      el("td", {}, s.source), el("td", {}, s.paused ? "yes" : "no"), el("td", {}, s.last_tick || "-"),
      el("td", {}, s.next_tick || "-"), el("td", {}, s.overlap || "allow"),
      el("td", {}, s.running ? taskLink(s.running) : "-", s.queued ? ` (+${s.queued} queued)` : ""))));
}

function renderTicks(o) {
  const names = Object.keys(o.ticks).sort();
  const blocks = names.map((name) => {
    const ticks = Array.isArray(o.ticks[name]) ? o.ticks[name] : [];
    const cols = ticks.length ? Object.keys(ticks[0]) : [];
    return el("div", { class: "ticks", "data-schedule": name },
      el("h3", {}, name),
      el("table", {},
        el("thead", {}, el("tr", {}, ...cols.map((c) => el("th", {}, c)))),
        el("tbody", {}, ...ticks.map((t) => el("tr", {}, ...cols.map((c) => {
          const v = t[c];
          if (c === "task_id") return el("td", {}, taskLink(v));
          return el("td", c === "state" ? { class: "state-" + v } : {}, typeof v === "object" && v !== null ? JSON.stringify(v) : v);
        }))))));
  });
  for (const [name, msg] of Object.entries(o.ticks_errors || {})) {
    blocks.push(el("p", { class: "error" }, name + ": " + msg));
  }
  $("ticks").replaceChildren(...blocks);
}

function renderLosses(o) {
  fill($("losses").tBodies[0], o.losses.map((l) =>
    el("tr", { "data-resource": l.resource },
      el("td", {}, when(l.at_ms, o.server_time_ms)), el("td", {}, l.resource), el("td", { class: "reason" }, l.reason),
      el("td", { class: "num" }, l.fence), el("td", {}, l.holder || "-"), el("td", {}, taskLink(l.task_id)),
      el("td", {}, l.type || "-"))));
  $("losses-empty").hidden = o.losses.length > 0;
}

async function refresh() {
  try {
    const r = await fetch("api/overview", { cache: "no-store" });
    if (!r.ok) throw new Error("HTTP " + r.status);
    const o = await r.json();
    renderLocks(o);
    renderRates(o);
    renderFair(o);
    renderWaiters(o);
    renderSchedules(o);
    renderTicks(o);
    renderLosses(o);
    const status = $("status");
    status.className = "muted";
    status.textContent = "updated " + new Date(o.server_time_ms || Date.now()).toISOString().substring(11, 19) + " UTC (Redis time)";
  } catch (e) {
    const status = $("status");
    status.className = "error";
    status.textContent = "cannot reach the Lockstep page's server: " + e.message;
  } finally {
    setTimeout(refresh, 1000);
  }
}

refresh();
