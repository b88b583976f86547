// The Leasehold dashboard: reads the node's HTTP API (/health, /v1/cluster,
// /v1/locks, /v1/leases), fills the events pane with the node's recent
// history (/v1/events) and then follows /v1/watch. Keys and holders are
// shown as text, never parsed as HTML. With auth on, every call carries the
// token entered once (kept for this browser tab only, in sessionStorage).
//
// A follower serves no lock or lease list: the page says so and links to
// the leader's own dashboard (a link, not a fetch: the page's CSP allows
// calls to this origin only). Its events pane still works, since followers
// apply the same events.
"use strict";

const PAGE = 100;
const REFRESH_MS = 2000;
// The node keeps its last 200 lock events; the pane shows as many.
const MAX_EVENTS = 200;
// A member further behind than one append's worth of entries (the server's
// CAUGHT_UP_LAG) is lagging.
const LAGGING = 64;
const KINDS = ["acquired", "released", "expired", "checkpoint"];

const state = {
  prefix: "",
  // Only keys with a holder or a waiter, unless "show free keys" is ticked.
  showFree: false,
  // The cursor of each page shown so far: "" for the first.
  cursors: [""],
  next: null,
  leaseCursors: [0],
  leaseNext: null,
  watch: null,
  timer: null,
  token: sessionStorage.getItem("leasehold-token") || "",
  // Where the leader is, as /health last said (`http://host:port`).
  leaderUrl: null,
  // The events shown (see `eventId`), so history and stream never show
  // one twice.
  shown: new Set(),
  // Bumped whenever the events pane starts afresh: answers for an earlier
  // prefix or token are dropped.
  epoch: 0,
  // Where the stream resumes: the last event it showed.
  after: null,
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

// One row across the table, for "nothing here" and its like.
function only(table, columns, ...content) {
  const td = document.createElement("td");
  td.colSpan = columns;
  td.append(...content);
  const tr = row([td]);
  tr.className = "empty";
  $(table).tBodies[0].replaceChildren(tr);
}

function fill(table, rows, empty, columns) {
  if (rows.length === 0) return only(table, columns, empty);
  $(table).tBodies[0].replaceChildren(...rows);
}

const pad = (n) => String(n).padStart(2, "0");

// A duration as people write it, rounded down: 850ms, 4.2s, 42s, 9m58s,
// 1h02m, 2d03h.
function duration(ms) {
  if (typeof ms !== "number" || !(ms >= 0)) return "";
  if (ms < 1000) return Math.floor(ms) + "ms";
  if (ms < 10_000) return (Math.floor(ms / 100) / 10).toFixed(1) + "s";
  const s = Math.floor(ms / 1000);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + pad(s % 60) + "s";
  if (s < 86_400) return Math.floor(s / 3600) + "h" + pad(Math.floor(s / 60) % 60) + "m";
  return Math.floor(s / 86_400) + "d" + pad(Math.floor(s / 3600) % 24) + "h";
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

// A link to the dashboard of the leader at `leaderUrl`, or null for
// anything but an http(s) URL.
function dashboardLink(leaderUrl) {
  let url;
  try {
    url = new URL("/ui", leaderUrl);
  } catch (_) {
    return null;
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return null;
  const a = document.createElement("a");
  a.href = url.href;
  a.textContent = url.href;
  return a;
}

// What a follower's lock and lease tables say instead of rows.
function servedByLeader(table, columns, leaderUrl) {
  const link = leaderUrl && dashboardLink(leaderUrl);
  if (link) only(table, columns, "served by the leader: ", link);
  else only(table, columns, "served by the leader; no leader is known now");
}

function showRole(h) {
  const box = $("follower");
  // A leader whose clock is not armed yet still says role "leader".
  const follows = h.leader === false && h.role !== "leader";
  const said = follows ? h.role + " " + (h.leader_url || "") : "";
  // Unchanged: keep the link as it is (under the pointer, say).
  if (box.dataset.said === said) return;
  box.dataset.said = said;
  if (!follows) {
    box.hidden = true;
    box.replaceChildren();
    return;
  }
  const link = h.leader_url && dashboardLink(h.leader_url);
  if (link) {
    box.replaceChildren("This node is a " + h.role + ": the leader's dashboard is at ", link, ".");
  } else {
    box.replaceChildren(
      "This node is a " + h.role + " and knows no leader now: locks and leases are served by the leader only.",
    );
  }
  box.hidden = false;
}

function reachable(value) {
  if (value === true) return "yes";
  if (value === false) return "no";
  return "";
}

async function refreshNode() {
  try {
    const h = await get("/health");
    state.leaderUrl = h.leader_url || null;
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
    showRole(h);
  } catch (e) {
    $("node").textContent = "not answering: " + e.message;
  }
  try {
    const c = await get("/v1/cluster");
    const rows = c.members.map((m) => {
      const tr = row([
        cell(m.id),
        cell(m.addr),
        cell(m.id === c.leader ? "leader" : m.voter ? "voter" : "learner"),
        cell(m.matched_index, "n"),
        cell(m.lag, "n"),
        cell(reachable(m.reachable)),
        cell(duration(m.last_heard_ms), "n"),
      ]);
      if (m.reachable === false) tr.className = "unreachable";
      else if (typeof m.lag === "number" && m.lag > LAGGING) tr.className = "lagging";
      return tr;
    });
    fill("cluster", rows, "no members", 7);
    $("quorum").hidden = c.quorum !== false;
  } catch (_) {
    // /health already says the node does not answer.
  }
}

const who = (h) => h.holder || "lease " + h.lease;

// "2: a, b", the queue first in line first (at most three names).
function waiting(waiters) {
  if (waiters.length === 0) return "0";
  const names = waiters.slice(0, 3).map(who);
  return waiters.length + ": " + names.join(", ") + (waiters.length > 3 ? ", …" : "");
}

// The Holder cell: one name for a lock or a writer; for a semaphore or
// several readers, how many hold and then every holder on its own line.
function holderCell(l, holders) {
  const td = document.createElement("td");
  if (holders.length === 0) {
    const notes = ["(free)"];
    if (l.has_checkpoint) notes.push("checkpoint saved");
    if (l.delay_left_ms > 0) notes.push("lock-delay " + duration(l.delay_left_ms));
    td.textContent = notes.join(" · ");
    td.className = "free";
    return td;
  }
  if (holders.length === 1 && !l.permits) {
    td.textContent = who(holders[0]) + (holders[0].mode === "shared" ? " (reader)" : "");
    return td;
  }
  const lines = [l.permits ? holders.length + "/" + l.permits + " permits" : holders.length + " readers"];
  for (const h of holders) lines.push(who(h) + " (fence " + h.fence + ")");
  td.append(
    ...lines.map((text) => {
      const div = document.createElement("div");
      div.textContent = text;
      return div;
    }),
  );
  td.className = "holders";
  return td;
}

function lockRow(l) {
  const holders = l.holders && l.holders.length ? l.holders : l.holder ? [l.holder] : [];
  const sole = holders.length === 1 && !l.permits ? holders[0] : null;
  // The soonest expiry among the holders.
  const left = holders.length ? Math.min(...holders.map((h) => h.ttl_left_ms)) : null;
  return row([
    cell(l.key, "key"),
    holderCell(l, holders),
    cell(sole ? sole.fence : "", "n"),
    cell(duration(left), "n"),
    cell(waiting(l.waiters || []), "n"),
    cell(sole ? sole.lease : ""),
  ]);
}

async function refreshLocks() {
  const after = state.cursors[state.cursors.length - 1];
  const query = new URLSearchParams({ prefix: state.prefix, limit: String(PAGE), start_after: after });
  if (!state.showFree) query.set("held", "true");
  try {
    const page = await get("/v1/locks?" + query);
    notice("");
    state.next = page.next_start_after || null;
    const what = state.showFree ? "no key" : "no lock held";
    fill("locks", page.locks.map(lockRow), state.prefix ? what + " under " + state.prefix : what, 6);
    $("lock-count").textContent =
      page.locks.length + (state.next ? "+ on this page" : " on this page");
    $("page").textContent = "page " + state.cursors.length;
  } catch (e) {
    state.next = null;
    if (e.error && e.error.code === "not_leader") {
      notice("");
      servedByLeader("locks", 6, e.error.leader_url || state.leaderUrl);
      $("lock-count").textContent = "";
      $("page").textContent = "";
    } else {
      notice(e.message);
    }
  }
  $("next").disabled = !state.next;
  $("first").disabled = state.cursors.length === 1;
}

// The first key a lease waits for, and how many more.
function waitingFor(l) {
  const keys = l.waiting_for || [];
  if (keys.length === 0) return "";
  const count = Math.max(l.waiting_count || 0, keys.length);
  return keys[0] + (count > 1 ? " +" + (count - 1) + " more" : "");
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
        cell(duration(l.ttl_ms), "n"),
        cell(duration(l.ttl_left_ms), "n"),
        cell(l.keys.slice(0, 5).join(", ") + (l.key_count > 5 ? " … (" + l.key_count + " keys)" : ""), "key"),
        cell(waitingFor(l), "key"),
      ]),
    );
    fill("leases", rows, "no lease", 6);
  } catch (e) {
    state.leaseNext = null;
    if (e.error && e.error.code === "not_leader") {
      servedByLeader("leases", 6, e.error.leader_url || state.leaderUrl);
    } else {
      only("leases", 6, "could not list leases: " + e.message);
    }
  }
  $("leases-next").disabled = !state.leaseNext;
  $("leases-first").disabled = state.leaseCursors.length === 1;
}

