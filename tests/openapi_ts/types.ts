// Type-level assertions on the client openapi-typescript generates (issue
// 59): compiled by run.sh with tsc --strict; each line fails to compile on
// a document that types the member otherwise (the old document: optional
// `result`/`error`/`finished_at`, a numeric `Retry-After`, events with an
// open `data` map, one `Problem` for every status).
import type { components, paths } from "./generated/schema.js";

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
type Expect<T extends true> = T;

type Job = components["schemas"]["JobView"];
type Always = "result" | "error" | "finished_at";
type Page = components["schemas"]["EventPage"];
type Refused = paths["/v1/accounts/{account_id}/jobs"]["post"]["responses"][429];
type Unavailable = paths["/v1/accounts/{account_id}/jobs"]["post"]["responses"][503];
type Event = components["schemas"]["EventView"];
type Low = Extract<Event, { type: "account.balance_low" }>;
type Requested = Extract<Event, { type: "topup.requested" }>;
type Reserve = paths["/v1/accounts/{account_id}/reservations"]["post"]["responses"];
type Insufficient = Extract<
  Reserve[402]["content"]["application/problem+json"],
  { code: "insufficient_tokens" }
>;
type BudgetSpent = Extract<
  Reserve[402]["content"]["application/problem+json"],
  { code: "key_budget_exhausted" }
>;
type Busy = Extract<
  Reserve[429]["content"]["application/problem+json"],
  { code: "too_many_active_reservations" }
>;

// Narrowing by `type` types `data`: compiles only when each event type has
// its own schema.
export function available(event: Event): number | null {
  switch (event.type) {
    case "account.balance_low":
    case "account.balance_depleted":
      return event.data.balances.available;
    case "topup.requested":
      return event.data.request.tokens;
    case "endpoint.disabled":
      return null;
    default:
      return null;
  }
}

export type Checks = [
  // Always sent, null when empty: required and nullable, never undefined.
  Expect<Equal<Pick<Job, Always>, Required<Pick<Job, Always>>>>,
  Expect<Equal<Job["finished_at"], string | null>>,
  Expect<Equal<Job["result"], components["schemas"]["JobResult"] | null>>,
  Expect<Equal<Job["error"], components["schemas"]["JobError"] | null>>,
  Expect<Equal<Page["next_after"], string | null>>,
  // A header is text: Retry-After arrives as a string.
  Expect<Equal<NonNullable<Refused["headers"]["Retry-After"]>, string>>,
  Expect<Equal<NonNullable<Unavailable["headers"]["Retry-After"]>, string>>,
  // Events: one member per type, its data typed (balances on balance_low).
  Expect<Equal<Low["type"], "account.balance_low">>,
  Expect<Equal<Low["data"]["balances"], components["schemas"]["EventBalances"]>>,
  Expect<Equal<Low["data"]["balances"]["available"], number>>,
  Expect<Equal<Requested["data"]["request"], components["schemas"]["TopupFiringView"]>>,
  Expect<Equal<Event["type"], components["schemas"]["EventType"]>>,
  // Problems by status and code: a 402 carries available and reserved, a
  // 429 too_many_active_reservations its limit.
  Expect<Equal<Insufficient["code"], "insufficient_tokens">>,
  Expect<Equal<Insufficient["available"], number>>,
  Expect<Equal<Insufficient["reserved"], number>>,
  Expect<Equal<BudgetSpent["remaining"], number>>,
  Expect<Equal<BudgetSpent["resets_at"], string | null>>,
  Expect<Equal<Busy["max_active_reservations"], number>>,
];
