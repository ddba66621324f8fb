// weft's dashboard: reads this node's API (/api/v1) with the token the
// operator gives (kept in this tab's sessionStorage only) and shows the
// cluster, capacity, volumes, hosts, this node's I/O and what changed.
// It asks again every second, and at once when the node says something
// changed (GET changes, a long poll). What an admin token can do from the
// page is in actions.js. Every value from the API goes into the page as
// text, never as markup.
"use strict";

const POLL_MS = 1000;
const MIN_GAP_MS = 150; // between two views, however fast changes come
const HISTORY = 300; // samples kept for the charts: 5 minutes at 1 s
const EVENTS_MAX = 200;

const FETCH_TIMEOUT_MS = 5000;
// A change may take long on the node (a primary's move waits for its
// hand-over, a drain moves many): the page waits for its answer this long.
const ACTION_TIMEOUT_MS = 120000;

const state = {
  token: sessionStorage.getItem("weft-token"),
  previous: null, // the last snapshot, to find what changed
  counters: null, // the last statistics, reduced: {timeNs, all, volumes: Map}
  points: { all: [], volumes: new Map() }, // chart points, per volume and in all
  bounds: [],
  events: [],
  chartNode: "", // the node whose I/O the charts show ("": this one)
  store: null, // the cluster's store's health, as last answered
  storeAsking: false,
  statsError: null,
  primaries: new Map(), // replicated volume -> the node of its primary, as last seen
  generation: 0, // bumped at sign-in and sign-out: a poll of an older one stops
  role: null, // the token's role (GET session): "admin" may act
  cluster: false,
  node: null, // this node's name in its cluster
  seen: null, // the node's status generation (GET changes) of the last view
  wake: null, // aborts the wait for a change: an action asks for a view now
  pending: false, // a view was asked for while none was awaited
  roleUnknown: false, // the role was not learned at sign-in: asked again
};

const $ = (id) => document.getElementById(id);

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value >= 100 || unit === 0 ? value.toFixed(0) : value.toFixed(1)} ${units[unit]}`;
}

function percent(part, whole) {
  return whole > 0 ? part / whole : 0;
}

function level(ratio) {
  return ratio >= 0.9 ? "critical" : ratio >= 0.8 ? "warning" : "ok";
}

// A signal that aborts when either does.
function either(a, b) {
  const both = new AbortController();
  for (const signal of [a, b]) {
    if (signal.aborted) both.abort();
    else signal.addEventListener("abort", () => both.abort(), { once: true });
  }
  return both.signal;
}

// Calls the API; `options`: method, body (sent as JSON), signal. Throws an
// Error with the API's message, status and code when it refuses.
async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${state.token}` };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const acting = (options.method || "GET") !== "GET";
  const timeout = AbortSignal.timeout(acting ? ACTION_TIMEOUT_MS : FETCH_TIMEOUT_MS + (options.waitMs || 0));
  const response = await fetch(`/api/v1/${path}`, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
    cache: "no-store",
    signal: options.signal ? either(options.signal, timeout) : timeout,
  });
  if (response.ok) return response.json(); // a body cut short throws too
  const body = await response.json().catch(() => ({}));
  const error = new Error(body.message || `HTTP ${response.status}`);
  error.status = response.status;
  error.code = body.code;
  error.hint = body.hint;
  throw error;
}

// The statistics of the node the charts show (this one, or another of the
// cluster): null, and said under the charts, if that node does not answer.
function nodeStats() {
  const path = state.chartNode ? `stats?node=${encodeURIComponent(state.chartNode)}` : "stats";
  return api(path).then(
    (stats) => {
      state.statsError = null;
      return stats;
    },
    (error) => {
      if (error.status === 401) throw error;
      state.statsError = `no statistics from ${state.chartNode || "this node"}: ${error.message}`;
      return null;
    },
  );
}

async function snapshot() {
  if (state.roleUnknown) learnSession(await api("session").catch(() => null));
  const cluster = state.cluster;
  const statsNode = state.chartNode;
  const [pools, volumes, hosts, stats, nodes] = await Promise.all([
    api("pools"),
    api("volumes"),
    api("hosts"),
    nodeStats(),
    cluster ? api("nodes") : null,
  ]);
  if (cluster) askStore();
  return { pools, volumes, hosts, stats, statsNode, nodes, store: cluster ? state.store : null, at: Date.now() };
}

