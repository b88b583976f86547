// The Leasehold dashboard: reads the node's HTTP API (/health, /v1/cluster,
// /v1/locks, /v1/leases) and streams /v1/watch. Keys and holders are shown
// as text, never parsed as HTML. With auth on, every call carries the token
// entered once (kept for this browser tab only, in sessionStorage).
"use strict";

const PAGE = 100;
const REFRESH_MS = 2000;
const MAX_EVENTS = 200;

const state = {
  prefix: "",
  // The cursor of each page shown so far: "" for the first.
  cursors: [""],
  next: null,
  leaseCursors: [0],
  leaseNext: null,
  watch: null,
  timer: null,
  token: sessionStorage.getItem("leasehold-token") || "",
};

function headers(accept) {
  const h = { accept };
  if (state.token) h.authorization = "Bearer " + state.token;
  return h;
}

const $ = (id) => document.getElementById(id);

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text === undefined || text === null ? "" : String(text);
  if (cls) td.className = cls;
  return td;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) tr.appendChild(c);
  return tr;
}

function fill(table, rows, empty, columns) {
  const body = $(table).tBodies[0];
  body.replaceChildren(...rows);
  if (rows.length === 0) {
    const tr = row([cell(empty)]);
    tr.className = "empty";
    tr.firstChild.colSpan = columns;
    body.appendChild(tr);
  }
}

function seconds(ms) {
  return ms === undefined || ms === null ? "" : (ms / 1000).toFixed(1) + " s";
}

async function get(path) {
  const response = await fetch(path, { headers: headers("application/json") });
  let body = null;
  try {
    body = await response.json();
  } catch (_) {
    body = null;
  }
  if (!response.ok) {
    const error = (body && body.error) || { message: response.statusText };
    if (response.status === 401) {
      error.message = state.token
        ? "the node refused this token: " + error.message
        : "auth is on: enter an access token above";
    }
    throw Object.assign(new Error(error.message || "request failed"), { error });
  }
  return body;
}

function notice(text) {
  const n = $("notice");
  n.hidden = !text;
  n.textContent = text || "";
}

async function refreshNode() {
  try {
    const h = await get("/health");
    const node = $("node");
    node.replaceChildren();
    const parts = [
      ["node ", h.id],
      [" · ", h.role],
      [" · term ", h.term],
      [" · leader ", h.leader_id === null ? "none" : h.leader_id + (h.leader_addr ? " at " + h.leader_addr : "")],
    ];
    for (const [label, value] of parts) {
      node.appendChild(document.createTextNode(label));
      const b = document.createElement("b");
      b.textContent = String(value);
      node.appendChild(b);
    }
  } catch (e) {
    $("node").textContent = "not answering: " + e.message;
  }
  try {
    const c = await get("/v1/cluster");
    const rows = c.members.map((m) =>
      row([
        cell(m.id),
        cell(m.addr),
        cell(m.id === c.leader ? "leader" : m.voter ? "voter" : "learner"),
        cell(m.matched_index, "n"),
        cell(m.lag, "n"),
      ]),
    );
    fill("cluster", rows, "no members", 5);
  } catch (_) {
    // /health already says the node does not answer.
  }
}

// "2: a, b", the queue first in line first (at most three names).
function waiting(waiters) {
  if (waiters.length === 0) return "0";
  const names = waiters.slice(0, 3).map((w) => w.holder || "lease " + w.lease);
  return waiters.length + ": " + names.join(", ") + (waiters.length > 3 ? ", …" : "");
}

// After the first holder's name: how many more hold, and how: " +2 readers",
// " +1 (2/5 permits)".
function holding(l) {
  const more = (l.holders || []).length - 1;
  if (l.permits) return " (" + l.holders.length + "/" + l.permits + " permits)";
  if (more > 0) return " +" + more + (l.holder.mode === "shared" ? " readers" : "");
  return l.holder && l.holder.mode === "shared" ? " (reader)" : "";
}

async function refreshLocks() {
  const after = state.cursors[state.cursors.length - 1];
  const query = new URLSearchParams({ prefix: state.prefix, limit: String(PAGE), start_after: after });
  try {
    const page = await get("/v1/locks?" + query);
    notice("");
    state.next = page.next_start_after || null;
    const rows = page.locks.map((l) => {
      const h = l.holder;
      return row([
        cell(l.key, "key"),
        cell(h ? h.holder + holding(l) : "(free)"),
        cell(h ? h.fence : "", "n"),
        cell(h ? seconds(h.ttl_left_ms) : "", "n"),
        cell(waiting(l.waiters), "n"),
        cell(h ? h.lease : ""),
      ]);
    });
    fill("locks", rows, state.prefix ? "no lock under " + state.prefix : "no lock held", 6);
    $("lock-count").textContent =
      page.locks.length + (state.next ? "+ on this page" : " on this page");
    $("page").textContent = "page " + state.cursors.length;
  } catch (e) {
    const leader = e.error && e.error.leader;
    notice(leader ? "This node follows; the leader is " + leader + " (its /ui shows the locks)." : e.message);
    state.next = null;
  }
  $("next").disabled = !state.next;
  $("first").disabled = state.cursors.length === 1;
}

