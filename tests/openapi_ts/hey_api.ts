// The client @hey-api/openapi-ts generates from the service's /openapi.json
// (the second generator; run.sh generates it into
// generated/hey-api), compiled under tsc --strict with these assertions:
// events a union by `type` with every event type and `data` typed on
// narrowing, always-sent job members required and nullable, the feed's
// items that union, and a base URL typed as a URL.
import type { EventType } from "../../clients/typescript/src/models.js";
import type { ClientOptions, EventView, JobView, ListEventsResponses } from "./generated/hey-api/types.gen.js";
import { createClient } from "./generated/hey-api/client/index.js";
import { listEvents } from "./generated/hey-api/sdk.gen.js";

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
type Expect<T extends true> = T;

export function available(event: EventView): number | null {
  switch (event.type) {
    case "account.balance_low":
      return event.data.balances.available;
    case "topup.requested":
      return event.data.request.tokens;
    case "job.failed":
      return event.data.job.cost;
    default:
      return null;
  }
}

export type Checks = [
  Expect<Equal<EventView["type"], EventType>>,
  Expect<Equal<Extract<EventView, { type: "credit.created" }>["data"]["credit"]["amount"], number>>,
  Expect<Equal<JobView["finished_at"], string | null>>,
  Expect<Equal<ListEventsResponses[200]["events"][number], EventView>>,
];

// A kiosk's base URL is a URL (the document's `servers`), not `…://openapi.json`.
export const options: ClientOptions = { baseUrl: "https://billing.example.com" };

export async function lowEvents(apiKey: string): Promise<number[]> {
  const client = createClient({ baseUrl: options.baseUrl, headers: { Authorization: `Bearer ${apiKey}` } });
  const answer = await listEvents({ client, query: { type: "account.balance_low" } });
  return (answer.data?.events ?? []).map((event) => available(event) ?? 0);
}
