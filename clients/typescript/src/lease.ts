/**
 * A held lock and the lease under it: renewed every TTL/3, lost at
 * `sent + ttl - margin` without a renewal, and said so at once through
 * `signal` (aborted with a {@link LeaseLostError}). Nothing here ever
 * rejects a promise nobody awaits: a loss is a signal, never an unhandled
 * rejection, and nothing is taken again behind the caller's back.
 */

import {
  LeaseExpiredError,
  LeaseholdError,
  LeaseLostError,
  LeaseNotFoundError,
  PermissionDeniedError,
  StaleFenceError,
  UnauthenticatedError,
  errorOf,
} from "./errors.js";
import { Transport, requestId, sleep } from "./transport.js";
import type { Acquired, Granted, Lock, Renewed } from "./wire.js";

/** How to take a lock. */
export interface AcquireOptions {
  /** The lease's time to live, ms (10 ms to 24 h; default 15000). */
  ttlMs?: number;
  /** How long to wait in the key's FIFO queue, ms (0: answer at once; at most 1 h; default 30000 for acquire). */
  waitMs?: number;
  /** After this hold expires (not a release), nobody gets the key for this long, ms (at most 60000). */
  lockDelayMs?: number;
  /** "exclusive" (default) or "shared" (one of many readers). */
  mode?: "exclusive" | "shared";
  /** One of this many permits of a counting semaphore. */
  permits?: number;
  /** A lock set: every one of these keys, or none, with one token. */
  keys?: string[];
  /** Aborting it while the acquire waits withdraws the wait from the queue. */
  signal?: AbortSignal;
}

/** A tenth of the TTL, at least 20 ms, at most 2 s (docs/api.md). */
export function margin(ttlMs: number): number {
  return Math.min(Math.max(ttlMs / 10, 20), 2000);
}

export class Lease {
  /** The key held (the first, sorted, of a lock set). */
  readonly key: string;
  /** A lock set's keys, if it is one. */
  readonly keys?: string[];
  /** The lease's id on the server. */
  readonly id: number;
  /** The fencing token. Write with {@link token}, which checks the lease first. */
  fence = 0;
  /** What the previous holder saved with the key, if anything. */
  checkpoint?: Buffer;
  /** Aborted (with a {@link LeaseLostError}) the moment the lease is lost or released. */
  readonly signal: AbortSignal;
  readonly ttlMs: number;

  private readonly t: Transport;
  private readonly controller = new AbortController();
  private deadlineAt: number;
  private lostError?: LeaseholdError;
  private released = false;
  private stopRenewing = new AbortController();
  /**
   * How many keys the lease was granted (one, or a lock set's; 0 while its
   * acquire waits): a renewal that counts fewer learns that one was
   * released by its token elsewhere.
   */
  private grantedKeys = 0;
  private renewing: Promise<void>;

  /** @internal */
  constructor(t: Transport, key: string, keys: string[] | undefined, id: number, ttlMs: number, sentAt: number) {
    this.t = t;
    this.key = key;
    this.keys = keys;
    this.id = id;
    this.ttlMs = ttlMs;
    this.signal = this.controller.signal;
    this.deadlineAt = sentAt + ttlMs - margin(ttlMs);
    this.renewing = this.renew().catch(() => undefined);
  }

  /** When the lease is lost unless renewed before (ms since the epoch, on this machine's clock). */
  get deadline(): number {
    return this.deadlineAt;
  }

  /** Why the lease ended, once it has; undefined while it is held. */
  get lostReason(): LeaseholdError | undefined {
    this.checkDeadline();
    return this.lostError;
  }

  /** The fencing token while the lease is held; throws a {@link LeaseLostError} once it is lost. */
  token(): number {
    this.checkDeadline();
    if (this.lostError) throw this.lostError;
    return this.fence;
  }

  private checkDeadline(): void {
    if (!this.lostError && Date.now() >= this.deadlineAt) this.lose("the client-side deadline passed without a renewal");
  }

  /** @internal The acquire's answer: the token, and the keys now held. */
  granted(a: Acquired): void {
    this.fence = a.fence;
    this.checkpoint = a.checkpoint_base64 !== undefined ? Buffer.from(a.checkpoint_base64, "base64") : undefined;
    this.grantedKeys = this.keys ? this.keys.length : 1;
  }