// Asks whether the cluster's store answers, one question at a time and
// beside the views: a store that does not answer holds its question for
// seconds, never the page. Its health is a finding, not a failure.
function askStore() {
  if (state.storeAsking) return;
  state.storeAsking = true;
  const generation = state.generation;
  api("cluster/store")
    .catch((error) => ({ reachable: false, error: error.message }))
    .then((health) => {
      if (generation === state.generation) state.store = health;
    })
    .finally(() => {
      state.storeAsking = false;
    });
}

// What each element last showed (see same): an element whose content would
// not change is left alone, so that the focus and a control's state stay.
const shown = new WeakMap();

// True if `element` shows `signature` already; else remembers it.
function same(element, signature) {
  if (shown.get(element) === signature) return true;
  shown.set(element, signature);
  return false;
}

function cellText(cell) {
  if (cell instanceof Node) return `${cell.className}:${cell.textContent}`;
  return cell === null || cell === undefined ? "" : String(cell);
}

// Fills a table's body with `rows` (cells as text or nodes) unless it shows
// them already; the focus stays on the control of the same text.
function fillTable(table, rows) {
  if (same(table, JSON.stringify(rows.map((cells) => cells.map(cellText))))) return;
  const body = table.tBodies[0];
  const active = document.activeElement;
  // The row is known by its first cell (a node's, a pool's, a volume's name).
  const focused = body.contains(active) ? { text: active.textContent, row: active.closest("tr").cells[0].textContent } : null;
  const fresh = document.createElement("tbody");
  for (const cells of rows) {
    const row = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      if (cell instanceof Node) td.appendChild(cell);
      else td.textContent = cellText(cell);
      row.appendChild(td);
    }
    fresh.appendChild(row);
  }
  table.replaceChild(fresh, body);
  if (focused !== null) {
    // The same row's control of that text, else its first: never another row's.
    const row = [...fresh.rows].find((r) => r.cells[0].textContent === focused.row);
    const buttons = row ? [...row.querySelectorAll("button")] : [];
    const target = buttons.find((b) => b.textContent === focused.text) || buttons[0];
    if (target) target.focus();
  }
}

function card(title, value, className) {
  const box = el("div", null, `card ${className || ""}`);
  box.appendChild(el("span", title, "card-title"));
  box.appendChild(el("strong", value));
  return box;
}

function badge(text, className) {
  return el("span", text, `badge ${className || text}`);
}

function usage(allocated, capacity) {
  const ratio = percent(allocated, capacity);
  const wrap = el("span", null, "usage");
  const meter = el("meter");
  meter.min = 0;
  meter.max = 1;
  meter.low = 0.8;
  meter.high = 0.9;
  meter.optimum = 0;
  meter.value = ratio;
  wrap.appendChild(meter);
  wrap.appendChild(el("span", `${bytes(allocated)} (${(ratio * 100).toFixed(0)}%)`, level(ratio)));
  return wrap;
}

function renderCluster(s) {
  const summary = $("cluster-summary");
  summary.replaceChildren();
  if (!s.nodes) {
    summary.appendChild(card("Mode", "single node"));
    fillTable($("nodes"), []);
    $("nodes").hidden = true;
    return;
  }
  $("nodes").hidden = false;
  const count = (wanted) => s.nodes.filter((n) => n.state === wanted).length;
  summary.appendChild(card("Nodes up", count("up")));
  summary.appendChild(card("Cordoned", count("cordoned"), count("cordoned") ? "warning" : ""));
  summary.appendChild(card("Down", count("down"), count("down") ? "critical" : ""));
  const controller = s.nodes.find((n) => n.controller);
  summary.appendChild(card("Controller", controller ? controller.name : "none"));
  if (s.store) {
    const store = s.store.reachable ? `answers (${s.store.answer_ms} ms)` : `does not answer: ${s.store.error}`;
    const title = s.store.location ? s.store.location.split(" ")[0] : "store";
    summary.appendChild(card(`Store (${title})`, store, s.store.reachable ? "" : "critical"));
  }
  fillTable(
    $("nodes"),
    s.nodes.map((n) => [
      n.name,
      badge(n.state),
      n.zone || "",
      n.controller ? "yes" : "",
      n.pools.map((p) => p.name + (p.failed ? " (failed)" : "")).join(", "),
      usage(n.allocated_bytes, n.capacity_bytes),
      n.volumes,
      n.heartbeat_unix_ms ? `${Math.max(0, Math.round((Date.now() - n.heartbeat_unix_ms) / 1000))} s ago` : "",
      nodeActions(n),
    ]),
  );
}

