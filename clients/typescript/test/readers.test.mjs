// The list readers against the real service (tests/typescript/run.sh starts
// it): `for await` over the ledger, reservations, jobs and grants yields
// every item of every page once, in the service's order, following its
// cursor; a reader over the key's rate limit waits as Retry-After says.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Kiosk, MemoryJournalStore } from "../dist/index.js";
import { admin, funded, serviceUrl } from "./service.mjs";

async function kiosk(account, options = {}) {
  return Kiosk.open({
    baseUrl: serviceUrl,
    apiKey: account.key,
    accountId: account.id,
    journal: new MemoryJournalStore(),
    timeoutMs: 30_000,
    retry: { baseDelayMs: 20, maxDelayMs: 200 },
    ...options,
  });
}

async function collect(iterator) {
  const items = [];
  for await (const item of iterator) items.push(item);
  return items;
}

/** The whole list in one page, as the admin reads it. */
async function every(accountId, resource, member) {
  const page = await admin("GET", `/v1/accounts/${accountId}/${resource}?limit=500`);
  assert.equal(page.next_after, null);
  return page[member];
}

test("readers: every item of every page once, in order, from a cursor too", async () => {
  const account = await funded(5, "ts readers");
  for (let n = 0; n < 4; n += 1) {
    await admin("POST", `/v1/accounts/${account.id}/credits`, { amount: 3, external_ref: `ts-readers-${crypto.randomUUID()}` });
  }
  const booth = await kiosk(account);
  for (let n = 0; n < 3; n += 1) {
    assert.equal((await booth.generate("standard", { prompt: `guest ${n}` })).status, "succeeded");
  }
  const reservations = [];
  for (let n = 0; n < 4; n += 1) {
    const reservation = await admin("POST", `/v1/accounts/${account.id}/reservations`, {
      request_id: crypto.randomUUID(),
      amount: 1,
    });
    reservations.push(reservation.reservation_id);
  }
  await admin("POST", `/v1/accounts/${account.id}/reservations/${reservations[0]}/commit`, {});
  await admin("POST", `/v1/accounts/${account.id}/reservations/${reservations[1]}/release`, {});

  const ledger = await collect(booth.ledger({ pageSize: 2 }));
  const expectedLedger = (await every(account.id, "ledger", "entries")).map((entry) => entry.entry_id);
  assert.ok(expectedLedger.length > 6, String(expectedLedger.length));
  assert.deepEqual(
    ledger.map((entry) => entry.entry_id),
    expectedLedger,
  );

  const expectedReservations = (await every(account.id, "reservations", "reservations")).map((r) => r.reservation_id);
  assert.equal(expectedReservations.length, 7); // 3 jobs' and 4 of the admin's
  assert.deepEqual(
    (await collect(booth.reservations({ pageSize: 2 }))).map((r) => r.reservation_id),
    expectedReservations,
  );
  const held = (await every(account.id, "reservations", "reservations")).filter((r) => r.state === "held");
  assert.equal(held.length, 2);
  assert.deepEqual(
    (await collect(booth.reservations({ state: "held", pageSize: 1 }))).map((r) => r.reservation_id),
    held.map((r) => r.reservation_id),
  );

  const expectedJobs = (await every(account.id, "jobs", "jobs")).map((job) => job.job_id);
  assert.equal(expectedJobs.length, 3);
  assert.deepEqual(
    (await collect(booth.jobs({ pageSize: 2 }))).map((job) => job.job_id),
    expectedJobs,
  );

  const expectedGrants = (await every(account.id, "grants", "grants")).map((grant) => grant.grant_id);
  assert.equal(expectedGrants.length, 5);
  assert.deepEqual(
    (await collect(booth.grants({ pageSize: 2 }))).map((grant) => grant.grant_id),
    expectedGrants,
  );

  // From a cursor: what comes after it, nothing before.
  assert.deepEqual(
    (await collect(booth.ledger({ after: ledger[2].entry_id, pageSize: 3 }))).map((entry) => entry.entry_id),
    expectedLedger.slice(3),
  );
  await booth.close();
});

test("readers: over the key's rate limit, a reader waits as Retry-After says", async () => {
  const account = await funded(1, "ts readers rate");
  for (let n = 0; n < 10; n += 1) {
    await admin("POST", `/v1/accounts/${account.id}/credits`, { amount: 1, external_ref: `ts-readers-rate-${n}` });
  }
  const expected = (await every(account.id, "ledger", "entries")).map((entry) => entry.entry_id);
  assert.equal(expected.length, 11);
  // Other requests of the same key keep it over its rate limit (burst 100,
  // 50 a second) for 1.5 s: the reader's pages meet 429 rate_limited.
  let refused = 0;
  const until = Date.now() + 1_500;
  const hammer = async () => {
    while (Date.now() < until) {
      const response = await fetch(`${serviceUrl}/v1/accounts/${account.id}`, {
        headers: { Authorization: `Bearer ${account.key}` },
      });
      await response.arrayBuffer();
      if (response.status === 429) refused += 1;
    }
  };
  const hammers = Promise.all(Array.from({ length: 16 }, hammer));
  while (refused === 0 && Date.now() < until) await new Promise((resolve) => setImmediate(resolve));
  assert.ok(refused > 0, "the key is over its rate limit");
  const warnings = [];
  const booth = await kiosk(account, { logger: { info() {}, warn: (line) => warnings.push(line) } });
  const started = Date.now();
  const seen = (await collect(booth.ledger({ pageSize: 1 }))).map((entry) => entry.entry_id);
  console.log(`readers: 11 pages in ${Date.now() - started} ms, ${warnings.length} refusals waited out`);
  await hammers;
  assert.deepEqual(seen, expected);
  assert.ok(
    warnings.some((line) => line.includes(": 429, retrying")),
    `the reader met the rate limit and waited: ${warnings.slice(0, 3).join(" | ")}`,
  );
  await booth.close();
});
