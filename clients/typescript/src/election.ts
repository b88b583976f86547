/**
 * Leader election on a key: candidates wait in its FIFO queue, the one
 * holding it leads, its token is the leadership's term, and its value is
 * the key's checkpoint, saved under its own token.
 */

import { WaitTimeoutError, WatchBehindError } from "./errors.js";
import { acquire, encodeKey, Lease } from "./lease.js";
import type { AcquireOptions } from "./lease.js";
import { Transport } from "./transport.js";
import { watch } from "./watch.js";
import type { Lock } from "./wire.js";
import type { LockEvent } from "./watch.js";

/** Who leads: the value it proclaimed, its token and holder name. */
export interface Leader {
  value: Buffer;
  fence: number;
  holder: string;
}

/** This process leading: the lease on the election's key. */
export class Leadership {
  constructor(readonly lease: Lease) {}
  /** Aborted the moment the leadership is lost. */
  get signal(): AbortSignal {
    return this.lease.signal;
  }
  /** The leadership's token; throws once it is lost. */
  token(): number {
    return this.lease.token();
  }
  /** Changes the value observers see, without a new election. */
  proclaim(value: string | Uint8Array): Promise<void> {
    return this.lease.saveCheckpoint(value);
  }
  /** Steps down: the next candidate in line leads. */
  resign(): Promise<void> {
    return this.lease.release();
  }
}


function leaderOf(view: Lock): Leader | null {
  if (!view.holder || view.checkpoint_base64 === undefined || view.checkpoint_fence !== view.holder.fence) return null;
  return { value: Buffer.from(view.checkpoint_base64, "base64"), fence: view.holder.fence, holder: view.holder.holder };
}

function same(a: Leader | null, b: Leader | null): boolean {
  if (!a || !b) return a === b;
  return a.fence === b.fence && a.holder === b.holder && a.value.equals(b.value);
}

export class Election {
  constructor(private readonly t: Transport, readonly name: string) {}

  /**
   * Waits in line until this candidate leads (however long it takes, until
   * `signal` aborts), then proclaims `value`. A failed proclaim releases
   * the key: observers never see a leader without a value.
   */
  async campaign(value: string | Uint8Array, o: AcquireOptions = {}): Promise<Leadership> {
    for (;;) {
      let lease: Lease;
      try {
        lease = await acquire(this.t, this.name, { ...o, waitMs: o.waitMs ?? 3_600_000 });
      } catch (e) {
        if (e instanceof WaitTimeoutError && !o.signal?.aborted) continue;
        throw e;
      }
      try {
        await lease.saveCheckpoint(value);
      } catch (e) {
        await lease.release().catch(() => undefined);
        throw e;
      }
      return new Leadership(lease);
    }
  }

  /** Who leads now, or null. */
  async leader(): Promise<Leader | null> {
    return leaderOf(await this.t.call<Lock>({ method: "GET", path: "/v1/locks/" + encodeKey(this.name) }));
  }

  /**
   * The leader now, then every change: a leader that proclaims (a new one,
   * or a new value), and null when the leader goes, until `signal` aborts.
   * It outlives the node it streams from; should events be lost all the
   * same, it reads the election again and yields the leader then, if it
   * changed.
   */
  async *observe(o: { signal?: AbortSignal } = {}): AsyncGenerator<Leader | null, void, undefined> {
    let read = false;
    let stale = false;
    let holder = 0;
    let last: Leader | null = null;
    const pending: (Leader | null)[] = [];
    const opened = async () => {
      if (read && !stale) return;
      const view = await this.t.call<Lock>({ method: "GET", path: "/v1/locks/" + encodeKey(this.name), signal: o.signal });
      const first = !read;
      read = true;
      stale = false;
      holder = view.holder?.fence ?? 0;
      const leader = leaderOf(view);
      if (first || !same(leader, last)) {
        last = leader;
        pending.push(leader);
      }
    };
    const apply = (e: LockEvent): boolean => {
      if (e.key !== this.name || !read) return false;
      let change: Leader | null;
      if (e.kind === "acquired" && (holder === 0 || e.fence > holder)) {
        holder = e.fence;
        change = null;
      } else if ((e.kind === "released" || e.kind === "expired") && e.fence === holder) {
        holder = 0;
        change = null;
      } else if (e.kind === "checkpoint" && e.fence === holder && e.data && e.data.length > 0) {
        change = { value: e.data, fence: e.fence, holder: e.holder };
      } else return false;
      if (same(change, last)) return false;
      last = change;
      pending.push(change);
      return true;
    };
    // The watch runs on its own, into a queue this generator drains: the
    // leader read when a stream opens is yielded before any event comes.
    const stop = new AbortController();
    const onAbort = () => stop.abort(o.signal?.reason);
    o.signal?.addEventListener("abort", onAbort, { once: true });
    let wake: (() => void) | undefined;
    let failure: unknown;
    let finished = false;
    const notify = () => {
      wake?.();
      wake = undefined;
    };
    const pushOpened = async () => {
      await opened();
      notify();
    };
    const running = (async () => {
      for (;;) {
        try {
          for await (const e of watch(this.t, this.name, { signal: stop.signal }, pushOpened)) {
            if (apply(e)) notify();
          }
          finished = true;
          return;
        } catch (e) {
          if (e instanceof WatchBehindError && !stop.signal.aborted) {
            stale = true;
            continue;
          }
          failure = e;
          return;
        }
      }
    })().finally(notify);
    try {
      for (;;) {
        if (o.signal?.aborted) return;
        if (pending.length) {
          yield pending.shift()!;
          continue;
        }
        if (failure !== undefined) throw failure;
        if (finished || stop.signal.aborted) return;
        await new Promise<void>((resolve) => (wake = resolve));
      }
    } finally {
      o.signal?.removeEventListener("abort", onAbort);
      stop.abort();
      await running.catch(() => undefined);
    }
  }
}
