// The client against the real service (tests/typescript/run.sh starts it):
// a guest action charged once however often it is asked, a journaled
// request that never left sent by resume(), typed refusals, and watch().
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  InsufficientTokens,
  Journal,
  Kiosk,
  TooManyActiveReservations,
  Unreachable,
  isTerminal,
} from "../dist/index.js";
import { FileJournalStore } from "../dist/node.js";
import { scratchJournal } from "./scratch.mjs";
import { admin, funded, serviceUrl } from "./service.mjs";

async function visible(accountId) {
  for (let attempt = 0; attempt < 200; attempt += 1) {
    const page = await admin("GET", `/v1/events?account_id=${accountId}`);
    if (page.events.length > 0) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`no event of ${accountId} in the feed after 10 s`);
}

async function kiosk(account, path, options = {}) {
  return Kiosk.open({
    baseUrl: serviceUrl,
    apiKey: account.key,
    accountId: account.id,
    journal: await FileJournalStore.open(path ?? (await scratchJournal("tb-kiosk-"))),
    timeoutMs: 30_000,
    retry: { baseDelayMs: 20, maxDelayMs: 200 },
    ...options,
  });
}

test("generate: one job per request_id, charged once, its output and its journal entry", async () => {
  const account = await funded(5, "ts generate");
  const booth = await kiosk(account);
  const requestId = crypto.randomUUID();
  const job = await booth.generate("standard", { prompt: "a lighthouse" }, { requestId });
  assert.equal(job.status, "succeeded");
  assert.equal(job.request_id, requestId);
  assert.ok(job.result !== null && job.result.output !== undefined);
  const again = await booth.generate("standard", { prompt: "a lighthouse" }, { requestId });
  assert.equal(again.job_id, job.job_id);
  const balance = await booth.balance();
  assert.equal(balance.used, 1);
  assert.equal(balance.available, 4);
  assert.deepEqual(await booth.pending(), []);
  const [entry] = await booth.history();
  assert.equal(entry.request_id, requestId);
  assert.equal(entry.state, "done");
  await booth.close();
});

test("resume: a request journaled but never sent is sent with its own id, charged once", async () => {
  const account = await funded(5, "ts resume");
  const path = await scratchJournal("tb-kiosk-");
  // A process that died right after its journal write: the entry alone.
  const store = await FileJournalStore.open(path);
  const requestId = crypto.randomUUID();
  await new Journal(store).begin(requestId, "job", account.id, {
    request_id: requestId,
    kind: "standard",
    params: { prompt: "left behind" },
  });
  await store.close();
  const booth = await kiosk(account, path);
  assert.equal((await booth.pending()).length, 1);
  const [outcome] = await booth.resume();
  assert.equal(outcome.error, null);
  assert.equal(outcome.requestId, requestId);
  assert.ok(outcome.job !== null && isTerminal(outcome.job));
  assert.deepEqual(await booth.pending(), []);
  assert.deepEqual(await booth.resume(), []);
  const jobs = await admin("GET", `/v1/accounts/${account.id}/jobs`);
  assert.deepEqual(jobs.jobs.map((job) => job.request_id), [requestId]);
  await booth.close();
});

test("refusals are typed and change nothing; the same request_id may be sent again", async () => {
  const empty = await funded(0, "ts empty");
  const booth = await kiosk(empty);
  const requestId = crypto.randomUUID();
  await assert.rejects(booth.generate("standard", { prompt: "x" }, { requestId }), (error) => {
    assert.ok(error instanceof InsufficientTokens);
    assert.equal(error.available, 0);
    assert.equal(error.reserved, 0);
    assert.equal(error.pending, false);
    return true;
  });
  assert.deepEqual(await booth.pending(), []);
  await admin("POST", `/v1/accounts/${empty.id}/credits`, { amount: 1, external_ref: `ts-${crypto.randomUUID()}` });
  const job = await booth.generate("standard", { prompt: "x" }, { requestId });
  assert.equal(job.status, "succeeded");
  await booth.close();

  const limited = await funded(5, "ts limited", 1);
  const first = await kiosk(limited);
  const second = await kiosk(limited);
  const slow = await first.submit("standard", { simulate: { delay_ms: 3000 } });
  await assert.rejects(second.generate("standard", { prompt: "y" }), (error) => {
    assert.ok(error instanceof TooManyActiveReservations);
    assert.equal(error.maxActiveReservations, 1);
    assert.equal(error.retryAfter, 1);
    return true;
  });
  assert.equal((await first.wait(slow.request_id)).status, "succeeded");
  await first.close();
  await second.close();
});