function renderCapacity(s) {
  const total = (field) => s.pools.reduce((sum, p) => sum + p[field], 0);
  const capacity = total("capacity_bytes");
  const allocated = total("allocated_bytes");
  const provisioned = total("provisioned_bytes");
  const summary = $("capacity-summary");
  summary.replaceChildren(
    card("Usable", bytes(capacity)),
    card("Allocated", `${bytes(allocated)} (${(percent(allocated, capacity) * 100).toFixed(0)}%)`, level(percent(allocated, capacity))),
    card("Provisioned", `${bytes(provisioned)} (${percent(provisioned, capacity).toFixed(2)}x usable)`),
    card("Pools failed", s.pools.filter((p) => p.state === "failed").length, s.pools.some((p) => p.state === "failed") ? "critical" : ""),
  );
  fillTable(
    $("pools"),
    s.pools.map((p) => [
      p.name,
      p.node || "this node",
      badge(p.state),
      bytes(p.capacity_bytes),
      usage(p.allocated_bytes, p.capacity_bytes),
      `${bytes(p.provisioned_bytes)} (${p.overcommit === null ? "-" : p.overcommit.toFixed(2)}x)`,
      p.volumes,
      poolActions(p),
    ]),
  );
}

function copies(v) {
  if (!v.replicas) return "one copy";
  return v.replicas
    .map((r) => {
      let text = `${r.node}: ${r.role} ${r.state}`;
      if (r.rebuild) {
        const done = percent(r.rebuild.done_bytes, r.rebuild.total_bytes) * 100;
        const eta = r.rebuild.eta_s === null || r.rebuild.eta_s === undefined ? "" : `, ${r.rebuild.eta_s} s left`;
        text += ` ${done.toFixed(0)}% at ${bytes(r.rebuild.rate_bytes_per_s)}/s${eta}`;
      }
      return text;
    })
    .join("; ");
}

function limits(q) {
  const parts = [];
  if (q.iops_max) parts.push(`${q.iops_max} IOPS`);
  if (q.bw_max) parts.push(`${bytes(q.bw_max)}/s`);
  if (q.read_iops_max) parts.push(`read ${q.read_iops_max} IOPS`);
  if (q.read_bw_max) parts.push(`read ${bytes(q.read_bw_max)}/s`);
  if (q.write_iops_max) parts.push(`write ${q.write_iops_max} IOPS`);
  if (q.write_bw_max) parts.push(`write ${bytes(q.write_bw_max)}/s`);
  return parts.join(", ");
}

function renderVolumes(s) {
  const filter = $("volume-filter").value.trim().toLowerCase();
  const shown = s.volumes.filter(
    (v) => !filter || [v.name, v.node || "", v.pool].some((text) => text.toLowerCase().includes(filter)),
  );
  fillTable(
    $("volume-table"),
    shown.map((v) => [
      volumeButton(v.name),
      bytes(v.size_bytes),
      v.node || "this node",
      v.pool,
      badge(v.state),
      copies(v),
      limits(v.qos),
      v.hosts.join(", "),
      v.connected_hosts.length,
    ]),
  );
  $("volume-count").textContent = `${shown.length} of ${s.volumes.length} volumes`;
}

function renderHosts(s) {
  fillTable(
    $("host-table"),
    s.hosts.map((h) => [h.name, h.nqn, h.dhchap, h.tls ? "yes" : "", h.volumes.join(", ")]),
  );
}

