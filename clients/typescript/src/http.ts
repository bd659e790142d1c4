/**
 * HTTP with safe retries (docs/clients.md). Retried, with exponential
 * backoff and full jitter, until the call's deadline: transport errors
 * (refused, reset, timed out, garbled), 429 `rate_limited` and 503 (waiting
 * at least `Retry-After`), 502 and 504, and up to `serverErrors` 500s.
 * Every other error answer is a refusal, thrown at once as its typed error.
 * A 401 or 403 after an attempt that may have reached the service leaves a
 * journaled request pending: the key is checked before the `request_id`.
 */

import { ApiError, KioskError, Unreachable, errorFromProblem } from "./errors.js";

export interface RetryPolicy {
  /** First backoff ceiling (ms); doubles per attempt. Default 200. */
  baseDelayMs?: number;
  /** Largest backoff ceiling (ms). Default 5000. */
  maxDelayMs?: number;
  /** 500s retried before giving up. Default 3. */
  serverErrors?: number;
}

export type Fetch = (input: string, init: RequestInit) => Promise<Response>;

export interface Logger {
  info(message: string): void;
  warn(message: string): void;
}

/**
 * Asked after a transport error (a fetch that threw): an error to throw at
 * once instead of retrying (a {@link CorsRefused}), or null to retry.
 */
export type Diagnose = (error: unknown) => Promise<KioskError | null>;

export const RETRIED_STATUSES: readonly number[] = [429, 502, 503, 504];
export const BEFORE_REPLAY_STATUSES: readonly number[] = [401, 403];

/** Transport errors raised before any byte of the request was sent. */
const NOT_SENT_CODES = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "UND_ERR_CONNECT_TIMEOUT",
]);

function notSent(error: unknown): boolean {
  let cause: unknown = error;
  for (let depth = 0; depth < 4 && cause instanceof Object; depth += 1) {
    const code = (cause as { code?: unknown }).code;
    if (typeof code === "string" && NOT_SENT_CODES.has(code)) return true;
    cause = (cause as { cause?: unknown }).cause;
  }
  return false;
}

export interface CallOptions {
  deadline: number;
  body?: Record<string, unknown>;
  query?: Record<string, string | number>;
  /** Extra time for a long poll's answer (ms). */
  readExtraMs?: number;
  requestId?: string | null;
  pendingOnGiveUp?: boolean;
  mayHaveLanded?: boolean;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** How a key is shown anywhere it could be printed: never the key. */
export const REDACTED_KEY = "tbk_…[redacted]";

/** Node's hook for `util.inspect` and `console.log` (a plain symbol elsewhere). */
export const INSPECT: unique symbol = Symbol.for("nodejs.util.inspect.custom");

export class Http {
  private readonly base: string;
  // The key lives only in this private field (`#`, not TypeScript's
  // `private`: invisible to `console.log`, `util.inspect`, `JSON.stringify`,
  // `Object.keys` and the debugger's property list): never logged, never
  // journaled.
  readonly #authorization: string;
  readonly requestTimeoutMs: number;
  private readonly retry: Required<RetryPolicy>;
  private readonly diagnose: Diagnose | null;

  constructor(
    baseUrl: string,
    apiKey: string,
    options: { requestTimeoutMs: number; retry: RetryPolicy; fetch: Fetch; logger: Logger; diagnose?: Diagnose },
    private readonly fetcher: Fetch = options.fetch,
    private readonly log: Logger = options.logger,
  ) {
    this.base = baseUrl.replace(/\/+$/, "");
    this.#authorization = `Bearer ${apiKey}`;
    this.requestTimeoutMs = options.requestTimeoutMs;
    this.diagnose = options.diagnose ?? null;
    this.retry = {
      baseDelayMs: options.retry.baseDelayMs ?? 200,
      maxDelayMs: options.retry.maxDelayMs ?? 5000,
      serverErrors: options.retry.serverErrors ?? 3,
    };
  }

  /** What `JSON.stringify` and `util.inspect` show: the key redacted. */
  toJSON(): Record<string, unknown> {
    return { baseUrl: this.base, apiKey: REDACTED_KEY, requestTimeoutMs: this.requestTimeoutMs };
  }

  [INSPECT](): string {
    return `Http ${JSON.stringify(this.toJSON())}`;
  }

  private backoff(attempt: number): number {
    const ceiling = Math.min(this.retry.maxDelayMs, this.retry.baseDelayMs * 2 ** Math.min(attempt, 20));
    return Math.random() * ceiling;
  }