  /** @internal */
  lose(reason: string, code = "lease_lost"): void {
    if (this.lostError) return;
    this.lostError = errorOf(code, `lease on ${JSON.stringify(this.key)} lost: ${reason}`, { key: this.key }) as LeaseholdError;
    this.stopRenewing.abort();
    this.controller.abort(this.lostError);
  }

  private async renew(): Promise<void> {
    const every = this.ttlMs / 3;
    let next = Date.now() + every;
    const stop = this.stopRenewing.signal;
    while (!stop.aborted) {
      const untilDeadline = this.deadlineAt - Date.now();
      const wait = Math.min(next - Date.now(), untilDeadline);
      try {
        await sleep(Math.max(0, wait), stop);
      } catch {
        return;
      }
      if (Date.now() >= this.deadlineAt) {
        this.lose("the client-side deadline passed without a renewal");
        return;
      }
      if (Date.now() < next) continue;
      let sentAt = Date.now();
      // A node that took the call and does not answer (cut off from its
      // majority, say) is given up after a sixth of the TTL (at least
      // 200 ms) when there are other nodes to try; with one node there is
      // nowhere else, and a slow answer is still a renewal.
      const attempt = this.t.several() ? Math.max(this.ttlMs / 6, 200) : Infinity;
      const timeout = Math.max(1, Math.min(attempt, this.deadlineAt - sentAt));
      let renewed: Renewed;
      try {
        renewed = await this.t.call({ method: "POST", path: `/v1/leases/${this.id}/keepalive`, body: {}, timeoutMs: timeout, retryForMs: 0, signal: stop });
      } catch (e) {
        if (stop.aborted) return;
        if (e instanceof LeaseExpiredError || e instanceof LeaseNotFoundError || e instanceof PermissionDeniedError || e instanceof UnauthenticatedError) {
          this.lose(`renewal refused: ${(e as Error).message}`);
          return;
        }
        // Not answered: again soon, until the deadline.
        next = Date.now() + Math.min(100, every);
        continue;
      }
      if (this.released) return;
      // An older server sends no count: nothing to go by.
      if (typeof renewed?.key_count === "number" && renewed.key_count < this.grantedKeys) {
        this.lose("the lock was released by its token elsewhere while the lease lived");
        return;
      }
      if (this.t.plant === "deadline-from-reply") sentAt = Date.now(); // planted: counts from the answer
      this.deadlineAt = Math.max(this.deadlineAt, sentAt + this.ttlMs - margin(this.ttlMs));
      next = sentAt + every;
    }
  }

  /**
   * Saves bytes with the lock for the next holder, fenced by this lease's
   * token (at most 64 KiB; empty clears it).
   */
  async saveCheckpoint(data: string | Uint8Array): Promise<void> {
    const fence = this.token();
    const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : Buffer.from(data);
    await this.t.call({
      method: "POST",
      path: "/v1/checkpoint",
      body: { key: this.key, fence, data_base64: bytes.toString("base64") },
      unknownAgain: true,
    });
  }

  /**
   * Releases the hold by its key and token (never anyone else's, even
   * after this lease was lost and the key granted again), then ends the
   * lease. Again does nothing. Throws a {@link LeaseLostError} if the
   * lease was lost before.
   */
  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    const lostBefore = this.lostReason !== undefined;
    this.stopRenewing.abort();
    await this.renewing;
    let wasLost = lostBefore;
    let unanswered: unknown;
    let fence = this.fence;
    if (this.t.plant === "release-by-name") {
      // Planted for the conformance suite: whoever holds the key now.
      try {
        const lock = await this.t.call<Lock>({ method: "GET", path: "/v1/locks/" + encodeKey(this.key) });
        if (lock.holder) fence = lock.holder.fence;
      } catch {
        // As it was.
      }
    }
    try {
      await this.t.call({ method: "POST", path: "/v1/release", body: { key: this.key, fence, request_id: requestId() }, unknownAgain: true, timeoutMs: 5000 });
    } catch (e) {
      if (e instanceof StaleFenceError || e instanceof LeaseExpiredError || e instanceof LeaseNotFoundError) wasLost = true;
      else unanswered = e;
    }
    try {
      await this.t.call({ method: "DELETE", path: `/v1/leases/${this.id}`, unknownAgain: true, timeoutMs: 5000 });
    } catch (e) {
      if (!(e instanceof LeaseExpiredError || e instanceof LeaseNotFoundError) && unanswered === undefined) unanswered = e;
    }
    if (!this.lostError) {
      this.lostError = new LeaseLostError("lease_lost", `lease on ${JSON.stringify(this.key)} was released`, { key: this.key });
      this.controller.abort(this.lostError);
    }
    if (unanswered !== undefined) throw unanswered;
    if (wasLost) throw new LeaseLostError("lease_lost", `lease on ${JSON.stringify(this.key)} was lost before its release`, { key: this.key });
  }

  /** @internal Ends the lease without waiting for an answer (a wait given up). */
  abandon(): void {
    this.released = true;
    this.stopRenewing.abort();
    if (!this.lostError) {
      this.lostError = new LeaseLostError("lease_lost", `the wait for ${JSON.stringify(this.key)} was given up`, { key: this.key });
      this.controller.abort(this.lostError);
    }
    // In the background, bounded, its errors ignored: never blocks or
    // fails the caller (node-redlock's abort waited on release retries).
    this.t
      .call({ method: "DELETE", path: `/v1/leases/${this.id}`, timeoutMs: 2000, retryForMs: 1000 })
      .catch(() => undefined);
  }
}

