/**
 * The Web Locks API's shape, over leaseholdd: `request(name, options,
 * callback)` takes the lock, runs the callback with it, releases it once the
 * callback settles, and answers the callback's result.
 */

import { HeldError, LockDelayedError, LeaseLostError } from "./errors.js";
import { acquire, Lease } from "./lease.js";
import { Transport } from "./transport.js";

/** The lock a callback runs with. */
export interface HeldLock {
  /** The lock's name (its key). */
  readonly name: string;
  /** "exclusive" or "shared" (a semaphore's permit is "exclusive", with `permits`). */
  readonly mode: "exclusive" | "shared";
  /** The fencing token: send it with every write the lock protects. */
  readonly fence: number;
  /** Aborted, with a LeaseLostError as its reason, the moment the lease is lost. */
  readonly signal: AbortSignal;
  /** The token, checked: throws a LeaseLostError once the lease is lost. */
  token(): number;
  /** What the previous holder saved, if anything. */
  readonly checkpoint?: Buffer;
  /** Saves bytes for the next holder, fenced by this lock's token. */
  saveCheckpoint(data: string | Uint8Array): Promise<void>;
  /** The lease under the lock. */
  readonly lease: Lease;
}

/** The Web Locks API's options, and Leasehold's own. */
export interface LockRequestOptions {
  /** "exclusive" (default) or "shared". */
  mode?: "exclusive" | "shared";
  /** Take it only if it is free; else the callback runs with null. */
  ifAvailable?: boolean;
  /** Aborting it while the request waits withdraws the wait from the server's queue. */
  signal?: AbortSignal;
  /** The lease's TTL, ms (default 15000); it renews every TTL/3 while the callback runs. */
  ttlMs?: number;
  /** How long to wait in the queue, ms (default 30000). */
  waitMs?: number;
  /** One of this many permits of a semaphore. */
  permits?: number;
  /** Lock-delay after an expiry, ms. */
  lockDelayMs?: number;
}

type Granted<T> = ((lock: HeldLock) => T | Promise<T>) | ((lock: HeldLock | null) => T | Promise<T>);

export class LockManager {
  constructor(private readonly t: Transport) {}

  /**
   * Takes the lock `name`, runs `callback` with it, releases it once the
   * callback settles (without making the caller wait on the release's
   * retries), and answers what the callback answered. With `ifAvailable`,
   * a lock held by someone else runs the callback with null. A lock lost
   * while the callback runs aborts `lock.signal`; it never becomes an
   * unhandled rejection, and the lock is never taken again behind the
   * callback's back.
   */
  async request<T>(name: string, callback: (lock: HeldLock) => T | Promise<T>): Promise<T>;
  async request<T>(name: string, options: LockRequestOptions & { ifAvailable?: false }, callback: (lock: HeldLock) => T | Promise<T>): Promise<T>;
  async request<T>(name: string, options: LockRequestOptions, callback: (lock: HeldLock | null) => T | Promise<T>): Promise<T>;
  async request<T>(name: string, a: LockRequestOptions | Granted<T>, b?: Granted<T>): Promise<T> {
    const options: LockRequestOptions = typeof a === "function" ? {} : a;
    const callback = (typeof a === "function" ? a : b)!;
    let lease: Lease;
    try {
      lease = await acquire(this.t, name, {
        ttlMs: options.ttlMs,
        waitMs: options.ifAvailable ? 0 : options.waitMs ?? 30000,
        mode: options.mode,
        permits: options.permits,
        lockDelayMs: options.lockDelayMs,
        signal: options.signal,
      });
    } catch (e) {
      // Only the overload with ifAvailable takes a callback that expects null.
      if (options.ifAvailable && (e instanceof HeldError || e instanceof LockDelayedError))
        return await (callback as (lock: HeldLock | null) => T | Promise<T>)(null);
      throw e;
    }
    const lock: HeldLock = {
      name,
      mode: options.mode ?? "exclusive",
      fence: lease.fence,
      signal: lease.signal,
      token: () => lease.token(),
      checkpoint: lease.checkpoint,
      saveCheckpoint: (data) => lease.saveCheckpoint(data),
      lease,
    };
    try {
      return await callback(lock);
    } finally {
      // The release runs on; a failure of it is not the callback's.
      lease.release().catch((e) => {
        if (!(e instanceof LeaseLostError)) lease.lose(`release failed: ${(e as Error).message}`);
      });
    }
  }
}
