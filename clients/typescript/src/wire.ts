/**
 * The HTTP API's answers as this client reads them, named as in the
 * OpenAPI document (docs/openapi.yaml, `components.schemas`): a test
 * checks that each field here is in its schema with the same JSON type,
 * and that each field the schema requires is here.
 */

/** `Holder`: one holder of a lock. */
export interface Holder {
  lease: number;
  holder: string;
  fence: number;
  ttl_left_ms: number;
  mode: string;
}

/** `Waiter`: one wait in a key's queue. */
export interface Waiter {
  lease: number;
  holder: string;
  wait_left_ms: number;
  mode: string;
}

/** `Lock`: a key as the server describes it. */
export interface Lock {
  key: string;
  holder: Holder | null;
  holders: Holder[];
  permits: number;
  waiters: Waiter[];
  has_checkpoint: boolean;
  delay_left_ms: number;
  checkpoint_base64?: string;
  checkpoint_fence?: number;
}

/** `Acquired`: a grant. */
export interface Acquired {
  fence: number;
  lease: number;
  checkpoint_base64?: string;
}

/** `Granted`: a new lease. */
export interface Granted {
  lease: number;
  ttl_ms: number;
}

/** The keepalive's answer (`keepAlive`). */
export interface Renewed {
  ttl_ms: number;
  key_count?: number;
}

/** `WatchEvent`: an event's data. */
export interface WatchEvent {
  kind: string;
  key: string;
  fence: number;
  lease: number;
  holder: string;
  index: number;
  seq: number;
  at_unix_ms: number;
  data_base64?: string;
}
