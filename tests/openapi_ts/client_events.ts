// The TypeScript client's `Event` union (clients/typescript/src/models.ts)
// against the one openapi-typescript generates from the service's
// /openapi.json, compiled by run.sh under tsc --strict: for every event
// type, the client's `data` has exactly the document's members (its open
// `additionalProperties` aside), and everything the document allows in
// each member fits the client's type. An event type, a member or a member
// type changed on one side only fails to compile here.
import type { EventData, EventType, Event as ClientEvent } from "../../clients/typescript/src/models.js";
import type { components } from "./generated/schema.js";

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
type Expect<T extends true> = T;
type Fits<From, To> = [From] extends [To] ? true : false;

type Generated = components["schemas"]["EventView"];
/** The members a schema names, without the index signature of `additionalProperties: true`. */
type Known<T> = { [K in keyof T as string extends K ? never : K]: T[K] };
type GeneratedData<T extends EventType> = Known<Extract<Generated, { type: T }>["data"]>;

/** The event types whose client `data` matches the document's; `never` when all do. */
type Drifted = {
  [T in EventType]: Equal<keyof EventData[T], keyof GeneratedData<T>> extends true
    ? Fits<GeneratedData<T>, EventData[T]> extends true
      ? never
      : T
    : T;
}[EventType];

/** Fails naming the event types that drifted. */
type NoneDrifted<T extends never> = T;

export type Checks = [
  Expect<Equal<EventType, Generated["type"]>>,
  Expect<Equal<ClientEvent["type"], Generated["type"]>>,
  NoneDrifted<Drifted>,
];

// Narrowing the client's union on `type` types `data`.
export function lowAvailable(event: ClientEvent): number | null {
  if (event.type === "account.balance_low") return event.data.balances.available;
  if (event.type === "credit.created") return event.data.credit.amount;
  return null;
}