// One statistics sample reduced to counters: per namespace first (so that a
// namespace that appears, goes or restarts never makes a rate negative),
// then summed per volume and in all.
function reduce(stats) {
  const namespaces = new Map();
  for (const ns of stats.namespaces) {
    const buckets = ns.read.buckets.map((n, i) => n + (ns.write.buckets[i] || 0));
    namespaces.set(`${ns.nqn}\n${ns.nsid}`, {
      volume: ns.volume,
      readOps: ns.read.ops,
      writeOps: ns.write.ops,
      bytes: ns.read.bytes + ns.write.bytes,
      buckets,
    });
  }
  return { timeNs: stats.time_ns, namespaces };
}

function emptyDelta() {
  return { read: 0, write: 0, bytes: 0, buckets: [] };
}

// What happened between two reduced samples, per volume and in all.
function deltas(before, after) {
  const all = emptyDelta();
  const volumes = new Map();
  for (const [key, b] of after.namespaces) {
    const a = before.namespaces.get(key);
    if (!a || b.readOps < a.readOps || b.writeOps < a.writeOps) continue; // new or restarted
    const targets = [all];
    if (b.volume) {
      if (!volumes.has(b.volume)) volumes.set(b.volume, emptyDelta());
      targets.push(volumes.get(b.volume));
    }
    for (const d of targets) {
      d.read += b.readOps - a.readOps;
      d.write += b.writeOps - a.writeOps;
      d.bytes += Math.max(0, b.bytes - a.bytes);
      b.buckets.forEach((n, i) => {
        d.buckets[i] = (d.buckets[i] || 0) + Math.max(0, n - (a.buckets[i] || 0));
      });
    }
  }
  return { all, volumes };
}

// Upper bound (ms) of the bucket holding quantile q of `counts`; the last
// bucket has no bound: Infinity.
function quantileMs(counts, q) {
  const total = counts.reduce((a, b) => a + b, 0);
  if (total <= 0) return null;
  let seen = 0;
  for (let i = 0; i < counts.length; i += 1) {
    seen += counts[i];
    if (seen >= q * total) return i < state.bounds.length ? state.bounds[i] / 1000 : Infinity;
  }
  return null;
}

function point(delta, seconds) {
  return {
    read: delta.read / seconds,
    write: delta.write / seconds,
    mib: delta.bytes / seconds / 1048576,
    p50: quantileMs(delta.buckets, 0.5),
    p99: quantileMs(delta.buckets, 0.99),
  };
}

function push(list, value) {
  list.push(value);
  if (list.length > HISTORY) list.shift();
}

// Adds a statistics sample: one chart point per volume and one in all.
function addSample(stats) {
  state.bounds = stats.latency_bounds_us;
  const now = reduce(stats);
  const before = state.counters;
  state.counters = now;
  if (!before) return;
  const seconds = (now.timeNs - before.timeNs) / 1e9;
  if (seconds <= 0) return; // a node restarted: counting starts again
  if (seconds < 0.9) {
    state.counters = before; // views come faster than once a second: one point a second
    return;
  }
  const { all, volumes } = deltas(before, now);
  push(state.points.all, point(all, seconds));
  for (const [name, delta] of volumes) {
    if (!state.points.volumes.has(name)) state.points.volumes.set(name, []);
    push(state.points.volumes.get(name), point(delta, seconds));
  }
  for (const name of [...state.points.volumes.keys()]) {
    if (!volumes.has(name)) state.points.volumes.delete(name); // gone from this node
  }
}

function milliseconds(value) {
  return value === Infinity ? `>${state.bounds[state.bounds.length - 1] / 1000}` : `${value}`;
}

function finite(value) {
  return value === Infinity ? state.bounds[state.bounds.length - 1] / 1000 : value;
}

