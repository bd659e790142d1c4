/**
 * What the service answers, as the wire has it (snake_case, as in
 * /openapi.json). tests check these against the service's document.
 */

export type JobStatus = "queued" | "running" | "succeeded" | "failed";
export type ReservationState = "held" | "committed" | "released" | "expired";
export type AccountStatus = "active" | "suspended";

export const JOB_TERMINAL_STATUSES: readonly JobStatus[] = ["succeeded", "failed"];

export interface JobReservation {
  reservation_id: string;
  state: ReservationState;
  expires_at: string;
}

/** What a succeeded job produced: the provider's `output` (any JSON). */
export interface JobResult {
  output: unknown;
  provider_job_id?: string;
  [member: string]: unknown;
}

/** Why a failed job failed (its tokens went back). */
export interface JobError {
  code: string;
  message: string;
  [member: string]: unknown;
}

export interface Job {
  job_id: string;
  request_id: string;
  account_id: string;
  kind: string;
  status: JobStatus;
  cost: number;
  attempts: number;
  reservation: JobReservation;
  result: JobResult | null;
  error: JobError | null;
  created_at: string;
  updated_at: string;
  finished_at: string | null;
}

export interface Balance {
  account_id: string;
  name: string;
  status: AccountStatus;
  available: number;
  reserved: number;
  used: number;
  [member: string]: unknown;
}

/**
 * Every event type of the feed and the webhooks (the service's
 * `EventView`, docs/webhooks.md); a test keeps it equal to the types of
 * the service's /openapi.json.
 */
export const EVENT_TYPES = [
  "account.balance_low",
  "account.balance_recovered",
  "account.balance_depleted",
  "credit.created",
  "adjustment.created",
  "reservation.expired",
  "grant.expired",
  "grant.expiring",
  "topup.granted",
  "topup.requested",
  "topup.request_expired",
  "topup.cap_reached",
  "job.succeeded",
  "job.failed",
  "invariant.violated",
  "endpoint.disabled",
] as const;

export type EventType = (typeof EVENT_TYPES)[number];

export interface Event {
  id: string;
  type: EventType;
  created_at: string;
  data: Record<string, unknown>;
}

export function isTerminal(job: Job): boolean {
  return JOB_TERMINAL_STATUSES.includes(job.status);
}

/** What a top-up rule is doing (`status` of `GET …/topup-rules`). */
export type TopupRuleStatus =
  | "disabled"
  | "scheduled"
  | "request_open"
  | "armed"
  | "waiting_for_use"
  | "cap_reached"
  | "waiting_for_balance";

/** One firing of a top-up rule; a request's `state` is `open`, `fulfilled` or `expired`. */
export interface TopupFiring {
  firing_id: string;
  rule_id: string;
  account_id: string;
  outcome: "granted" | "requested" | "cap_reached" | "skipped";
  tokens: number;
  period_start: string | null;
  cap_period: string | null;
  state: "open" | "fulfilled" | "expired" | null;
  expires_at: string | null;
  credit_id: string | null;
  created_at: string;
  resolved_at: string | null;
}

/** A top-up rule of the account, with what it is doing now. */
export interface TopupRule {
  rule_id: string;
  account_id: string;
  trigger: "threshold" | "schedule";
  mode: "grant" | "request";
  method: string;
  threshold_tokens: number | null;
  tokens: number | null;
  target_tokens: number | null;
  enabled: boolean;
  armed: boolean | null;
  status: TopupRuleStatus;
  /** What its last top-up added and is not used yet (threshold rules). */
  unconsumed_tokens: number | null;
  last_firing: TopupFiring | null;
  [member: string]: unknown;
}

/** The account's top-ups as a sold-out booth needs them. */
export interface TopupState {
  rules: TopupRule[];
  /** The rule whose top-up request waits for the customer (the oldest), or null. */
  openRequest: { rule: TopupRule; firing: TopupFiring } | null;
  /** Rules that fire when the balance goes below their line. */
  armed: TopupRule[];
  /** Rules stopped by their daily or monthly cap. */
  capped: TopupRule[];
  /** A request is open, or a threshold rule in mode grant is armed. */
  onItsWay: boolean;
}

/** The {@link TopupState} of a list of rules. */
export function topupStateOf(rules: TopupRule[]): TopupState {
  let openRequest: TopupState["openRequest"] = null;
  for (const rule of rules) {
    const firing = rule.last_firing;
    if (rule.status === "request_open" && firing !== null && firing.state === "open") {
      openRequest = { rule, firing };
      break;
    }
  }
  const armed = rules.filter((rule) => rule.status === "armed");
  const capped = rules.filter((rule) => rule.status === "cap_reached");
  const onItsWay = openRequest !== null || armed.some((rule) => rule.mode === "grant" && rule.trigger === "threshold");
  return { rules, openRequest, armed, capped, onItsWay };
}

/** One movement of the account's tokens (`GET …/ledger`), with the balances after it. */
export interface LedgerEntry {
  entry_id: number;
  account_id: string;
  kind: "credit" | "adjustment" | "reserve" | "commit" | "release" | "expire" | "grant_expire";
  amount: number;
  available_after: number;
  reserved_after: number;
  used_after: number;
  reservation_id: string | null;
  job_id: string | null;
  external_ref: string | null;
  reason: string | null;
  actor: string;
  created_at: string;
  grant_id: string | null;
  topup_rule_id: string | null;
}

/** A reservation: what `reserve`, `commit`, `release` and `extend` answer, and one
 * item of `GET …/reservations` (the reservations reader). */
export interface Reservation {
  reservation_id: string;
  account_id: string;
  request_id: string;
  amount: number;
  state: ReservationState;
  committed_amount: number;
  expires_at: string;
  job_id: string | null;
  created_at: string;
  resolved_at: string | null;
  draws: Array<{ grant_id: string; amount: number; [member: string]: unknown }>;
  [member: string]: unknown;
}

/** The reservations reader's items: the same shape as a reservation. */
export type ReservationView = Reservation;

export type GrantStatus = "active" | "depleted" | "expired";

/** A credit grant (`GET …/grants`): the tokens of one credit or positive adjustment. */
export interface Grant {
  grant_id: string;
  account_id: string;
  amount: number;
  remaining: number;
  reserved: number;
  expires_at: string | null;
  priority: number;
  status: GrantStatus;
  external_ref: string | null;
  created_at: string;
  expired_at: string | null;
  topup_rule_id: string | null;
}
