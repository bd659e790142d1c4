// Type-level assertions on the client openapi-typescript generates (issue
// 59): compiled by run.sh with tsc --strict; each line fails to compile on
// a document that types the member otherwise (the old document: optional
// `result`/`error`/`finished_at`, a numeric `Retry-After`).
import type { components, paths } from "./generated/schema.js";

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
type Expect<T extends true> = T;

type Job = components["schemas"]["JobView"];
type Always = "result" | "error" | "finished_at";
type Page = components["schemas"]["EventPage"];
type Refused = paths["/v1/accounts/{account_id}/jobs"]["post"]["responses"][429];
type Unavailable = paths["/v1/accounts/{account_id}/jobs"]["post"]["responses"][503];

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
];