function draw(svg, lines) {
  svg.replaceChildren();
  const values = lines.flatMap((line) => line.values.filter((v) => v !== null));
  const top = Math.max(1e-9, ...values);
  for (const line of lines) {
    const step = 300 / Math.max(1, HISTORY - 1);
    const offset = 300 - step * (line.values.length - 1);
    const coordinates = line.values
      .map((v, i) => (v === null ? null : `${(offset + i * step).toFixed(1)},${(98 - (v / top) * 94).toFixed(1)}`))
      .filter((p) => p !== null);
    if (coordinates.length === 0) continue;
    const polyline = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    polyline.setAttribute("points", coordinates.join(" "));
    polyline.setAttribute("class", line.className);
    svg.appendChild(polyline);
  }
}

// The nodes whose I/O the charts can show (a cluster's), and what failed.
function renderChartNodes(s) {
  $("chart-node-field").hidden = !s.nodes;
  $("charts-error").textContent = state.statsError || "";
  if (!s.nodes) return;
  const select = $("chart-node");
  const names = s.nodes.map((n) => n.name).filter((name) => name !== state.node);
  if (same(select, JSON.stringify(names))) return;
  select.replaceChildren(el("option", `${state.node} (this node)`));
  select.options[0].value = "";
  for (const name of names) {
    const option = el("option", name);
    option.value = name;
    select.appendChild(option);
  }
  select.value = state.chartNode;
}

// The charts show another node's I/O from now on.
function chooseChartNode(name) {
  state.chartNode = name;
  state.counters = null;
  state.points = { all: [], volumes: new Map() };
  renderCharts();
  wakeUp();
}

function renderCharts() {
  const select = $("chart-volume");
  const names = [...state.points.volumes.keys()].sort();
  const known = [...select.options].map((o) => o.value).filter(Boolean);
  if (names.join("\n") !== known.join("\n")) {
    const chosen = select.value;
    select.replaceChildren(el("option", "All volumes"));
    select.options[0].value = "";
    for (const name of names) {
      const option = el("option", name);
      option.value = name;
      select.appendChild(option);
    }
    select.value = names.includes(chosen) ? chosen : "";
  }
  const points = select.value ? state.points.volumes.get(select.value) || [] : state.points.all;
  draw($("chart-iops"), [
    { className: "read", values: points.map((p) => p.read) },
    { className: "write", values: points.map((p) => p.write) },
  ]);
  draw($("chart-bw"), [{ className: "read", values: points.map((p) => p.mib) }]);
  draw($("chart-latency"), [
    { className: "read", values: points.map((p) => (p.p50 === null ? null : finite(p.p50))) },
    { className: "write", values: points.map((p) => (p.p99 === null ? null : finite(p.p99))) },
  ]);
  const last = points[points.length - 1];
  $("now-iops").textContent = last ? `now: ${last.read.toFixed(0)} read, ${last.write.toFixed(0)} write` : "";
  $("now-bw").textContent = last ? `now: ${last.mib.toFixed(1)} MiB/s` : "";
  $("now-latency").textContent =
    last && last.p99 !== null ? `now: p50 ${milliseconds(last.p50)} ms, p99 ${milliseconds(last.p99)} ms` : "now: no I/O";
}

function note(text, className) {
  state.events.unshift({ at: new Date(), text, className });
  state.events.length = Math.min(state.events.length, EVENTS_MAX);
}

