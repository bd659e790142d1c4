// A small kiosk written against the client that openapi-typescript
// generates from the service's /openapi.json, with openapi-fetch as the
// transport. `tsc --strict` must compile it as it is; run.sh then runs it
// against the service: one guest action, charged once, replayed once.
import createClient from "openapi-fetch";
import type { components, paths } from "./generated/schema.js";

type Job = components["schemas"]["JobView"];
type JobStatus = components["schemas"]["JobStatus"];
type ProblemCode = components["schemas"]["ProblemCode"];
type EventType = components["schemas"]["EventType"];

const baseUrl = process.env.TB_URL ?? "";
const key = process.env.TB_KIOSK_KEY ?? "";
const accountId = process.env.TB_ACCOUNT_ID ?? "";

const client = createClient<paths>({
  baseUrl,
  headers: { Authorization: `Bearer ${key}` },
});

const FINAL: readonly JobStatus[] = ["succeeded", "failed"];

function describe(job: Job): string {
  switch (job.status) {
    case "queued":
    case "running":
      return `still ${job.status}`;
    case "succeeded":
      // `result` is a JobResult: its `output` is the provider's, any JSON.
      return `image ${JSON.stringify(job.result?.output)}`;
    case "failed":
      // `error` is a JobError: `code` and `message` are always there.
      return `failed: ${job.error?.code ?? "?"} (${job.error?.message ?? ""})`;
  }
}

async function generate(prompt: string): Promise<Job> {
  const requestId = crypto.randomUUID();
  const body = {
    request_id: requestId,
    kind: "standard",
    // params is an open object: any members the provider takes.
    params: { prompt, style: { seed: 7, palette: ["warm", "soft"] } },
  };
  const path = { account_id: accountId };
  const first = await client.POST("/v1/accounts/{account_id}/jobs", {
    params: { path },
    body,
  });
  if (first.error) {
    const code: ProblemCode = first.error.code;
    throw new Error(`refused: ${code} ${first.error.detail}`);
  }
  if (first.response.status !== 201) {
    throw new Error(`expected 201, got ${first.response.status}`);
  }
  // A retry after a lost answer: the same request_id replays, charges nothing.
  const again = await client.POST("/v1/accounts/{account_id}/jobs", {
    params: { path },
    body,
  });
  if (again.error || again.response.headers.get("Idempotent-Replayed") !== "true") {
    throw new Error(`the retry was not a replay (${again.response.status})`);
  }
  let job: Job = first.data;
  while (!FINAL.includes(job.status)) {
    const waited = await client.GET("/v1/accounts/{account_id}/jobs/{request_id}", {
      params: { path: { account_id: accountId, request_id: requestId }, query: { wait_seconds: 30 } },
    });
    if (waited.error) {
      throw new Error(`reading the job: ${waited.error.code}`);
    }
    job = waited.data;
  }
  return job;
}

async function main(): Promise<void> {
  const before = await client.GET("/v1/accounts/{account_id}", {
    params: { path: { account_id: accountId } },
  });
  if (before.error) throw new Error(before.error.code);
  const job = await generate("a lighthouse at dusk");
  console.log(`kiosk: ${describe(job)}, cost ${job.cost}, attempts ${job.attempts}`);
  const after = await client.GET("/v1/accounts/{account_id}", {
    params: { path: { account_id: accountId } },
  });
  if (after.error) throw new Error(after.error.code);
  // Without `as_of` the answer is the account itself, not balances at an instant.
  if (!("status" in after.data)) throw new Error("expected the account view");
  const status: components["schemas"]["AccountStatus"] = after.data.status;
  const charged = before.data.available - after.data.available;
  const topUps: EventType = "credit.created";
  const feed = await client.GET("/v1/events", {
    params: { query: { type: topUps, account_id: accountId } },
  });
  if (feed.error) throw new Error(feed.error.code);
  const succeeded = await client.GET("/v1/accounts/{account_id}/jobs", {
    params: { path: { account_id: accountId }, query: { status: "succeeded" } },
  });
  if (succeeded.error) throw new Error(succeeded.error.code);
  console.log(
    `kiosk: account ${status}, charged ${charged}, ${feed.data.events.length} top-up event(s), ` +
      `${succeeded.data.jobs.length} succeeded job(s)`,
  );
  if (job.status !== "succeeded" || charged !== job.cost || feed.data.events.length < 1) {
    throw new Error("the guest action was not charged exactly once");
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
