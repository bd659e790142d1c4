// Each line marked MISSPELLED must fail `tsc --strict` against the
// generated client: the statuses are enums now. run.sh checks that each
// fails, and that the file compiles once the misspelling is corrected.
import type { components, paths } from "./generated/schema.js";
import type { Event as ClientEvent } from "../../clients/typescript/src/models.js";
import type { EventView as HeyApiEvent } from "./generated/hey-api/types.gen.js";

type Job = components["schemas"]["JobView"];
type ListQuery = NonNullable<
  paths["/v1/accounts/{account_id}/jobs"]["get"]["parameters"]["query"]
>;

export function finished(job: Job): boolean {
  return job.status === "sucseeded"; // MISSPELLED
}

export const wanted: components["schemas"]["JobStatus"] = "sucseeded"; // MISSPELLED

export const query: ListQuery = { status: "sucseeded" }; // MISSPELLED

// Events are a union by `type` (issue 59): a misspelled type matches none.
type Event = components["schemas"]["EventView"];

export function lowAvailable(event: Event): number | null {
  return event.type === "account.balanse_low" ? event.data.balances.available : null; // MISSPELLED
}

export const lowType: Event["type"] = "account.balanse_low"; // MISSPELLED

// The TypeScript client's own union (clients/typescript): narrowed on
// `type`, `data` has that type's members and no other.

export function clientLow(event: ClientEvent): number | null {
  return event.type === "account.balance_low" ? event.data.balanses.available : null; // MISSPELLED
}

export function clientCredit(event: ClientEvent): number | null {
  return event.type === "account.balance_low" ? event.data.credit.amount : null; // MISSPELLED
}

// The same with the client @hey-api/openapi-ts generates.
export const heyApiType: HeyApiEvent["type"] = "account.balanse_low"; // MISSPELLED