// What changed between two snapshots, as events.
function changes(before, after) {
  const byName = (list) => new Map((list || []).map((item) => [item.name, item]));
  if (before.nodes && after.nodes) {
    const old = byName(before.nodes);
    for (const node of after.nodes) {
      const was = old.get(node.name);
      if (!was) note(`node ${node.name} joined (${node.state})`, "ok");
      else if (was.state !== node.state) note(`node ${node.name} is ${node.state} (was ${was.state})`, node.state === "down" ? "critical" : node.state === "up" ? "ok" : "warning");
    }
  }
  if (before.store && after.store && before.store.reachable !== after.store.reachable) {
    if (after.store.reachable) note("the cluster's store answers again", "ok");
    else note(`the cluster's store does not answer: ${after.store.error}`, "critical");
  }
  const oldPools = new Map(before.pools.map((p) => [`${p.node}/${p.name}`, p]));
  for (const pool of after.pools) {
    const was = oldPools.get(`${pool.node}/${pool.name}`);
    if (was && was.state !== pool.state) note(`pool ${pool.name}${pool.node ? ` on ${pool.node}` : ""} is ${pool.state}${pool.failure ? `: ${pool.failure}` : ""}`, pool.state === "failed" ? "critical" : "ok");
    const ratio = percent(pool.allocated_bytes, pool.capacity_bytes);
    if (was && level(ratio) !== "ok" && level(percent(was.allocated_bytes, was.capacity_bytes)) !== level(ratio)) note(`pool ${pool.name} is ${(ratio * 100).toFixed(0)}% allocated`, level(ratio));
  }
  const oldVolumes = byName(before.volumes);
  const newVolumes = byName(after.volumes);
  for (const volume of after.volumes) {
    const was = oldVolumes.get(volume.name);
    if (!was) {
      note(`volume ${volume.name} created (${bytes(volume.size_bytes)})`, "ok");
      continue;
    }
    const oldReplicas = new Map((was.replicas || []).map((r) => [r.node, r]));
    for (const replica of volume.replicas || []) {
      const r0 = oldReplicas.get(replica.node);
      if (!r0) continue;
      if (!r0.rebuild && replica.rebuild) note(`volume ${volume.name}: rebuild of the copy on ${replica.node} started (${bytes(replica.rebuild.total_bytes)})`, "warning");
      if (r0.state !== replica.state && replica.state === "in-sync") note(`volume ${volume.name}: the copy on ${replica.node} is in sync${r0.rebuild ? " (rebuild done)" : ""}`, "ok");
      else if (r0.state !== replica.state) note(`volume ${volume.name}: the copy on ${replica.node} is ${replica.state}`, "warning");
    }
  }
  for (const volume of before.volumes) {
    if (!newVolumes.has(volume.name)) note(`volume ${volume.name} deleted`, "ok");
  }
}

// Each replicated volume's primary as last seen: a move or failover shows
// even when the list had the volume without its copies in between (its
// node between owners, or down).
function primaries(s, noting) {
  const listed = new Set();
  for (const volume of s.volumes) {
    listed.add(volume.name);
    const primary = (volume.replicas || []).find((r) => r.role === "primary");
    if (!primary) continue;
    const known = state.primaries.get(volume.name);
    if (noting && known && known !== primary.node) {
      note(`volume ${volume.name}: primary moved from ${known} to ${primary.node} (failover or move)`, "warning");
    }
    state.primaries.set(volume.name, primary.node);
  }
  for (const name of [...state.primaries.keys()]) if (!listed.has(name)) state.primaries.delete(name);
}

function renderEvents() {
  const list = $("event-list");
  list.replaceChildren(
    ...state.events.map((event) => {
      const item = el("li", null, event.className);
      item.appendChild(el("time", event.at.toLocaleTimeString()));
      item.appendChild(document.createTextNode(` ${event.text}`));
      return item;
    }),
  );
}