test("unreachable: pending, kept in the journal, finished by the next resume", async () => {
  const account = await funded(5, "ts unreachable");
  const path = await scratchJournal("tb-kiosk-");
  const offline = await kiosk(account, path, {
    baseUrl: "http://127.0.0.1:9",
    timeoutMs: 500,
  });
  await assert.rejects(offline.generate("standard", { prompt: "offline" }), (error) => {
    assert.ok(error instanceof Unreachable);
    assert.equal(error.pending, true);
    return true;
  });
  assert.equal((await offline.pending()).length, 1);
  await offline.close();
  const online = await kiosk(account, path);
  const [outcome] = await online.resume();
  assert.equal(outcome.job?.status, "succeeded");
  assert.equal((await online.balance()).used, 1);
  await online.close();
});

test("watch: a top-up reaches a watching booth at once; nothing older, nothing of another account", async () => {
  const account = await funded(3, "ts watch");
  const other = await funded(1, "ts watch other");
  const booth = await kiosk(account);
  // The feed shows an event once no earlier transaction can still commit:
  // wait until the first credit is in it, so that "from now on" is after it.
  await visible(account.id);
  const feed = await booth.watch({ types: ["credit.created"] });
  await admin("POST", `/v1/accounts/${other.id}/credits`, { amount: 7, external_ref: `ts-${crypto.randomUUID()}` });
  const started = Date.now();
  await admin("POST", `/v1/accounts/${account.id}/credits`, { amount: 5, external_ref: `ts-${crypto.randomUUID()}` });
  const { value: event } = await feed.next();
  const took = Date.now() - started;
  assert.equal(event.type, "credit.created");
  assert.equal(event.data.account_id, account.id);
  assert.equal(event.data.credit.amount, 5);
  assert.ok(took < 5000, `the top-up took ${took} ms`);
  await feed.return();
  const fromStart = await booth.watch({ types: ["credit.created"], fromStart: true });
  const { value: first } = await fromStart.next();
  assert.equal(first.data.credit.amount, 3);
  await fromStart.return();
  await booth.close();
});

test("top-ups: a sold-out booth knows a request is open and from which rule; watch from an instant", async () => {
  const account = await funded(3, "ts topups");
  const booth = await kiosk(account);
  assert.deepEqual(await booth.topupRules(), []);
  const rule = await admin("POST", `/v1/accounts/${account.id}/topup-rules`, {
    trigger: "threshold", threshold_tokens: 2, method: "fixed", tokens: 10, mode: "request",
  });
  const armed = await booth.topupState();
  assert.deepEqual(armed.armed.map((r) => r.rule_id), [rule.rule_id]);
  assert.equal(armed.openRequest, null);
  const before = new Date();
  for (let n = 0; n < 3; n += 1) await booth.generate("standard", { prompt: `guest ${n}` });
  await assert.rejects(booth.generate("standard", { prompt: "one too many" }), InsufficientTokens);
  const started = Date.now();
  const state = await booth.topupState();
  const learned = Date.now() - started;
  console.log(`topups: a sold-out booth learned of the open request in ${learned} ms`);
  assert.ok(learned < 1000, `${learned} ms`);
  assert.ok(state.onItsWay);
  assert.equal(state.openRequest?.rule.rule_id, rule.rule_id);
  assert.equal(state.openRequest?.rule.status, "request_open");
  assert.equal(state.openRequest?.firing.state, "open");
  assert.equal(state.openRequest?.firing.tokens, 10);
  // watch({since}): the request's event, though it came before the watch.
  const since = await booth.watch({ types: ["topup.requested"], since: before, waitSeconds: 5 });
  const { value: requested } = await since.next();
  assert.equal(requested.type, "topup.requested");
  await since.return();
  await assert.rejects(booth.watch({ after: requested.id, fromStart: true }), TypeError);
  await booth.close();
});
