/**
 * Lock events as an async iterator, resumed across the loss of the node
 * streaming them: a broken stream goes on at another endpoint after the
 * last event delivered (its `index` and `seq`), losing and repeating
 * nothing; a node that no longer has those events ends the watch with a
 * {@link WatchBehindError} (list again, then watch again).
 */

import type { IncomingMessage } from "node:http";

import { fromBody, LeaseholdError, WatchBehindError, errorOf } from "./errors.js";
import { Transport, sleep } from "./transport.js";
import type { WatchEvent } from "./wire.js";

/** A lock event. `index` and `seq` place it in the deployment's history, the same on every node. */
export interface LockEvent {
  kind: "acquired" | "released" | "expired" | "checkpoint";
  key: string;
  fence: number;
  lease: number;
  holder: string;
  index: number;
  seq: number;
  atUnixMs: number;
  /** With "checkpoint": the bytes saved. */
  data?: Buffer;
}

/** Where a watch resumes: just after the event at `index`, `seq`. */
export interface Position {
  index: number;
  seq: number;
}

export interface WatchOptions {
  /** Every event after this one, then on. */
  after?: Position;
  /** Aborting it ends the watch (the iterator returns). */
  signal?: AbortSignal;
}

/** How long a broken watch looks for a node to go on at. */
const RESUME_FOR_MS = 30000;

/** Streams events; `opened` is told each time a stream opens, before its first event. */
export async function* watch(
  t: Transport,
  prefix: string,
  o: WatchOptions = {},
  opened?: () => Promise<void>,
): AsyncGenerator<LockEvent, void, undefined> {
  let after = o.after;
  let brokenSince: number | undefined;
  let pause = 50;
  for (;;) {
    if (o.signal?.aborted) return;
    const base = t.base();
    let why: LeaseholdError;
    try {
      const query = new URLSearchParams({ prefix });
      if (after) {
        query.set("after_index", String(after.index));
        query.set("after_seq", String(after.seq));
      }
      const res = await response(t, base, `/v1/watch?${query}`, o.signal);
      brokenSince = undefined;
      pause = 50;
      if (opened) await opened();
      for await (const event of events(res)) {
        if (event.index > 0) after = { index: event.index, seq: event.seq };
        yield event;
      }
      why = errorOf("unavailable", `${base}: the node closed the stream`);
    } catch (e) {
      if (o.signal?.aborted) return;
      why = e as LeaseholdError;
      const resumable = why instanceof LeaseholdError && ["unavailable", "not_leader", "outcome_unknown"].includes(why.code) && why.details.final !== true;
      if (!resumable) throw why;
    }
    t.next(base);
    brokenSince ??= Date.now();
    if (Date.now() - brokenSince > RESUME_FOR_MS)
      throw errorOf("unavailable", `watch on ${JSON.stringify(prefix)}: no node took it for ${RESUME_FOR_MS / 1000} s: ${why.message}`);
    try {
      await sleep(pause, o.signal);
    } catch {
      return;
    }
    pause = Math.min(pause * 2, 1000);
  }
}

/** The open stream at base+path, or the error its node answered. */
function response(t: Transport, base: string, path: string, signal?: AbortSignal): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    let sent = false;
    const req = t.open(base, "GET", path, { accept: "text/event-stream" }, undefined, signal);
    req.on("finish", () => (sent = true));
    req.on("error", (e) => reject(signal?.aborted ? signal.reason : t.transportError(base + path, e, sent)));
    req.on("response", (res) => {
      if (res.statusCode === 200) return resolve(res);
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("error", (e) => reject(errorOf("unavailable", `${base}${path}: ${e.message}`)));
      res.on("end", () => {
        try {
          reject(fromBody(res.statusCode ?? 0, JSON.parse(Buffer.concat(chunks).toString("utf8"))));
        } catch {
          reject(errorOf("unavailable", `${base}${path}: HTTP ${res.statusCode}`));
        }
      });
    });
  });
}

/** The events of one stream, until it ends or breaks (an error event throws its error). */
async function* events(res: IncomingMessage): AsyncGenerator<LockEvent, void, undefined> {
  let buffered = "";
  let kind: string | undefined;
  let data: string[] = [];
  try {
    for await (const chunk of res) {
      buffered += (chunk as Buffer).toString("utf8");
      let end: number;
      while ((end = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, end).replace(/\r$/, "");
        buffered = buffered.slice(end + 1);
        if (line.startsWith("event:")) kind = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        else if (line === "" && kind !== undefined) {
          const payload = data.join("\n");
          const k = kind;
          kind = undefined;
          data = [];
          const body = JSON.parse(payload) as WatchEvent;
          if (k === "error") throw fromBody(0, body);
          yield {
            kind: k as LockEvent["kind"],
            key: String(body.key),
            fence: Number(body.fence),
            lease: Number(body.lease),
            holder: String(body.holder ?? ""),
            index: Number(body.index ?? 0),
            seq: Number(body.seq ?? 0),
            atUnixMs: Number(body.at_unix_ms ?? 0),
            data: typeof body.data_base64 === "string" ? Buffer.from(body.data_base64, "base64") : undefined,
          };
        }
      }
    }
  } catch (e) {
    if (e instanceof LeaseholdError) throw e;
    throw errorOf("unavailable", `the stream broke: ${(e as Error).message}`);
  } finally {
    res.destroy();
  }
}

export { WatchBehindError };
