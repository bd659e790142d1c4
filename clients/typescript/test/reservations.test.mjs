// Reservations against the real service (tests/typescript/run.sh starts
// it): reserve once per request_id, commit/release/extend, resume() hands
// back what is still held, refusals typed, and the heartbeat keeps a short
// reservation alive past its TTL. (Kill points: kill-points.test.mjs.)
import assert from "node:assert/strict";
import { test } from "node:test";

import { InsufficientTokens, Kiosk, ReservationNotHeld } from "../dist/index.js";
import { FileJournalStore } from "../dist/node.js";
import { scratchJournal } from "./scratch.mjs";
import { admin, funded, serviceUrl } from "./service.mjs";

async function kiosk(account, path) {
  return Kiosk.open({
    baseUrl: serviceUrl,
    apiKey: account.key,
    accountId: account.id,
    journal: await FileJournalStore.open(path),
    timeoutMs: 30_000,
    retry: { baseDelayMs: 20, maxDelayMs: 200 },
  });
}

test("reserve once per request_id; commit, release, extend; resume() hands back what is held", async () => {
  const account = await funded(100, "ts reservations");
  const path = await scratchJournal("tb-res-");
  let booth = await kiosk(account, path);
  const requestId = crypto.randomUUID();
  const first = await booth.reserve(40, { requestId, ttlSeconds: 60 });
  const again = await booth.reserve(40, { requestId, ttlSeconds: 60 });
  assert.equal(again.reservation_id, first.reservation_id);
  assert.equal(first.state, "held");
  const extended = await booth.extend(first, 120);
  assert.ok(Date.parse(extended.expires_at) > Date.parse(first.expires_at));
  const other = await booth.reserve(10);
  await booth.close();

  // A restart: both are handed back held, and finished once.
  booth = await kiosk(account, path);
  const outcomes = await booth.resume();
  const held = outcomes.filter((outcome) => outcome.reservation?.state === "held");
  assert.deepEqual(
    held.map((outcome) => outcome.reservation.reservation_id).sort(),
    [first.reservation_id, other.reservation_id].sort(),
  );
  const committed = await booth.commit(first, { amount: 25 });
  assert.deepEqual([committed.state, committed.committed_amount], ["committed", 25]);
  const released = await booth.release(other.reservation_id);
  assert.equal(released.state, "released");
  await assert.rejects(booth.commit(other), (error) => error instanceof ReservationNotHeld && error.state === "released");
  await assert.rejects(booth.reserve(1000), (error) => error instanceof InsufficientTokens && error.available === 75);
  assert.deepEqual(await booth.pending(), []);
  assert.deepEqual(await booth.resume(), []);
  const balance = await admin("GET", `/v1/accounts/${account.id}`);
  assert.deepEqual([balance.available, balance.reserved, balance.used], [75, 0, 25]);
  await booth.close();
});

test("heartbeat: a 2 s reservation stays held past its TTL while it beats; stopped by a refusal", async () => {
  const account = await funded(10, "ts heartbeat");
  const booth = await kiosk(account, await scratchJournal("tb-beat-"));
  const reservation = await booth.reserve(3, { ttlSeconds: 2 });
  const heartbeat = booth.heartbeat(reservation, 2, { everyMs: 500 });
  // Polled: at least 6 beats is 3 s, past the first TTL.
  for (let waited = 0; heartbeat.beats < 6 && waited < 20_000; waited += 50) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  assert.ok(heartbeat.beats >= 6, `${heartbeat.beats} beats`);
  const now = await admin("GET", `/v1/accounts/${account.id}/reservations/${reservation.reservation_id}`);
  assert.equal(now.state, "held");
  assert.ok(Date.parse(now.created_at) + 2_000 < Date.now(), "not past the first TTL yet");
  // Released under it: the next beat is refused, and it stops.
  await booth.release(reservation);
  for (let waited = 0; heartbeat.error === null && waited < 5_000; waited += 50) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  assert.ok(heartbeat.error instanceof ReservationNotHeld, String(heartbeat.error));
  await heartbeat.stop();
  const balance = await admin("GET", `/v1/accounts/${account.id}`);
  assert.deepEqual([balance.available, balance.reserved], [10, 0]);
  await booth.close();
});
