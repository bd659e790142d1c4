// A kiosk process for the kill-point test: started, SIGKILLed at a chosen
// point, started again on the same journal, until it finishes its work.
//
// Each start: resume() first, then the guest actions 0 … COUNT-1 not yet in
// the journal. WORKLOAD=jobs (default): each one generate() with params
// {action, simulate}. WORKLOAD=reservations: each one reserve(1000 +
// action) (the amount names the action, so the journal alone says which
// were asked for), extend() it, then commit 1 token, or release it when
// action % 3 == 2; a reservation resume() hands back still held gets that
// same end. The kill plan (KILL=phase:target:ms) is carried out by a fetch
// wrapper, the client's own `fetch` option, so the library is the one
// shipped:
//   before_send       the target-th job POST: killed after the journal
//                     write, before the request leaves;
//   after_send        the target-th job POST: the service has answered,
//                     killed before the answer is read;
//   during_long_poll  the target-th long poll: killed ms into it;
//   after_finish      the target-th long poll's answer arrived: killed
//                     before it is read.
// For reservations, KILL=phase:call:target, call one of reserve, extend,
// commit, release (counted by URL, resume()'s own sends included) and
// phase before_send or after_send. Before dying it prints {"event":"kill"}.
// (random_instant kills come from the parent.) Prints JSON lines; the last,
// `done`, lists the journal. The key comes from the environment.
import { Kiosk } from "../dist/index.js";
import { FileJournalStore } from "../dist/node.js";

const env = process.env;
const emit = (event, fields = {}) => process.stdout.write(`${JSON.stringify({ event, ...fields })}\n`);
const workload = env.WORKLOAD ?? "jobs";
const plan = (env.KILL ?? "none").split(":");
const phase = plan[0] ?? "none";
const call = workload === "reservations" ? plan[1] : "job";
const [target = "0", ms = "0"] = workload === "reservations" ? plan.slice(2) : plan.slice(1);
const die = () => {
  emit("kill", { phase, call });
  process.kill(process.pid, "SIGKILL");
};

/** Which call a request is: job, poll, reserve, extend, commit, release, or null. */
function callOf(url, init) {
  if (init.method === "POST" && /\/jobs$/.test(url)) return "job";
  if (init.method === "GET" && url.includes("wait_seconds=")) return "poll";
  if (init.method !== "POST") return null;
  if (/\/reservations$/.test(url)) return "reserve";
  return /\/reservations\/[0-9a-f-]+\/(extend|commit|release)$/.exec(url)?.[1] ?? null;
}

const seen = {};
async function plannedFetch(url, init) {
  const kind = callOf(url, init);
  if (kind !== null) seen[kind] = (seen[kind] ?? 0) + 1;
  const hit = (wanted) => kind === wanted && seen[kind] === Number(target);
  if (phase === "before_send" && hit(call)) die();
  if (phase === "during_long_poll" && hit("poll")) setTimeout(die, Number(ms));
  const response = await fetch(url, init);
  if (phase === "after_send" && hit(call)) die();
  if (phase === "after_finish" && hit("poll")) die();
  return response;
}

const delays = env.DELAYS_MS.split(",").map(Number);
const kiosk = await Kiosk.open({
  baseUrl: env.TB_URL,
  apiKey: env.KIOSK_KEY,
  accountId: env.ACCOUNT,
  journal: await FileJournalStore.open(env.JOURNAL),
  timeoutMs: 60_000,
  retry: { baseDelayMs: 50, maxDelayMs: 500 },
  fetch: plannedFetch,
});

// resume() gives up after its one deadline; what it left pending settles
// in the background, and settled() waits for that.
const resumed = new Map();
for (const outcome of [...(await kiosk.resume()), ...(await kiosk.settled())]) {
  resumed.set(outcome.requestId, outcome);
}
const end = (action) => (action % 3 === 2 ? "release" : "commit");
const finish = (reservation, action) =>
  end(action) === "release" ? kiosk.release(reservation) : kiosk.commit(reservation, { amount: 1 });
for (const outcome of resumed.values()) {
  if (outcome.error !== null) {
    emit("resume_error", { request_id: outcome.requestId, error: String(outcome.error) });
    process.exit(3);
  }
  let state = outcome.reservation?.state ?? null;
  if (outcome.operation === "reserve" && state === "held") {
    state = (await finish(outcome.reservation, outcome.entry.body.amount - 1000)).state;
  }
  emit("resumed", { request_id: outcome.requestId, operation: outcome.operation, status: outcome.job?.status ?? null, state });
}

const actionOf = (entry) =>
  entry.operation === "job" ? entry.body.params.action : entry.operation === "reserve" ? entry.body.amount - 1000 : null;
const done = new Set((await kiosk.history(10_000)).map(actionOf).filter((action) => action !== null));
for (let action = 0; action < delays.length; action += 1) {
  if (done.has(action)) continue;
  if (workload === "jobs") {
    const job = await kiosk.generate("standard", { action, simulate: { delay_ms: delays[action] } });
    emit("generated", { action, request_id: job.request_id, status: job.status });
  } else {
    const reservation = await kiosk.reserve(1000 + action, { ttlSeconds: 60 });
    await kiosk.extend(reservation, 120);
    const ended = await finish(reservation, action);
    emit("ended", { action, request_id: reservation.request_id, state: ended.state });
  }
}
const journal = (await kiosk.history(10_000)).map((entry) => ({
  request_id: entry.request_id,
  operation: entry.operation,
  reservation_id: entry.reservation_id ?? null,
  state: entry.state,
  action: actionOf(entry),
}));
emit("done", { journal });
await kiosk.close();