// Takes a view of everything and shows it; false if it failed (and says so).
async function refresh(generation) {
  try {
    const s = await snapshot();
    if (generation !== state.generation) return false; // signed out meanwhile
    if (state.previous) changes(state.previous, s);
    primaries(s, state.previous !== null);
    state.previous = s;
    if (s.stats && s.statsNode === state.chartNode) addSample(s.stats);
    renderCluster(s);
    renderCapacity(s);
    renderVolumes(s);
    renderHosts(s);
    renderChartNodes(s);
    renderCharts();
    renderEvents();
    renderActions(s);
    $("updated").textContent = `Updated ${new Date(s.at).toLocaleTimeString()}`;
    $("status").textContent = "";
    $("status").className = "";
    return true;
  } catch (error) {
    if (generation !== state.generation) return false;
    if (error.status === 401) {
      signOut("That token was refused: give a token of this node (DATA_DIR/api-token.read-only).");
      return false;
    }
    console.error("weft:", error);
    $("status").textContent =
      error.status === 403
        ? `This token may not read everything the page shows (${error.message})`
        : error.status
          ? `The node answered ${error.status}: ${error.message}; retrying`
          : `This node does not answer (${error.message}); retrying`;
    $("status").className = "critical";
    return false;
  }
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

// Waits until the node says something it serves changed, `ms` pass, or an
// action asks for a view now (wakeUp); never throws.
async function changed(ms) {
  const wake = new AbortController();
  state.wake = wake;
  if (state.pending) {
    state.pending = false; // an action asked for a view while one was taken
    return;
  }
  try {
    if (state.seen === null) {
      await sleep(ms, wake.signal);
      return;
    }
    const answer = await api(`changes?after=${state.seen}&wait_ms=${Math.round(ms)}`, {
      signal: wake.signal,
      waitMs: ms,
    });
    state.seen = Number.isSafeInteger(answer.generation) ? answer.generation : null;
  } catch (error) {
    if (error.status === 400) state.seen = null; // asked again before the next wait
    if (!wake.signal.aborted) await sleep(ms, wake.signal); // an older node, or none answering
  } finally {
    if (state.wake === wake) state.wake = null;
  }
}

// Asks for a new view now (after an action).
function wakeUp() {
  if (state.wake) state.wake.abort();
  else state.pending = true; // a view is being taken: the next wait returns at once
}

async function run(generation) {
  while (generation === state.generation) {
    const started = Date.now();
    // The generation first: a change while the view is taken wakes the next wait.
    if (state.seen === null) state.seen = await api("changes").then((a) => a.generation, () => null);
    const ok = await refresh(generation);
    if (generation !== state.generation) return;
    const gap = Math.max(0, MIN_GAP_MS - (Date.now() - started));
    if (gap) await sleep(gap, new AbortController().signal);
    if (generation !== state.generation) return;
    // Back off while the node does not answer.
    await changed(ok ? Math.max(0, POLL_MS - (Date.now() - started)) : POLL_MS * 5);
  }
}

// What GET session answered (null: not yet).
function learnSession(session) {
  state.roleUnknown = session === null;
  const known = session || { role: "read-only", cluster: false, node: null };
  state.role = known.role;
  state.cluster = known.cluster;
  state.node = known.node;
  document.body.classList.toggle("can-act", state.role === "admin");
  $("who").textContent = state.roleUnknown ? "" : state.role === "admin" ? "admin: can act" : `${state.role}: looks only`;
}

async function signIn(token) {
  state.generation += 1;
  const generation = state.generation;
  wakeUp();
  state.token = token;
  sessionStorage.setItem("weft-token", token);
  let session;
  try {
    session = await api("session");
  } catch (error) {
    if (generation !== state.generation) return;
    if (error.status === 401) {
      signOut("That token was refused: give a token of this node (DATA_DIR/api-token.read-only).");
      return;
    }
    session = null; // look meanwhile; asked again with the next view
    console.error("weft: asking who this token is", error);
  }
  if (generation !== state.generation) return;
  learnSession(session);
  $("sign-in").hidden = true;
  $("dashboard").hidden = false;
  $("sign-out").hidden = false;
  run(generation);
}

function signOut(message) {
  state.generation += 1;
  wakeUp();
  closeDialogs();
  document.body.classList.remove("can-act");
  state.role = null;
  $("who").textContent = "";
  sessionStorage.removeItem("weft-token");
  state.token = null;
  state.previous = null;
  state.seen = null;
  state.pending = false;
  state.primaries = new Map();
  state.chartNode = "";
  state.statsError = null;
  state.store = null;
  state.counters = null;
  state.points = { all: [], volumes: new Map() };
  $("sign-in").hidden = false;
  $("dashboard").hidden = true;
  $("sign-out").hidden = true;
  $("sign-in-error").textContent = message || "";
  $("status").textContent = "";
  $("updated").textContent = "Not signed in";
  $("token").focus();
}

document.addEventListener("DOMContentLoaded", () => {
  $("sign-in-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("token").value.trim());
    $("token").value = "";
  });
  $("sign-out").addEventListener("click", () => signOut());
  $("volume-filter").addEventListener("input", () => state.previous && renderVolumes(state.previous));
  setUpActions();
  $("chart-volume").addEventListener("change", () => state.previous && renderCharts());
  $("chart-node").addEventListener("change", () => chooseChartNode($("chart-node").value));
  if (state.token) signIn(state.token);
  else $("token").focus();
});
