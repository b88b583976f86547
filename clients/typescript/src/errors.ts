/**
 * Errors: one class per error code the server sends (docs/api.md,
 * "Errors"), and the client's own {@link LeaseLostError}. Every one is a
 * {@link LeaseholdError} with `code` (stable), `message` and `details` (the
 * rest of the error body: `holder`, `fence`, `leader`, ...).
 *
 * ```ts
 * try { await client.acquire("nightly") }
 * catch (e) { if (e instanceof HeldError) console.log("held by", e.details.holder) }
 * ```
 */

export class LeaseholdError extends Error {
  readonly code: string;
  readonly details: Record<string, unknown>;
  constructor(code: string, message: string, details: Record<string, unknown> = {}) {
    super(message);
    this.name = new.target.name;
    this.code = code;
    this.details = details;
  }
}

/** A field is out of its limits; nothing changed. */
export class InvalidArgumentError extends LeaseholdError {}
/** The lease was never granted. */
export class LeaseNotFoundError extends LeaseholdError {}
/** The lease ended (expired or revoked). */
export class LeaseExpiredError extends LeaseholdError {}
/** Someone else holds the key (`details.holder`, `lease`, `fence`). */
export class HeldError extends LeaseholdError {}
/** The key is in its lock-delay (`details.delay_left_ms`). */
export class LockDelayedError extends LeaseholdError {}
/** The token presented does not hold the key. */
export class StaleFenceError extends LeaseholdError {}
/** A wait ended without a grant. */
export class WaitTimeoutError extends LeaseholdError {}
/** No token, or a bad or revoked one. */
export class UnauthenticatedError extends LeaseholdError {}
/** The token lacks a permission (`details.key`, `needed`). */
export class PermissionDeniedError extends LeaseholdError {}
/** A follower answered; the client follows `details.leader` by itself. */
export class NotLeaderError extends LeaseholdError {}
/** Nothing was done; retry shortly. */
export class UnavailableError extends LeaseholdError {}
/** It may still take effect; the client retried it with its request id. */
export class OutcomeUnknownError extends LeaseholdError {}
/** No such route: the server is older than this client. */
export class NotFoundError extends LeaseholdError {}
/** The route exists, but not with this method. */
export class MethodNotAllowedError extends LeaseholdError {}
/** A member to add did not answer or catch up. */
export class NotAddedError extends LeaseholdError {}
/** Plaintext to a TLS port: use https://. */
export class TlsRequiredError extends LeaseholdError {}
/** A watch's events are gone: list again, then watch again. */
export class WatchBehindError extends LeaseholdError {}
/** A quota or rate limit refused it; nothing was done. */
export class ResourceExhaustedError extends LeaseholdError {}
/** The server failed in a way the caller cannot fix. */
export class InternalError extends LeaseholdError {}
/** This client's own: the lease is lost (a renewal refused, or its deadline passed). Stop mutating. */
export class LeaseLostError extends LeaseholdError {}

const BY_CODE: Record<string, new (code: string, message: string, details?: Record<string, unknown>) => LeaseholdError> = {
  invalid_argument: InvalidArgumentError,
  lease_not_found: LeaseNotFoundError,
  lease_expired: LeaseExpiredError,
  held: HeldError,
  lock_delayed: LockDelayedError,
  stale_fence: StaleFenceError,
  wait_timeout: WaitTimeoutError,
  unauthenticated: UnauthenticatedError,
  permission_denied: PermissionDeniedError,
  not_leader: NotLeaderError,
  unavailable: UnavailableError,
  outcome_unknown: OutcomeUnknownError,
  not_found: NotFoundError,
  method_not_allowed: MethodNotAllowedError,
  not_added: NotAddedError,
  tls_required: TlsRequiredError,
  watch_behind: WatchBehindError,
  resource_exhausted: ResourceExhaustedError,
  internal: InternalError,
  lease_lost: LeaseLostError,
};

/** Every code the server sends, and the client's own `lease_lost`. */
export const CODES: readonly string[] = Object.keys(BY_CODE);

/** The error of `code`, as its own class. */
export function errorOf(code: string, message: string, details: Record<string, unknown> = {}): LeaseholdError {
  const cls = BY_CODE[code] ?? LeaseholdError;
  return new cls(code, message, details);
}

/** The error an HTTP error answer's body stands for. */
export function fromBody(status: number, body: unknown): LeaseholdError {
  const error = (body as { error?: Record<string, unknown> } | null)?.error;
  if (!error || typeof error !== "object") {
    return new InternalError("internal", `HTTP ${status} without an error body`);
  }
  const { code, message, ...details } = error;
  return errorOf(String(code ?? "internal"), String(message ?? code), details);
}

/** Nothing was done: the same request may go anywhere. */
export function notDone(e: unknown): boolean {
  return e instanceof NotLeaderError || e instanceof UnavailableError;
}
