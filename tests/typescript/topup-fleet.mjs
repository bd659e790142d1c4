// A request-mode fleet: BOOTHS kiosks (default 20; in this process, or one
// process each with FLEET_PROCESSES=1), each with its own kiosk key, on
// ACCOUNTS accounts (default 1)
// whose threshold top-up rule is in mode `request` (docs/topups.md), run
// for FLEET_SECONDS (default 30). This process is also the host's billing
// system: it long-polls the feed for `topup.requested` and credits each
// request BILLING_DELAY_MS (default 1500) after it opened, with the
// request's id as `external_ref`. Each booth serves guests with `generate`
// as the README's loop does; on `InsufficientTokens` with nothing reserved
// elsewhere (sold out) it asks `topupState()` once (the README's advice;
// with `balance()` at the same time): an open request, or the request
// already answered (tokens back, or held by other booths: busy, not sold
// out). None of these (the rule fires only once the tokens it added are
// all committed): it watches the feed from the 402 on for
// `topup.requested` or `credit.created`. The time from the 402 to knowing
// is one sold-out episode's figure; the booth then waits on the feed for
// the credit and serves again.
//
// Prints the episodes' count, p50, p99 and max, and exits 1 when an
// episode never learned (within 5 s), when p99 exceeds P99_MAX_MS (default
// 1000), when there were fewer than MIN_EPISODES (default 20), or when the
// books do not agree (nothing reserved, used = the succeeded jobs' costs).
//
// Usage: node tests/typescript/topup-fleet.mjs   (TB_URL, TB_ADMIN_KEY: a
// running service, as tests/typescript/run.sh starts)
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

const env = process.env;
const url = env.TB_URL;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const LEARN_WITHIN_MS = 5_000;

if (process.argv[2] === "booth") {
  const emit = (event, fields) => process.stdout.write(`${JSON.stringify({ event, ...fields })}\n`);
  await booth({ account: env.ACCOUNT, key: env.KIOSK_KEY, journalDir: env.JOURNAL_DIR, until: Number(env.UNTIL) }, emit);
} else {
  await fleet();
}

/** One booth: serve guests until UNTIL (epoch ms); a JSON line per sold-out episode. */
async function booth(config, emit) {
  const dist = new URL("../../clients/typescript/dist/", import.meta.url);
  const { InsufficientTokens, Kiosk, TooManyActiveReservations } = await import(new URL("index.js", dist));
  const { FileJournalStore } = await import(new URL("node.js", dist));
  const retries = [];
  const kiosk = await Kiosk.open({
    baseUrl: url,
    apiKey: config.key,
    accountId: config.account,
    journal: await FileJournalStore.open(join(config.journalDir, "journal.jsonl")),
    timeoutMs: 30_000,
    logger: { info() {}, warn: (line) => (retries.push(line)) },
  });
  await kiosk.resume();
  const until = config.until;
  let served = 0;
  while (Date.now() < until) {
    try {
      await kiosk.generate("standard", { prompt: `guest ${served}` });
      served += 1;
    } catch (error) {
      if (error instanceof TooManyActiveReservations) {
        await sleep((error.retryAfter ?? 1) * 1000);
      } else if (error instanceof InsufficientTokens && error.reserved > 0) {
        await sleep(1000); // other booths hold the rest: "one moment" (the README's loop)
      } else if (error instanceof InsufficientTokens) {
        // Sold out: is a top-up on its way? One question (the README's
        // advice); when none is open yet (the rule waits for the last
        // commits of the tokens it added), the feed from the 402 on says
        // when it opens. Then the booth waits on the feed for the credit.
        const refusedAt = performance.now();
        const refusedWall = new Date();
        let learned = null;
        let how = null;
        let firing = null;
        // The two questions at once: the rules, and the balance (for a
        // request answered meanwhile).
        const [state, balance] = await Promise.all([kiosk.topupState(), kiosk.balance()]);
        const first =
          state.rules.map((rule) => `${rule.status}/${rule.unconsumed_tokens}`).join(",") +
          ` available ${balance.available} reserved ${balance.reserved}`;
        if (state.openRequest !== null) {
          [learned, how, firing] = [performance.now() - refusedAt, "request_open", state.openRequest.firing.firing_id];
        } else {
          if (balance.available > 0) {
            [learned, how] = [performance.now() - refusedAt, "credited"]; // answered meanwhile
          } else if (balance.reserved > 0) {
            // Answered meanwhile, and other booths hold its tokens now: the
            // booth is not sold out but busy ("one moment"); the rule asks
            // again once they are committed.
            [learned, how] = [performance.now() - refusedAt, "held_elsewhere"];
          }
        }
        if (learned === null || how === "request_open") {
          const stop = new AbortController();
          const timer = setTimeout(() => stop.abort(), LEARN_WITHIN_MS + 3_000);
          const feed = await kiosk.watch({
            since: refusedWall,
            types: ["topup.requested", "credit.created"],
            waitSeconds: 1,
            signal: stop.signal,
          });
          for await (const event of feed) {
            if (learned === null) {
              [learned, how] = [performance.now() - refusedAt, event.type];
              firing = event.data.request?.firing_id ?? null;
            }
            if (event.type === "credit.created") break;
          }
          clearTimeout(timer);
        }
        if (learned !== null && learned > LEARN_WITHIN_MS) learned = null;
        emit("sold_out", { ms: learned, how, firing, first, at: Date.now() });
      } else {
        throw error;
      }
    }
  }
  emit("served", { served, retries: retries.length, sample: retries.slice(0, 3) });
  await kiosk.close();
}

