// A kiosk process SIGKILLed at seeded points, restarted on the same journal
// until it finishes: every guest action it asked for becomes exactly one
// job, charged once, and the books agree. Like tests/client's kill points
// for the Python client. Needs a running service: TB_URL and TB_ADMIN_KEY
// (tests/typescript/run.sh starts one). KILL_RUNS (default 16), KILL_SEED
// (default 20261203), KILL_PARALLEL (default 4).
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
    child.on("exit", (code, signal) => {
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