// What tells one event from another, in the history and in the stream.
function eventId(e) {
  // Its place in the log, the same on every node; older nodes send none.
  if (e.index) return e.index + "." + e.seq;
  return [e.kind, e.key, e.fence, e.lease, e.at_unix_ms, e.data_base64 || ""].join("|");
}

// Shows an event unless it is shown already, newest at the top, with the
// server's time of it. `live`: it came from the stream, so the tables are
// stale.
function addEvent(e, live) {
  if (!e || !KINDS.includes(e.kind)) return;
  const id = eventId(e);
  if (state.shown.has(id)) return;
  state.shown.add(id);
  const at = typeof e.at_unix_ms === "number" ? e.at_unix_ms : Date.now();
  const time = cell(new Date(at).toLocaleTimeString(), "time");
  time.title = new Date(at).toLocaleString();
  const tr = row([
    time,
    cell(e.kind, e.kind),
    cell(e.key, "key"),
    cell(e.holder),
    cell(e.fence, "n"),
    cell(e.lease, "n"),
  ]);
  tr.dataset.id = id;
  tr.dataset.at = String(at);
  const body = $("events").tBodies[0];
  const empty = body.querySelector(".empty");
  if (empty) empty.remove();
  // Before the first row that is not newer: a later event of the same
  // millisecond goes above an earlier one, as they arrive oldest first.
  let before = null;
  for (const r of body.rows) {
    if (Number(r.dataset.at) <= at) {
      before = r;
      break;
    }
  }
  body.insertBefore(tr, before);
  while (body.rows.length > MAX_EVENTS) {
    const last = body.rows[body.rows.length - 1];
    state.shown.delete(last.dataset.id);
    last.remove();
  }
  // The lock table follows the events at once, not on the next tick.
  if (live) schedule(50);
}

