/**
 * Calls to leaseholdd over HTTP/JSON: the endpoints of a deployment, the
 * leader followed, and calls sent again while nothing was done (or, for
 * calls that carry a request id, while the outcome is unknown). Node's own
 * http and https modules: TLS with a CA and a client certificate, and no
 * runtime dependency.
 */

import * as http from "node:http";
import * as https from "node:https";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { hostname } from "node:os";

import { errorOf, fromBody, LeaseholdError, NotLeaderError, notDone, OutcomeUnknownError } from "./errors.js";

/** How a {@link Client} connects. Everything is optional. */
export interface ClientOptions {
  /** The name others see when they find a key held (default: LEASEHOLD_HOLDER, else host/pid). */
  holder?: string;
  /** An access token, sent as `Authorization: Bearer` (default: LEASEHOLD_TOKEN). */
  token?: string;
  /** A CA (PEM) to trust for https:// instead of the system's (default: LEASEHOLD_CACERT). */
  ca?: string | Buffer;
  /** A client certificate and its key (PEM), for a node with --tls-client-ca (default: LEASEHOLD_CLIENT_CERT, LEASEHOLD_CLIENT_KEY). */
  cert?: string | Buffer;
  key?: string | Buffer;
  /** One call's time limit, in ms (default 5000). */
  timeoutMs?: number;
  /** How long a call is sent again while no node took it, in ms (default 10000). */
  retryForMs?: number;
}

/** A random request id: nonzero, below 2^53 (exact in a JavaScript number). */
export function requestId(): number {
  const b = randomBytes(8);
  const high = b.readUInt32BE(0) & 0x1fffff;
  const low = b.readUInt32BE(4);
  return (high * 0x100000000 + low) || 1;
}

export interface Call {
  method: string;
  path: string;
  query?: Record<string, string>;
  body?: unknown;
  /** Each attempt's limit (default: the client's). */
  timeoutMs?: number;
  /** Retries' limit (default: the client's; 0: none). */
  retryForMs?: number;
  /** It carries a request id (or acting twice is acting once): an unknown outcome is sent again too. */
  unknownAgain?: boolean;
  signal?: AbortSignal;
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });

export { sleep };

/** What to do about a TLS failure, from its text; undefined if it is not one. */
export function tlsAdvice(e: unknown): string | undefined {
  const text = String((e as { code?: string })?.code ?? "") + " " + String((e as Error)?.message ?? e);
  const has = (...s: string[]) => s.some((x) => text.includes(x));
  if (has("certificate required", "CERTIFICATE_REQUIRED"))
    return "the server requires a client certificate: give cert and key (LEASEHOLD_CLIENT_CERT, LEASEHOLD_CLIENT_KEY)";
  if (has("UNABLE_TO_VERIFY_LEAF_SIGNATURE", "SELF_SIGNED_CERT_IN_CHAIN", "DEPTH_ZERO_SELF_SIGNED_CERT", "unable to get local issuer", "ERR_TLS_CERT_ALTNAME_INVALID"))
    return "the server's certificate is not signed by a CA this client trusts, or does not name the host: give ca with the CA that signed it (LEASEHOLD_CACERT)";
  if (has("unknown ca", "UNKNOWN_CA", "bad certificate", "BAD_CERTIFICATE", "decrypt error"))
    return "the server does not accept this client certificate: use one signed by the CA of the server's --tls-client-ca";
  if (has("CERT_HAS_EXPIRED", "certificate expired"))
    return "a certificate is outside its validity period: renew it";
  if (has("wrong version number", "WRONG_VERSION_NUMBER", "packet length too long"))
    return "the server does not speak TLS on this port: use http://";
  return undefined;
}

/** The nodes of a deployment, the one in use, and how to reach them. */
export class Transport {
  readonly holder: string;
  readonly timeoutMs: number;
  readonly retryForMs: number;
  private urls: string[];
  private current = 0;
  private readonly secure: boolean;
  private readonly token?: string;
  private readonly agent: http.Agent;
  /** A rule broken on purpose for the conformance suite (LEASEHOLD_PLANTED_BUG; never set it otherwise). */
  readonly plant?: string;

  constructor(url: string, options: ClientOptions = {}) {
    const env = process.env;
    const raw = url.trim();
    this.secure = raw.startsWith("https://");
    const scheme = this.secure ? "https://" : "http://";
    this.urls = raw
      .split(",")
      .map((p) => p.trim().replace(/\/+$/, ""))
      .filter((p) => p)
      .map((p) => (p.includes("://") ? p : scheme + p));
    if (this.urls.length === 0) throw errorOf("invalid_argument", `endpoint ${JSON.stringify(url)}: no address`);
    for (const u of this.urls) {
      if (!u.startsWith(scheme))
        throw errorOf("invalid_argument", `endpoint ${JSON.stringify(url)}: every endpoint takes the same scheme`);
    }
    this.holder = options.holder ?? env.LEASEHOLD_HOLDER ?? `${hostname()}/${process.pid}`;
    this.token = options.token ?? env.LEASEHOLD_TOKEN;
    this.timeoutMs = options.timeoutMs ?? 5000;
    this.retryForMs = options.retryForMs ?? 10000;
    this.plant = env.LEASEHOLD_PLANTED_BUG;
    const file = (v: string | Buffer | undefined, name: string) => {
      if (v !== undefined) return v;
      const path = env[name];
      if (!path) return undefined;
      try {
        return readFileSync(path);
      } catch (e) {
        throw errorOf("invalid_argument", `read ${name} ${path}: ${(e as Error).message}`);
      }
    };
    if (this.secure) {
      this.agent = new https.Agent({
        keepAlive: true,
        maxSockets: 64,
        ca: file(options.ca, "LEASEHOLD_CACERT"),
        cert: file(options.cert, "LEASEHOLD_CLIENT_CERT"),
        key: file(options.key, "LEASEHOLD_CLIENT_KEY"),
      });
    } else {
      this.agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
    }
  }

