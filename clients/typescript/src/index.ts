/**
 * Leasehold for TypeScript and JavaScript: distributed locks that are a
 * lease plus a fencing token, in the shape of the Web Locks API.
 *
 * ```ts
 * import { Client } from "leasehold-client";
 * const client = new Client("http://127.0.0.1:7419");
 * await client.locks.request("nightly", { ttlMs: 30000 }, async (lock) => {
 *   await write(batch, lock.fence);       // lock.signal aborts if the lease is lost
 * });
 * ```
 */

import { Election } from "./election.js";
import { acquire, Lease } from "./lease.js";
import type { AcquireOptions } from "./lease.js";
import { LockManager } from "./locks.js";
import { Transport, requestId } from "./transport.js";
import type { ClientOptions } from "./transport.js";
import { watch } from "./watch.js";
import type * as wire from "./wire.js";
import type { LockEvent, WatchOptions } from "./watch.js";

export * from "./errors.js";
export { Election, Leadership } from "./election.js";
export type { Leader } from "./election.js";
export { Lease, margin } from "./lease.js";
export type { AcquireOptions } from "./lease.js";
export { LockManager } from "./locks.js";
export type { HeldLock, LockRequestOptions } from "./locks.js";
export type { ClientOptions } from "./transport.js";
export type { LockEvent, Position, WatchOptions } from "./watch.js";
export type { Holder, Waiter } from "./wire.js";

/** The local single node of `leaseholdd` with no flags. */
export const DEFAULT_ENDPOINT = "http://127.0.0.1:7419";

/** One lock as the server describes it. */
export type LockInfo = wire.Lock;

/**
 * A connection to leaseholdd: one node, or a cluster's nodes
 * (`"http://a:7419,b:7419,c:7419"`); calls go to the leader.
 */
export class Client {
  /** The Web Locks API's shape: `client.locks.request(name, options, callback)`. */
  readonly locks: LockManager;
  private readonly t: Transport;

  constructor(url: string = process.env.LEASEHOLD_ENDPOINT ?? DEFAULT_ENDPOINT, options: ClientOptions = {}) {
    this.t = new Transport(url, options);
    this.locks = new LockManager(this.t);
  }

  /** The name this client's leases carry. */
  get holder(): string {
    return this.t.holder;
  }

  /** Closes idle connections. */
  close(): void {
    this.t.close();
  }

  /**
   * Takes `key` and answers its lease, waiting up to `waitMs` (default 0:
   * answer at once) in the key's queue; `signal` withdraws a wait.
   * Release it with `lease.release()`.
   */
  acquire(key: string, options: AcquireOptions = {}): Promise<Lease> {
    return acquire(this.t, key, options);
  }

  /**
   * Takes every key of `keys` or none, with one token (a lock set, taken
   * in one step: no order to get wrong, no deadlock).
   */
  acquireSet(keys: string[], options: Omit<AcquireOptions, "keys"> = {}): Promise<Lease> {
    return acquire(this.t, "", { ...options, keys });
  }

  /** Releases `key` if `fence` still holds it; never anyone else's hold. */
  async releaseByFence(key: string, fence: number): Promise<void> {
    await this.t.call({ method: "POST", path: "/v1/release", body: { key, fence, request_id: requestId() }, unknownAgain: true });
  }

  /** The key as the server sees it (a free key is no error). */
  describe(key: string): Promise<LockInfo> {
    return this.t.call<LockInfo>({ method: "GET", path: "/v1/locks/" + key.split("/").map(encodeURIComponent).join("/") });
  }

  /**
   * Every lock under `prefix`, in key order, read a page at a time;
   * `held: true` leaves out keys nobody holds or waits for.
   */
  async *list(prefix = "", options: { held?: boolean } = {}): AsyncGenerator<LockInfo, void, undefined> {
    let startAfter: string | null = null;
    do {
      const query: Record<string, string> = { prefix, held: String(options.held === true) };
      if (startAfter !== null) query.start_after = startAfter;
      const page: { locks: wire.Lock[]; next_start_after: string | null } = await this.t.call({ method: "GET", path: "/v1/locks", query });
      yield* page.locks;
      startAfter = page.next_start_after;
    } while (startAfter !== null);
  }

  /** The election `name`: campaign, observe, proclaim, resign. */
  election(name: string): Election {
    return new Election(this.t, name);
  }

  /** Lock events under `prefix`, from now (or after `options.after`), resumed across the loss of a node. */
  watch(prefix = "", options: WatchOptions = {}): AsyncGenerator<LockEvent, void, undefined> {
    return watch(this.t, prefix, options);
  }
}