async function refreshLeases() {
  const after = state.leaseCursors[state.leaseCursors.length - 1];
  const query = new URLSearchParams({ limit: String(PAGE), start_after: String(after) });
  try {
    const page = await get("/v1/leases?" + query);
    state.leaseNext = page.next_start_after || null;
    const rows = page.leases.map((l) =>
      row([
        cell(l.lease, "n"),
        cell(l.holder),
        cell(seconds(l.ttl_ms), "n"),
        cell(seconds(l.ttl_left_ms), "n"),
        cell(l.keys.slice(0, 5).join(", ") + (l.key_count > 5 ? " … (" + l.key_count + " keys)" : ""), "key"),
      ]),
    );
    fill("leases", rows, "no lease", 5);
  } catch (_) {
    state.leaseNext = null;
  }
  $("leases-next").disabled = !state.leaseNext;
  $("leases-first").disabled = state.leaseCursors.length === 1;
}

function addEvent(kind, data) {
  let e;
  try {
    e = JSON.parse(data);
  } catch (_) {
    return;
  }
  const tr = row([
    cell(new Date().toLocaleTimeString()),
    cell(kind, kind),
    cell(e.key, "key"),
    cell(e.holder),
    cell(e.fence, "n"),
    cell(e.lease, "n"),
  ]);
  const body = $("events").tBodies[0];
  const empty = body.querySelector(".empty");
  if (empty) empty.remove();
  body.insertBefore(tr, body.firstChild);
  while (body.rows.length > MAX_EVENTS) body.deleteRow(body.rows.length - 1);
  // The lock table follows the events at once, not on the next tick.
  schedule(50);
}

// Server-sent events over fetch (EventSource cannot send a token), parsed
// here; reconnects a second after the stream ends.
function watch() {
  if (state.watch) state.watch.abort();
  const stop = new AbortController();
  state.watch = stop;
  const url = "/v1/watch?" + new URLSearchParams({ prefix: state.prefix });
  const again = () => {
    if (stop.signal.aborted) return;
    $("stream").textContent = "reconnecting…";
    setTimeout(() => state.watch === stop && watch(), 1000);
  };
  fetch(url, { headers: headers("text/event-stream"), signal: stop.signal })
    .then(async (response) => {
      if (!response.ok || !response.body) return again();
      $("stream").textContent = "live";
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const message = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let kind = "message";
          const data = [];
          for (const line of message.split("\n")) {
            if (line.startsWith("event:")) kind = line.slice(6).trim();
            else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
          }
          if (["acquired", "released", "expired"].includes(kind)) addEvent(kind, data.join("\n"));
        }
      }
      again();
    })
    .catch(again);
}

let pending = false;
function schedule(ms) {
  if (pending) return;
  pending = true;
  setTimeout(async () => {
    pending = false;
    await Promise.all([refreshLocks(), refreshLeases()]);
  }, ms);
}

function start() {
  $("token").value = state.token;
  $("auth").addEventListener("submit", (e) => {
    e.preventDefault();
    state.token = $("token").value.trim();
    if (state.token) sessionStorage.setItem("leasehold-token", state.token);
    else sessionStorage.removeItem("leasehold-token");
    notice("");
    watch();
    refreshNode();
    schedule(0);
  });
  $("search").addEventListener("submit", (e) => {
    e.preventDefault();
    state.prefix = $("prefix").value;
    state.cursors = [""];
    fill("events", [], "waiting for events", 6);
    watch();
    refreshLocks();
  });
  $("next").addEventListener("click", () => {
    if (!state.next) return;
    state.cursors.push(state.next);
    refreshLocks();
  });
  $("first").addEventListener("click", () => {
    state.cursors = [""];
    refreshLocks();
  });
  $("leases-next").addEventListener("click", () => {
    if (!state.leaseNext) return;
    state.leaseCursors.push(state.leaseNext);
    refreshLeases();
  });
  $("leases-first").addEventListener("click", () => {
    state.leaseCursors = [0];
    refreshLeases();
  });
  fill("events", [], "waiting for events", 6);
  watch();
  refreshNode();
  refreshLocks();
  refreshLeases();
  state.timer = setInterval(() => {
    refreshNode();
    schedule(0);
  }, REFRESH_MS);
}

start();
