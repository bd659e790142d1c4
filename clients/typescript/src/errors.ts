/**
 * Typed errors: one class per problem `code` the kiosk meets, a generic
 * {@link ApiError} for any other, and two that are not refusals:
 * {@link Unreachable} and {@link JobNotFinished} (the request is still
 * pending). Every error has `requestId` and `pending` (docs/clients.md).
 */

import type { Job } from "./models.js";

export class KioskError extends Error {
  /** The journaled request this error is about, if any. */
  readonly requestId: string | null;
  /** True: the request may still land; it stays in the journal. */
  pending: boolean;

  constructor(message: string, options: { requestId?: string | null; pending?: boolean } = {}) {
    super(message);
    this.name = new.target.name;
    this.requestId = options.requestId ?? null;
    this.pending = options.pending ?? false;
  }
}

/** No answer before the deadline: the request is still pending. */
export class Unreachable extends KioskError {
  constructor(message: string, options: { requestId?: string | null; pending?: boolean; cause?: unknown } = {}) {
    super(message, options);
    if (options.cause !== undefined) {
      (this as { cause?: unknown }).cause = options.cause;
    }
  }
}

/**
 * A configuration error, not a network one: the browser refuses this page
 * the service's answers because the page's origin is not one of the
 * service's `CORS_ALLOWED_ORIGINS` (or the page's fetch is not one the
 * service allows). Seen from the page as a plain `TypeError: Failed to
 * fetch`, exactly like lost Wi-Fi; the client tells them apart with two
 * probes of `/readyz` (a `cors` one refused while a `no-cors` one is
 * answered) and never retries it: fix the service's setting or the page's
 * origin. A journaled request stays pending (`pending` true when it may
 * have been sent), so it is settled once the setting is fixed.
 */
export class CorsRefused extends KioskError {
  /** The page's origin (`location.origin`), or null outside a page. */
  readonly origin: string | null;
  /** The service the page was refused by. */
  readonly baseUrl: string;

  constructor(
    message: string,
    options: { origin: string | null; baseUrl: string; requestId?: string | null; pending?: boolean },
  ) {
    super(message, options);
    this.origin = options.origin;
    this.baseUrl = options.baseUrl;
  }
}

/** The deadline passed while the job was still running; it goes on. */
export class JobNotFinished extends KioskError {
  readonly job: Job;

  constructor(message: string, job: Job) {
    super(message, { requestId: job.request_id, pending: true });
    this.job = job;
  }
}

/** The journal cannot be opened or written (or is in use by another process). */
export class JournalError extends KioskError {}

/** A refusal of the service: its problem+json, as fields. */
export class ApiError extends KioskError {
  readonly status: number;
  readonly code: string;
  readonly detail: string;
  readonly problem: Record<string, unknown>;
  /** The service's `Retry-After`, in seconds, when it sent one. */
  readonly retryAfter: number | null;

  constructor(
    status: number,
    code: string,
    detail: string,
    options: {
      problem?: Record<string, unknown>;
      requestId?: string | null;
      pending?: boolean;
      retryAfter?: number | null;
    } = {},
  ) {
    super(`${status} ${code}: ${detail}`, options);
    this.status = status;
    this.code = code;
    this.detail = detail;
    this.problem = options.problem ?? {};
    this.retryAfter = options.retryAfter ?? null;
  }
}

function integer(value: unknown): number {
  return typeof value === "number" && Number.isInteger(value) ? value : 0;
}

/** 402: not enough available tokens; `reserved > 0`: other booths hold some. */
export class InsufficientTokens extends ApiError {
  get available(): number {
    return integer(this.problem.available);
  }
  get reserved(): number {
    return integer(this.problem.reserved);
  }
}

/**
 * 402: this kiosk key's budget (its spending limit per period) has fewer
 * tokens left than asked: `remaining` until `resetsAt` (RFC 3339; null for a
 * budget that never resets). The account may still hold tokens.
 */
export class KeyBudgetExhausted extends ApiError {
  get remaining(): number {
    return integer(this.problem.remaining);
  }
  get resetsAt(): string | null {
    return typeof this.problem.resets_at === "string" ? this.problem.resets_at : null;
  }
}

/** 409: the account is suspended; nothing can be spent. */
export class AccountSuspended extends ApiError {}

/** 429: the account holds `maxActiveReservations` reservations (other booths). */
export class TooManyActiveReservations extends ApiError {
  get maxActiveReservations(): number {
    return integer(this.problem.max_active_reservations);
  }
}

/** 429: this key is over its rate, still after the retries the deadline allowed. */
export class RateLimited extends ApiError {}

/**
 * 401: the key is missing, unknown, revoked or expired. Answered to a retry
 * after an attempt that may have reached the service, or to `resume()`, it
 * proves nothing about the request, which stays pending (`pending` true).
 */
export class Unauthorized extends ApiError {}

/** 422: the `request_id` was already used for a different request. */
export class IdempotencyKeyReused extends ApiError {}

/** 409: the reservation was resolved differently or expired. */
export class ReservationNotHeld extends ApiError {
  get state(): string | null {
    return typeof this.problem.state === "string" ? this.problem.state : null;
  }
}

const BY_CODE: Record<string, typeof ApiError> = {
  insufficient_tokens: InsufficientTokens,
  key_budget_exhausted: KeyBudgetExhausted,
  account_suspended: AccountSuspended,
  too_many_active_reservations: TooManyActiveReservations,
  rate_limited: RateLimited,
  unauthorized: Unauthorized,
  idempotency_key_reused: IdempotencyKeyReused,
  reservation_not_held: ReservationNotHeld,
};

/** The problem codes mapped to their own class. */
export const ERRORS_BY_CODE: Readonly<Record<string, typeof ApiError>> = BY_CODE;

/** The typed error of a problem+json answer (`http_<status>` without a code). */
export function errorFromProblem(
  status: number,
  problem: Record<string, unknown>,
  options: { requestId?: string | null; retryAfter?: number | null } = {},
): ApiError {
  const code = typeof problem.code === "string" ? problem.code : `http_${status}`;
  const detail = typeof problem.detail === "string" ? problem.detail : "";
  const Kind = BY_CODE[code] ?? ApiError;
  return new Kind(status, code, detail, { ...options, problem });
}