async function admin(method, path, body) {
  const response = await fetch(url + path, {
    method,
    headers: { Authorization: `Bearer ${env.TB_ADMIN_KEY}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`);
  return text === "" ? null : JSON.parse(text);
}

function percentile(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
}

async function fleet() {
  const booths = Number(env.BOOTHS ?? 20);
  const accounts = Number(env.ACCOUNTS ?? 1);
  const processes = env.FLEET_PROCESSES === "1";
  const seconds = Number(env.FLEET_SECONDS ?? 30);
  const billingDelayMs = Number(env.BILLING_DELAY_MS ?? 1_500);
  const p99Max = Number(env.P99_MAX_MS ?? 1_000);
  const minEpisodes = Number(env.MIN_EPISODES ?? 20);
  const made = [];
  for (let index = 0; index < accounts; index += 1) {
    const { account_id: id } = await admin("POST", "/v1/accounts", { name: `request-mode fleet ${index} ${crypto.randomUUID()}` });
    await admin("POST", `/v1/accounts/${id}/credits`, { amount: 10, external_ref: `fleet-start-${crypto.randomUUID()}` });
    await admin("POST", `/v1/accounts/${id}/topup-rules`, {
      trigger: "threshold", threshold_tokens: 5, method: "fixed", tokens: 10, mode: "request",
      max_tokens_per_day: 1_000_000,
    });
    made.push({ id });
  }
  const ids = new Set(made.map((account) => account.id));
  // A kiosk key per booth, as a fleet should have: the rate limit
  // (RATE_LIMIT_PER_SECOND) is per key, and 20 booths on one key meet 429s
  // whose Retry-After (1 s) delays a sold-out booth's question.
  const keys = [];
  for (let index = 0; index < booths; index += 1) {
    const account = made[index % accounts];
    const label = `request-mode fleet booth ${index}`;
    keys.push((await admin("POST", `/v1/accounts/${account.id}/api-keys`, { scope: "kiosk", label })).key);
  }

  // The billing system: every topup.requested of these accounts, credited after the delay.
  let billing = true;
  const requests = [];
  const credits = [];
  let cursor = (await admin("GET", "/v1/events?start=now&limit=1")).next_after ?? null;
  const biller = (async () => {
    while (billing) {
      const query = new URLSearchParams({ type: "topup.requested", wait_seconds: "1", limit: "100" });
      if (cursor !== null) query.set("after", cursor);
      else query.set("start", "now");
      const page = await admin("GET", `/v1/events?${query}`);
      for (const event of page.events) {
        cursor = event.id;
        if (!ids.has(event.data.account_id)) continue;
        const request = event.data.request;
        requests.push(request.firing_id);
        credits.push(
          sleep(billingDelayMs).then(() =>
            admin("POST", `/v1/accounts/${event.data.account_id}/credits`, {
              amount: request.tokens,
              external_ref: request.firing_id,
            }),
          ),
        );
      }
      if (typeof page.next_after === "string") cursor = page.next_after;
    }
  })();

  const scratch = await mkdtemp(join(tmpdir(), "tb-topup-fleet-"));
  await Promise.all(Array.from({ length: booths }, (_, index) => mkdir(join(scratch, `b${index}`))));
  const until = Date.now() + seconds * 1000;
  const self = fileURLToPath(import.meta.url);
  const lives = Array.from({ length: booths }, (_, index) => {
    const account = made[index % accounts];
    if (!processes) {
      // In this process: 20 kiosks on one event loop, each with its own
      // journal, waiting on the network nearly all the time.
      const lines = [];
      const config = { account: account.id, key: keys[index], journalDir: join(scratch, `b${index}`), until };
      return booth(config, (event, fields) => lines.push({ event, ...fields })).then(
        () => ({ index, code: 0, err: "", lines }),
        (error) => ({ index, code: 1, err: String(error?.stack ?? error), lines }),
      );
    }
    return new Promise((resolve) => {
      const child = spawn(process.execPath, [self, "booth"], {
        env: { ...env, ACCOUNT: account.id, KIOSK_KEY: keys[index], JOURNAL_DIR: join(scratch, `b${index}`), UNTIL: String(until) },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let out = "";
      let err = "";
      child.stdout.on("data", (chunk) => (out += chunk));
      child.stderr.on("data", (chunk) => (err += chunk));
      child.on("close", (code) => resolve({ index, code, err, lines: out.split("\n").filter(Boolean).map((line) => JSON.parse(line)) }));
    });
  });
  const results = await Promise.all(lives);
  billing = false;
  await biller;
  await Promise.all(credits);
  await rm(scratch, { recursive: true, force: true });

  const problems = [];
  for (const result of results) {
    if (result.code !== 0) problems.push(`booth ${result.index} exited ${result.code}: ${result.err.slice(-2000)}`);
  }
  const episodes = results.flatMap((result) => result.lines.filter((line) => line.event === "sold_out"));
  const served = results.flatMap((result) => result.lines.filter((line) => line.event === "served")).reduce((sum, line) => sum + line.served, 0);
  const never = episodes.filter((episode) => episode.ms === null);
  const times = episodes.filter((episode) => episode.ms !== null).map((episode) => episode.ms).sort((a, b) => a - b);
  const how = {};
  for (const episode of episodes) how[episode.how ?? "never"] = (how[episode.how ?? "never"] ?? 0) + 1;
  const fmt = (ms) => (ms === undefined ? "-" : `${ms.toFixed(1)} ms`);
  console.log(
    `topup fleet: ${booths} booths (${processes ? "a process each" : "in one process"}) on ${accounts} account(s) in mode request, ${seconds} s, billing answers after ${billingDelayMs} ms: ` +
      `${served} guests served, ${requests.length} top-up requests, ${episodes.length} sold-out episodes ` +
      `(${JSON.stringify(how)}); learned within p50 ${fmt(percentile(times, 50))}, p99 ${fmt(percentile(times, 99))}, max ${fmt(times.at(-1))}`,
  );
  if (env.FLEET_VERBOSE) {
    for (const line of results.flatMap((result) => result.lines.filter((l) => l.event === "served"))) console.log(JSON.stringify(line));
    for (const episode of episodes.filter((e) => e.ms === null || e.ms > p99Max)) console.log(JSON.stringify(episode));
  }
  if (never.length > 0) problems.push(`${never.length} of ${episodes.length} sold-out episodes never learned of a top-up within ${LEARN_WITHIN_MS} ms`);
  if (episodes.length < minEpisodes) problems.push(`only ${episodes.length} sold-out episodes (at least ${minEpisodes}): the fleet did not sell out`);
  if (times.length > 0 && percentile(times, 99) > p99Max) problems.push(`p99 ${percentile(times, 99).toFixed(1)} ms > ${p99Max} ms`);
  for (const account of made) {
    const balance = await admin("GET", `/v1/accounts/${account.id}`);
    const { jobs } = await admin("GET", `/v1/accounts/${account.id}/jobs?limit=500`);
    const cost = jobs.filter((job) => job.status === "succeeded").reduce((sum, job) => sum + job.cost, 0);
    if (balance.reserved !== 0 || balance.used !== cost) {
      problems.push(`account ${account.id}: reserved ${balance.reserved}, used ${balance.used}, succeeded jobs cost ${cost}`);
    }
  }
  if (problems.length > 0) {
    for (const problem of problems) console.error(`topup fleet: ${problem}`);
    process.exit(1);
  }
  console.log("topup fleet: ok");
}