  /** Closes idle connections. */
  close(): void {
    this.agent.destroy();
  }

  base(): string {
    return this.urls[this.current];
  }

  several(): boolean {
    return this.urls.length > 1;
  }

  /** After a failure at `from`: the next node (unless another call moved on). */
  next(from: string): void {
    if (this.urls[this.current] === from) this.current = (this.current + 1) % this.urls.length;
  }

  /** A node named the leader: go there. False if it named none. */
  follow(from: string, leader: unknown): boolean {
    if (typeof leader !== "string" || !leader) {
      this.next(from);
      return false;
    }
    const url = leader.includes("://") ? leader : (this.secure ? "https://" : "http://") + leader;
    let at = this.urls.indexOf(url);
    if (at < 0) {
      this.urls.push(url);
      at = this.urls.length - 1;
    }
    this.current = at;
    return true;
  }

  /** An open request to `base`; the caller reads or aborts it. */
  open(base: string, method: string, path: string, headers: Record<string, string>, body: string | undefined, signal?: AbortSignal): http.ClientRequest {
    const url = new URL(base + path);
    const lib = this.secure ? https : http;
    const h: Record<string, string> = { ...headers };
    if (this.token) h["authorization"] = `Bearer ${this.token}`;
    if (body !== undefined) {
      h["content-type"] = "application/json";
      h["content-length"] = String(Buffer.byteLength(body));
    }
    const req = lib.request(url, { method, headers: h, agent: this.agent, signal });
    if (body !== undefined) req.write(body);
    req.end();
    return req;
  }

  /** One call, sent again as the rules allow; the answer's JSON. */
  async call<T>(k: Call): Promise<T> {
    const retryFor = k.retryForMs ?? this.retryForMs;
    const giveUp = Date.now() + retryFor;
    const body = k.body === undefined ? undefined : JSON.stringify(k.body);
    let pause = 0;
    for (;;) {
      const base = this.base();
      let followed = false;
      let err: LeaseholdError;
      try {
        return (await this.attempt(base, k, body)) as T;
      } catch (e) {
        if (k.signal?.aborted) throw k.signal.reason;
        err = e as LeaseholdError;
        if (err instanceof NotLeaderError) followed = this.follow(base, err.details.leader);
      }
      const final = err.details?.final === true;
      // A read, or a call with a request id, acts once however often it is sent.
      const once = k.unknownAgain === true || k.method === "GET";
      const again = notDone(err) || (once && err instanceof OutcomeUnknownError);
      if (final || !again || retryFor <= 0 || Date.now() >= giveUp) throw err;
      if (followed) continue;
      // 10, 20, ... 50 ms: a leader just elected is found within ~50 ms.
      if (pause < 50) pause += 10;
      await sleep(pause, k.signal);
    }
  }

  private attempt(base: string, k: Call, body: string | undefined): Promise<unknown> {
    const query = k.query ? "?" + new URLSearchParams(k.query).toString() : "";
    const url = base + k.path + query;
    return new Promise((resolve, reject) => {
      let settled = false;
      const done = (f: () => void) => {
        if (!settled) {
          settled = true;
          clearTimeout(timer);
          f();
        }
      };
      let sent = false;
      const req = this.open(base, k.method, k.path + query, {}, body, k.signal);
      const timer = setTimeout(() => {
        req.destroy(new Error(`no answer within ${k.timeoutMs ?? this.timeoutMs} ms`));
      }, k.timeoutMs ?? this.timeoutMs);
      req.on("socket", (s) => {
        // A kept-alive connection is open: the request may reach the node.
        if (!s.connecting) sent = true;
        else s.once(this.secure ? "secureConnect" : "connect", () => (sent = true));
      });
      req.on("finish", () => (sent = true));
      req.on("error", (e) => done(() => {
        if (k.signal?.aborted) return reject(k.signal.reason);
        this.next(base);
        reject(this.transportError(url, e, sent));
      }));
      req.on("response", (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("error", (e) => done(() => reject(errorOf("outcome_unknown", `${url}: the answer was cut off: ${e.message}`))));
        res.on("end", () => done(() => {
          const text = Buffer.concat(chunks).toString("utf8");
          let json: unknown = undefined;
          try {
            json = text ? JSON.parse(text) : undefined;
          } catch {
            // Not JSON: said below.
          }
          const status = res.statusCode ?? 0;
          if (status >= 200 && status < 300) return resolve(json);
          if (json === undefined) return reject(errorOf("internal", `${url}: HTTP ${status}: ${text.slice(0, 200)}`));
          const e = fromBody(status, json);
          if (e.code === "unavailable") this.next(base);
          reject(e);
        }));
      });
    });
  }

  /** What a failed exchange stands for (see the Go and Rust clients). */
  transportError(url: string, e: Error, sent: boolean): LeaseholdError {
    const advice = tlsAdvice(e);
    if (advice) return errorOf("unavailable", `${url}: ${advice} (${e.message})`, { final: true });
    const code = (e as { code?: string }).code;
    if (code === "ECONNREFUSED" || code === "ENOTFOUND" || code === "EHOSTUNREACH" || !sent) {
      if (!this.several() && code === "ECONNREFUSED")
        return errorOf("unavailable", `${url}: ${e.message} (is leaseholdd running there?)`, { final: true });
      return errorOf("unavailable", `${url}: ${e.message}`);
    }
    return errorOf("outcome_unknown", `${url}: ${e.message}`);
  }
}
