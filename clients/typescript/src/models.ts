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
  "grant.rolled_over",
  "topup.granted",
  "topup.requested",
  "topup.request_expired",
  "topup.cap_reached",
  "job.succeeded",
  "job.failed",
  "invariant.violated",
  "endpoint.disabled",
  "key.budget_low",
  "key.budget_exhausted",
] as const;

export type EventType = (typeof EVENT_TYPES)[number];

/** The account's balances after the movement an event reports. */
export interface EventBalances {
  available: number;
  reserved: number;
  used: number;
  credited: number;
  adjusted: number;
}

/** What every account event's `data` carries. */
export interface AccountEventData {
  account_id: string;
  balances: EventBalances;
  low_balance_threshold: number;
}

/** A credit (a top-up), as `POST …/credits` answered it. */
export interface Credit {
  credit_id: string;
  account_id: string;
  amount: number;
  external_ref: string;
  note: string | null;
  available: number;
  reserved: number;
  used: number;
  ledger_entry_id: number;
  grant_id: string;
  priority: number;
  expires_at: string | null;
  topup_rule_id: string | null;
  /** The grant's price in integer minor units of `currency`; null: unpriced. */
  amount_paid: number | null;
  currency: string | null;
  created_at: string;
}

/** An adjustment, as `POST …/adjustments` answered it. */
export interface Adjustment {
  adjustment_id: string;
  account_id: string;
  amount: number;
  reason: string;
  external_ref: string;
  available: number;
  reserved: number;
  used: number;
  ledger_entry_id: number;
  grant_id: string | null;
  priority: number | null;
  expires_at: string | null;
  /** A positive adjustment's grant's price (minor units); null: unpriced or a removal. */
  amount_paid: number | null;
  currency: string | null;
  created_at: string;
}

/** One check of the books that did not hold (`invariant.violated`). */
export interface Discrepancy {
  account_id: string;
  check: string;
  expected: number;
  actual: number;
}

/** The cap a top-up rule's firing would have passed (`topup.cap_reached`). */
export interface TopupCap {
  per: "day" | "month";
  /** `day:YYYY-MM-DD` or `month:YYYY-MM`, in the rule's time zone. */
  period: string;
  max_tokens: number;
  used_tokens: number;
  tokens: number;
}

/**
 * Each event type's `data`, as the service's /openapi.json types it
 * (`EventView`, one schema per type; tests/openapi_ts compares the two
 * under tsc, so they cannot drift).
 */
export interface EventData {
  "account.balance_low": AccountEventData & { entry: LedgerEntry | null };
  "account.balance_recovered": AccountEventData & { entry: LedgerEntry | null };
  "account.balance_depleted": AccountEventData & { entry: LedgerEntry };
  "credit.created": AccountEventData & { credit: Credit; entry: LedgerEntry };
  "adjustment.created": AccountEventData & { adjustment: Adjustment; entry: LedgerEntry };
  "reservation.expired": AccountEventData & { reservation: Reservation; entry: LedgerEntry };
  "grant.expired": AccountEventData & { grant_id: string; amount: number; grant: Grant; entry: LedgerEntry };
  "grant.expiring": AccountEventData & { grant_id: string; amount: number; expires_at: string; grant: Grant };
  "grant.rolled_over": AccountEventData & {
    grant_id: string;
    /** What the lapsed grant held; `tokens` = min(unused, max_tokens) carried. */
    unused: number;
    tokens: number;
    max_tokens: number;
    grant: Grant;
    credit: Credit;
  };
  "topup.granted": AccountEventData & { rule: TopupRule; firing: TopupFiring; credit: Credit };
  "topup.requested": AccountEventData & { rule: TopupRule; request: TopupFiring };
  "topup.request_expired": AccountEventData & {
    rule: TopupRule | null;
    request: TopupFiring;
    next: "ask_again" | "none";
  };
  "topup.cap_reached": AccountEventData & { rule: TopupRule; cap: TopupCap };
  "job.succeeded": AccountEventData & { job: Job };
  "job.failed": AccountEventData & { job: Job };
  "invariant.violated": { account_id: string; discrepancies: Discrepancy[] };
  "endpoint.disabled": {
    endpoint_id: string;
    /** `scheme://host[:port]/[redacted]`. */
    url: string;
    reason: string | null;
    failing_since: string | null;
    last_status_code: number | null;
    last_error: string | null;
  };
  "key.budget_low": KeyBudgetEventData;
  "key.budget_exhausted": KeyBudgetEventData;
}

/** A kiosk key's budget (`GET /v1/me`, the key list, `key.budget_*`). */
export interface KeyBudget {
  budget_tokens: number;
  budget_period: "day" | "week" | "month" | "total";
  budget_time_zone: string;
  budget_low_percent: number;
  /** Tokens the key's reservations hold or used in the current period. */
  spent: number;
  remaining: number;
  /** When the period's count starts again; null for `total`. */
  resets_at: string | null;
}

/** `key.budget_low` / `key.budget_exhausted`: which key, and its budget. */
export interface KeyBudgetEventData {
  account_id: string;
  key_id: string;
  label: string;
  budget: KeyBudget;
}

/** An event of one type: `data` typed by its `type`. */
export interface EventOf<T extends EventType> {
  id: string;
  type: T;
  created_at: string;
  data: EventData[T];
}

/**
 * One event of the feed or a webhook: a union discriminated by `type`,
 * so narrowing on `type` types `data` (`event.type === "account.balance_low"`
 * → `event.data.balances`).
 */
export type Event = { [T in EventType]: EventOf<T> }[EventType];

// EVENT_TYPES and EventData name the same types (a compile error otherwise).
type SameKeys<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
type Holds<T extends true> = T;
type EventDataCoversEventTypes = Holds<SameKeys<keyof EventData, EventType>>;

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
  /** The key whose request wrote the entry; null for the service's own movements. */
  api_key_id: string | null;
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
  /** The grants its tokens came from, in draw order (`grant_id` null only when the books do not balance). */
  draws: Array<{ grant_id: string | null; amount: number; [member: string]: unknown }>;
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
  /** What was paid for the grant, in integer minor units of `currency`; null: unpriced. */
  amount_paid: number | null;
  currency: string | null;
  /** The lapsed grant a rollover carried this one's tokens from; null otherwise. */
  rolled_over_from: string | null;
}