  /** `[status, JSON body]` of the first 2xx answer; see the module's rules. */
  async call(method: string, path: string, options: CallOptions): Promise<[number, Record<string, unknown>]> {
    const { deadline, body, query, requestId = null, pendingOnGiveUp = false } = options;
    let mayHaveLanded = options.mayHaveLanded ?? false;
    let url = this.base + path;
    if (query !== undefined) {
      const search = new URLSearchParams();
      for (const [name, value] of Object.entries(query)) search.set(name, String(value));
      url += `?${search.toString()}`;
    }
    let attempt = 0;
    let serverErrors = 0;
    for (;;) {
      attempt += 1;
      const remaining = deadline - Date.now();
      const timeoutMs = Math.max(500, Math.min(this.requestTimeoutMs + (options.readExtraMs ?? 0), remaining + 1000));
      const abort = new AbortController();
      const timer = setTimeout(() => abort.abort(new Error("request timed out")), timeoutMs);
      const started = Date.now();
      let failure: unknown;
      let retryAfter: number | null = null;
      let reason: string;
      try {
        const headers: Record<string, string> = {
          Authorization: this.#authorization,
          Accept: "application/json",
        };
        if (body !== undefined) headers["Content-Type"] = "application/json";
        const init: RequestInit = { method, headers, signal: abort.signal };
        if (body !== undefined) init.body = JSON.stringify(body);
        const response = await this.fetcher(url, init);
        const data = await json(response);
        clearTimeout(timer);
        const status = response.status;
        this.log.info(
          `${method} ${path} -> ${status} in ${((Date.now() - started) / 1000).toFixed(2)}s ` +
            `(attempt ${attempt}, request_id ${requestId})`,
        );
        if (status >= 200 && status < 300) return [status, data];
        reason = String(status);
        retryAfter = parseRetryAfter(response.headers.get("Retry-After"));
        const error = errorFromProblem(status, data, { requestId, retryAfter });
        failure = error;
        const retryable = RETRIED_STATUSES.includes(status) && !(status === 429 && data.code !== "rate_limited");
        if (status === 500) {
          // A bug or a broken dependency: a few retries, then give up,
          // leaving a journaled request pending.
          serverErrors += 1;
          if (serverErrors > this.retry.serverErrors) throw giveUp(error, method, path, requestId, pendingOnGiveUp);
        } else if (!retryable) {
          if (mayHaveLanded && BEFORE_REPLAY_STATUSES.includes(status)) error.pending = pendingOnGiveUp;
          throw error;
        }
        if (status >= 500) mayHaveLanded = true;
      } catch (error) {
        clearTimeout(timer);
        if (error instanceof ApiError) throw error;
        failure = error;
        reason = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
        if (!notSent(error)) mayHaveLanded = true;
        if (this.diagnose !== null && !abort.signal.aborted) {
          const cause = await this.diagnose(error);
          if (cause !== null) {
            cause.pending = pendingOnGiveUp && mayHaveLanded;
            throw cause;
          }
        }
      }
      let delay = this.backoff(attempt - 1);
      if (retryAfter !== null) delay = retryAfter * 1000 + delay / 4;
      if (Date.now() + delay >= deadline) throw giveUp(failure, method, path, requestId, pendingOnGiveUp);
      this.log.warn(
        `${method} ${path}: ${reason}, retrying in ${(delay / 1000).toFixed(2)}s ` +
          `(attempt ${attempt}, request_id ${requestId})`,
      );
      await sleep(delay);
    }
  }
}

function giveUp(failure: unknown, method: string, path: string, requestId: string | null, pending: boolean): Error {
  if (failure instanceof ApiError) {
    failure.pending = pending;
    return failure;
  }
  const name = failure instanceof Error ? failure.name : typeof failure;
  return new Unreachable(`${method} ${path}: no answer before the deadline (${name})`, {
    requestId,
    pending,
    cause: failure,
  });
}

async function json(response: Response): Promise<Record<string, unknown>> {
  const text = await response.text();
  if (text === "") return {};
  try {
    const value: unknown = JSON.parse(text);
    return value !== null && typeof value === "object" && !Array.isArray(value)
      ? (value as Record<string, unknown>)
      : {};
  } catch {
    return {};
  }
}

function parseRetryAfter(value: string | null): number | null {
  if (value === null) return null;
  const seconds = Number(value);
  return Number.isFinite(seconds) ? Math.max(0, seconds) : null;
}
