// A kiosk process SIGKILLed at seeded points, restarted on the same journal
// until it finishes: every guest action it asked for becomes exactly one
// job, charged once, and the books agree. Like tests/client's kill points
// for the Python client. Needs a running service: TB_URL and TB_ADMIN_KEY
// (tests/typescript/run.sh starts one). KILL_RUNS (default 16), KILL_SEED
// (default 20261203), KILL_PARALLEL (default 4).
//
// Then the reservation calls: KILL_RESERVATION_RUNS (default 8) runs of
// three actions (reserve, extend, then commit 1 token or release), each
// process killed before and after the send of each call (the first life of
// run r at the r-th of the 8 points, so every point is hit), restarted
// until it finishes: each action is one reservation, committed once or
// released, none left held, and the ledger agrees.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { test } from "node:test";

import { scratchJournal } from "./scratch.mjs";
import { admin, funded } from "./service.mjs";

const CHILD = new URL("./kiosk-process.mjs", import.meta.url).pathname;
const PHASES = ["before_send", "after_send", "during_long_poll", "after_finish", "random_instant"];
const ACTIONS = 3;
const RUNS = Number(process.env.KILL_RUNS ?? 16);
const SEED = Number(process.env.KILL_SEED ?? 20261203);
const PARALLEL = Number(process.env.KILL_PARALLEL ?? 4);

/** mulberry32: a small seeded generator, so a failing run can be replayed. */
function random(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function life(environment, randomKillMs) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [CHILD], { env: environment, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout.on("data", (chunk) => (out += chunk));
    child.stderr.on("data", (chunk) => (err += chunk));
    const timer = randomKillMs === null ? null : setTimeout(() => child.kill("SIGKILL"), randomKillMs);
    // "close", not "exit": exit can come before the last of stdout is read
    // (a kill event lost, December 7's CI); close waits for the pipes.
    child.on("close", (code, signal) => {
      if (timer !== null) clearTimeout(timer);
      const lines = out.split("\n").filter(Boolean).map((line) => JSON.parse(line));
      resolve({ code, signal, lines, err });
    });
  });
}

async function run(index, draw) {
  const account = await funded(20, `kill run ${index}`);
  const journal = await scratchJournal("tb-kill-");
  const delays = Array.from({ length: ACTIONS }, () => 100 + Math.floor(draw() * 700));
  const base = {
    ...process.env,
    TB_URL: process.env.TB_URL,
    KIOSK_KEY: account.key,
    ACCOUNT: account.id,
    JOURNAL: journal,
    DELAYS_MS: delays.join(","),
  };
  const kills = [];
  let final = null;
  for (let lifeNumber = 0; lifeNumber < 8 && final === null; lifeNumber += 1) {
    const killing = lifeNumber < 3;
    const phase = killing ? PHASES[Math.floor(draw() * PHASES.length)] : "none";
    const target = 1 + Math.floor(draw() * 2);
    const ms = Math.floor(draw() * 400);
    const randomKill = phase === "random_instant" ? 50 + Math.floor(draw() * 1500) : null;
    const result = await life({ ...base, KILL: phase === "random_instant" ? "none" : `${phase}:${target}:${ms}` }, randomKill);
    const last = result.lines.at(-1);
    if (result.code === 0 && last?.event === "done") {
      final = last;
    } else if (result.signal === "SIGKILL") {
      kills.push(phase);
    } else {
      assert.fail(`run ${index} life ${lifeNumber} (${phase}) ended ${result.code}/${result.signal}: ${result.err}`);
    }
  }
  assert.ok(final !== null, `run ${index} never finished`);
  // The books: exactly one job per action, each in the journal, charged once.
  const jobs = await admin("GET", `/v1/accounts/${account.id}/jobs?limit=500`);
  const journaled = new Map(final.journal.map((entry) => [entry.request_id, entry]));
  assert.equal(final.journal.length, ACTIONS, `run ${index}: one journal entry per action`);
  assert.deepEqual(new Set(final.journal.map((entry) => entry.action)), new Set([0, 1, 2]));
  assert.ok(final.journal.every((entry) => entry.state === "done"), `run ${index}: ${JSON.stringify(final.journal)}`);
  assert.equal(jobs.jobs.length, ACTIONS, `run ${index}: ${jobs.jobs.length} jobs for ${ACTIONS} actions`);
  for (const job of jobs.jobs) {
    assert.ok(journaled.has(job.request_id), `run ${index}: job ${job.request_id} is not the journal's`);
    assert.equal(job.status, "succeeded");
  }
  const balance = await admin("GET", `/v1/accounts/${account.id}`);
  assert.equal(balance.used, ACTIONS, `run ${index}: used ${balance.used}`);
  assert.equal(balance.reserved, 0);
  assert.equal(balance.available, 20 - ACTIONS);
  return kills;
}

test(`kiosk processes SIGKILLed at seeded points charge every guest action once (${RUNS} runs, seed ${SEED})`, async () => {
  const draw = random(SEED);
  const plans = Array.from({ length: RUNS }, (_, index) => random(Math.floor(draw() * 2 ** 31) + index));
  const kills = [];
  for (let start = 0; start < RUNS; start += PARALLEL) {
    const batch = plans.slice(start, start + PARALLEL).map((plan, offset) => run(start + offset, plan));
    for (const killed of await Promise.all(batch)) kills.push(...killed);
  }
  const counts = Object.fromEntries(PHASES.map((phase) => [phase, kills.filter((kill) => kill === phase).length]));
  console.log(`kill points: ${kills.length} SIGKILLs in ${RUNS} runs, ${RUNS * ACTIONS} guest actions: ${JSON.stringify(counts)}`);
  assert.ok(kills.length >= RUNS, `only ${kills.length} kills landed`);
  for (const phase of ["before_send", "after_send", "during_long_poll"]) {
    assert.ok(counts[phase] > 0, `no kill ${phase}: raise KILL_RUNS`);
  }
});