export function encodeKey(key: string): string {
  return key.split("/").map(encodeURIComponent).join("/");
}


/** Takes a key: at once (`waitMs` 0) or waiting in its queue. */
export async function acquire(t: Transport, key: string, o: AcquireOptions): Promise<Lease> {
  const ttlMs = o.ttlMs ?? 15000;
  const keys = o.keys ? [...new Set(o.keys)].sort() : undefined;
  if (keys && keys.length === 0) throw errorOf("invalid_argument", "a lock set needs at least one key");
  const target = keys ? keys[0] : key;
  const body: Record<string, unknown> = { request_id: requestId() };
  if (keys) body.keys = keys;
  else body.key = key;
  if (o.lockDelayMs) body.lock_delay_ms = o.lockDelayMs;
  if (o.permits && o.mode === "shared") throw errorOf("invalid_argument", "a hold is shared or one of a semaphore's permits, not both");
  if (o.permits) {
    body.mode = "permit";
    body.permits = o.permits;
  } else if (o.mode === "shared") body.mode = "shared";
  if (o.signal?.aborted) throw o.signal.reason;
  const waitMs = o.waitMs ?? 0;
  if (waitMs <= 0) {
    // One command: the lease and the lock, or neither.
    const sentAt = Date.now();
    const a = await t.call<Acquired>({ method: "POST", path: "/v1/acquire", body: { ...body, ttl_ms: ttlMs, holder: t.holder }, unknownAgain: true, signal: o.signal });
    return held(t, target, keys, a, ttlMs, sentAt);
  }
  // A wait may outlast the TTL: the lease is granted first, and renewed while it waits.
  const sentAt = Date.now();
  const granted = await t.call<Granted>({
    method: "POST",
    path: "/v1/leases",
    body: { ttl_ms: ttlMs, holder: t.holder, request_id: requestId() },
    unknownAgain: true,
    signal: o.signal,
  });
  const lease = new Lease(t, target, keys, granted.lease, ttlMs, sentAt);
  const until = Date.now() + waitMs;
  try {
    for (;;) {
      const left = Math.max(1, until - Date.now());
      try {
        const a = await t.call<Acquired>({
          method: "POST",
          path: "/v1/acquire",
          body: { ...body, lease: granted.lease, wait_ms: left },
          timeoutMs: left + t.timeoutMs,
          unknownAgain: true,
          signal: o.signal,
        });
        if (lease.lostReason) throw lease.lostReason;
        lease.granted(a);
        return lease;
      } catch (e) {
        // The wait's call broke (a restart, a leader change): the same
        // request re-attaches to its place in the queue until the wait's end.
        if (e instanceof Error && (e as LeaseholdError).code === "outcome_unknown" && !o.signal?.aborted && Date.now() < until) continue;
        throw e;
      }
    }
  } catch (e) {
    // Given up: the wait went with its connection, and the lease made for
    // it ends in the background.
    lease.abandon();
    throw e;
  }
}

function held(t: Transport, key: string, keys: string[] | undefined, a: Acquired, ttlMs: number, sentAt: number): Lease {
  const lease = new Lease(t, key, keys, a.lease, ttlMs, sentAt);
  lease.granted(a);
  return lease;
}