// The node's recent events under `prefix`, merged into the pane. Called
// once the stream is live, so nothing falls between the two.
async function loadHistory(epoch, prefix) {
  let answer;
  try {
    answer = await get("/v1/events?" + new URLSearchParams({ prefix }));
  } catch (_) {
    // The stream still shows what happens from now on.
    return;
  }
  if (epoch !== state.epoch) return;
  for (const e of answer.events || []) addEvent(e, false);
  if ($("events").tBodies[0].querySelector(".empty")) {
    only("events", 6, prefix ? "no event under " + prefix + " yet" : "no event yet");
  }
}

// The message of a stream's `error` event: `{"error": {"message"}}`, or
// plain text.
function streamError(data) {
  try {
    const body = JSON.parse(data);
    const message = body && ((body.error && body.error.message) || body.message);
    if (message) return String(message);
  } catch (_) {
    // Not JSON: the text is the message.
  }
  return data || "the stream ended";
}

// Server-sent events over fetch (EventSource cannot send a token), parsed
// here. A second after the stream ends it reconnects after the last event
// it showed (`after_index`, `after_seq`), so nothing is missed; a node that
// no longer has those events (410 `watch_behind`) is asked for its history
// again. Without a token where one is needed it says so and waits for one.
function watch() {
  if (state.watch) state.watch.abort();
  const stop = new AbortController();
  state.watch = stop;
  const epoch = state.epoch;
  const prefix = state.prefix;
  let stopped = null;
  const again = () => {
    if (stop.signal.aborted) return;
    $("stream").textContent = stopped ? "stopped: " + stopped + " · reconnecting…" : "reconnecting…";
    setTimeout(() => state.watch === stop && watch(), 1000);
  };
  const query = { prefix };
  if (state.after) Object.assign(query, state.after);
  fetch("/v1/watch?" + new URLSearchParams(query), {
    headers: headers("text/event-stream"),
    signal: stop.signal,
  })
    .then(async (response) => {
      if (response.status === 401) {
        $("stream").textContent = state.token
          ? "stopped: the node refused this token; enter another above"
          : "stopped: auth is on; enter an access token above";
        return;
      }
      if (response.status === 410) {
        // Events were lost: start from now, and merge the history again.
        state.after = null;
      }
      if (!response.ok || !response.body) return again();
      $("stream").textContent = "live";
      loadHistory(epoch, prefix);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done || stop.signal.aborted) break;
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
          if (kind === "error") {
            stopped = streamError(data.join("\n"));
            $("stream").textContent = "stopped: " + stopped;
          } else if (KINDS.includes(kind)) {
            let e;
            try {
              e = JSON.parse(data.join("\n"));
            } catch (_) {
              continue;
            }
            addEvent(Object.assign({ kind }, e), true);
            if (e.index) state.after = { after_index: e.index, after_seq: e.seq };
          }
        }
      }
      again();
    })
    .catch(again);
}

// Empties the events pane and fills it again: history, then the stream.
function restartEvents() {
  state.epoch += 1;
  state.shown = new Set();
  state.after = null;
  only("events", 6, "waiting for events");
  watch();
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
  $("show-free").checked = state.showFree;
  $("auth").addEventListener("submit", (e) => {
    e.preventDefault();
    state.token = $("token").value.trim();
    if (state.token) sessionStorage.setItem("leasehold-token", state.token);
    else sessionStorage.removeItem("leasehold-token");
    notice("");
    restartEvents();
    refreshNode();
    schedule(0);
  });
  $("search").addEventListener("submit", (e) => {
    e.preventDefault();
    state.prefix = $("prefix").value;
    state.cursors = [""];
    restartEvents();
    refreshLocks();
  });
  $("show-free").addEventListener("change", () => {
    state.showFree = $("show-free").checked;
    // A cursor of one listing means nothing in the other.
    state.cursors = [""];
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
  restartEvents();
  refreshNode();
  refreshLocks();
  refreshLeases();
  state.timer = setInterval(() => {
    refreshNode();
    schedule(0);
  }, REFRESH_MS);
}

start();