const RESERVATION_RUNS = Number(process.env.KILL_RESERVATION_RUNS ?? 8);
const CALLS = ["reserve", "extend", "commit", "release"];
const POINTS = ["before_send", "after_send"].flatMap((phase) => CALLS.map((call) => `${phase}:${call}`));
const RESERVATION_CREDIT = 1_100;

async function reservationRun(index) {
  const account = await funded(RESERVATION_CREDIT, `kill reservations ${index}`);
  const journal = await scratchJournal("tb-kill-res-");
  const base = {
    ...process.env,
    KIOSK_KEY: account.key,
    ACCOUNT: account.id,
    JOURNAL: journal,
    WORKLOAD: "reservations",
    DELAYS_MS: Array(ACTIONS).fill(0).join(","),
  };
  // Life 0 runs every action from scratch, so its point is always reached.
  const plan = [index, index + 3, index + 5].map((n) => `${POINTS[n % POINTS.length]}:1`);
  const kills = [];
  let final = null;
  for (let lifeNumber = 0; lifeNumber < 8 && final === null; lifeNumber += 1) {
    const result = await life({ ...base, KILL: plan[lifeNumber] ?? "none" }, null);
    const last = result.lines.at(-1);
    if (result.code === 0 && last?.event === "done") {
      final = last;
    } else if (result.signal === "SIGKILL" && last?.event === "kill") {
      kills.push(`${last.phase}:${last.call}`);
    } else {
      assert.fail(`reservations run ${index} life ${lifeNumber} (${plan[lifeNumber]}) ended ${result.code}/${result.signal}: ${result.err}`);
    }
  }
  assert.ok(final !== null, `reservations run ${index} never finished`);
  const where = `reservations run ${index} (kills ${kills.join(", ")})`;
  const reserves = final.journal.filter((entry) => entry.operation === "reserve");
  assert.deepEqual(reserves.map((entry) => entry.action).sort(), [0, 1, 2], `${where}: ${JSON.stringify(final.journal)}`);
  assert.ok(
    final.journal.every((entry) => entry.state === "done" || (entry.operation === "extend" && entry.state === "refused")),
    `${where}: open entries left: ${JSON.stringify(final.journal)}`,
  );
  const { reservations } = await admin("GET", `/v1/accounts/${account.id}/reservations?limit=500`);
  assert.deepEqual(
    reservations.map((r) => r.request_id).sort(),
    reserves.map((entry) => entry.request_id).sort(),
    `${where}: the service's reservations are not the journal's: ${JSON.stringify(reservations)}`,
  );
  for (const reservation of reservations) {
    const action = reservation.amount - 1000;
    const expected = action % 3 === 2 ? ["released", 0] : ["committed", 1];
    assert.deepEqual([reservation.state, reservation.committed_amount], expected, `${where}: ${JSON.stringify(reservation)}`);
  }
  const balance = await admin("GET", `/v1/accounts/${account.id}`);
  assert.deepEqual(
    [balance.used, balance.reserved, balance.available],
    [2, 0, RESERVATION_CREDIT - 2],
    `${where}: ${JSON.stringify(balance)}`,
  );
  // The ledger, reservation by reservation: reserved once, its commit (1
  // token or none) and the rest given back once, nothing expired.
  const { entries } = await admin("GET", `/v1/accounts/${account.id}/ledger?limit=1000`);
  for (const reservation of reservations) {
    const moved = { reserve: 0, commit: 0, release: 0, expire: 0 };
    for (const entry of entries.filter((e) => e.reservation_id === reservation.reservation_id)) {
      moved[entry.kind] = (moved[entry.kind] ?? 0) + entry.amount;
    }
    const { amount, committed_amount: committed } = reservation;
    assert.deepEqual(
      moved,
      { reserve: amount, commit: committed, release: amount - committed, expire: 0 },
      `${where}: ledger of ${reservation.reservation_id}`,
    );
  }
  assert.equal(entries.filter((e) => e.kind === "commit").length, 2, `${where}: two commits`);
  return kills;
}

test(`kiosk processes SIGKILLed before and after each reservation call settle each action once (${RESERVATION_RUNS} runs)`, async () => {
  const kills = [];
  for (let start = 0; start < RESERVATION_RUNS; start += PARALLEL) {
    const batch = [];
    for (let index = start; index < Math.min(RESERVATION_RUNS, start + PARALLEL); index += 1) batch.push(reservationRun(index));
    for (const killed of await Promise.all(batch)) kills.push(...killed);
  }
  const counts = Object.fromEntries(POINTS.map((point) => [point, kills.filter((kill) => kill === point).length]));
  console.log(`kill points (reservations): ${kills.length} SIGKILLs in ${RESERVATION_RUNS} runs, ${RESERVATION_RUNS * ACTIONS} guest actions: ${JSON.stringify(counts)}`);
  const missed = POINTS.filter((point) => counts[point] === 0);
  assert.deepEqual(missed, [], `no kill at ${missed}: KILL_RESERVATION_RUNS must be at least ${POINTS.length}`);
});
