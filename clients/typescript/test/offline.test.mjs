// A booth that boots without network (tests/typescript/run.sh starts the
// service): three presses left open in its journal, the venue's Wi-Fi down
// (a port where nothing answers, then a proxy to the service on it).
// resume() returns within its one deadline, so the first guest is served
// within 5 s of the start; when the network comes back the three presses
// settle in the background, one at a time, each charged once.
import assert from "node:assert/strict";
import { createServer, connect } from "node:net";
import { test } from "node:test";

import { Journal, Kiosk, RESUME_TIMEOUT_MS } from "../dist/index.js";
import { FileJournalStore } from "../dist/node.js";
import { scratchJournal } from "./scratch.mjs";
import { admin, funded, serviceUrl } from "./service.mjs";

/** A port nothing listens on yet, and a way to put a proxy to the service there. */
async function downNetwork() {
  const probe = createServer();
  await new Promise((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const { port } = probe.address();
  await new Promise((resolve) => probe.close(resolve));
  const target = new URL(serviceUrl);
  let proxy = null;
  return {
    url: `http://127.0.0.1:${port}`,
    async up() {
      proxy = createServer((client) => {
        const upstream = connect(Number(target.port), target.hostname);
        client.pipe(upstream).pipe(client);
        client.on("error", () => upstream.destroy());
        upstream.on("error", () => client.destroy());
      });
      await new Promise((resolve) => proxy.listen(port, "127.0.0.1", resolve));
    },
    async close() {
      if (proxy !== null) await new Promise((resolve) => proxy.close(resolve));
    },
  };
}

test("offline at boot: resume() returns within its deadline; the presses settle once when the network returns", async () => {
  const account = await funded(10, "ts offline");
  const path = await scratchJournal("tb-offline-");
  // Three presses a crash left open: journaled, never answered.
  const store = await FileJournalStore.open(path);
  const journal = new Journal(store);
  const presses = [];
  for (let n = 0; n < 3; n += 1) {
    const requestId = crypto.randomUUID();
    await journal.begin(requestId, "job", account.id, { request_id: requestId, kind: "standard", params: { prompt: `press ${n}` } });
    presses.push(requestId);
  }
  await store.close();

  const network = await downNetwork();
  const started = Date.now();
  const booth = await Kiosk.open({
    baseUrl: network.url,
    apiKey: account.key,
    accountId: account.id,
    journal: await FileJournalStore.open(path),
    retry: { baseDelayMs: 50, maxDelayMs: 500 },
  });
  const settledOnes = [];
  const outcomes = await booth.resume({ onSettled: (outcome) => settledOnes.push(outcome.requestId) });
  const ready = Date.now() - started;
  console.log(`offline: resume() returned after ${ready} ms with ${outcomes.length} presses pending`);
  assert.ok(ready < 5_000, `the first guest waited ${ready} ms (at most 5,000)`);
  assert.ok(ready < RESUME_TIMEOUT_MS + 2_000, `${ready} ms`);
  assert.deepEqual(outcomes.map((outcome) => outcome.error?.pending), [true, true, true]);
  assert.equal((await booth.pending()).length, 3);

  await network.up();
  const settled = await booth.settled();
  // One at a time, in the journal's order, each once.
  const order = outcomes.map((outcome) => outcome.requestId);
  assert.deepEqual([...order].sort(), [...presses].sort());
  assert.deepEqual(settled.map((outcome) => outcome.requestId), order);
  assert.deepEqual(settledOnes, order);
  for (const outcome of settled) {
    assert.equal(outcome.error, null, `${outcome.requestId}: ${outcome.error?.message}`);
    assert.equal(outcome.job?.status, "succeeded");
  }
  assert.deepEqual(await booth.pending(), []);
  // Each press is one job, charged once.
  const { jobs } = await admin("GET", `/v1/accounts/${account.id}/jobs`);
  assert.deepEqual(jobs.map((job) => job.request_id).sort(), [...presses].sort());
  const balance = await admin("GET", `/v1/accounts/${account.id}`);
  assert.equal(balance.used, 3);
  await booth.close();
  await network.close();
});
