// A kiosk process for the kill-point test: started, SIGKILLed at a chosen
// point, started again on the same journal, until it finishes its work.
//
// Each start: resume() first, then the guest actions 0 … COUNT-1 not yet in
// the journal, each one generate() with params {action, simulate}. The kill
// plan (KILL=phase:target:ms) is carried out by a fetch wrapper, the
// client's own `fetch` option, so the library is the one shipped:
//   before_send       the target-th job POST: killed after the journal
//                     write, before the request leaves;
//   after_send        the target-th job POST: the service has answered,
//                     killed before the answer is read;
//   during_long_poll  the target-th long poll: killed ms into it;
//   after_finish      the target-th long poll's answer arrived: killed
//                     before it is read.
// (random_instant kills come from the parent.) Prints JSON lines; the last,
// `done`, lists the journal. The key comes from the environment.
import { Kiosk } from "../dist/index.js";
import { FileJournalStore } from "../dist/node.js";

const env = process.env;
const emit = (event, fields = {}) => process.stdout.write(`${JSON.stringify({ event, ...fields })}\n`);
const [phase = "none", target = "0", ms = "0"] = (env.KILL ?? "none").split(":");
const die = () => process.kill(process.pid, "SIGKILL");

let posts = 0;
let polls = 0;
async function plannedFetch(url, init) {
  const isPost = init.method === "POST" && url.includes("/jobs");
  const isPoll = init.method === "GET" && url.includes("wait_seconds=");
  if (isPost) posts += 1;
  if (isPoll) polls += 1;
  if (phase === "before_send" && isPost && posts === Number(target)) die();
  if (phase === "during_long_poll" && isPoll && polls === Number(target)) setTimeout(die, Number(ms));
  const response = await fetch(url, init);
  if (phase === "after_send" && isPost && posts === Number(target)) die();
  if (phase === "after_finish" && isPoll && polls === Number(target)) die();
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
for (const outcome of resumed.values()) {
  if (outcome.error !== null) {
    emit("resume_error", { request_id: outcome.requestId, error: String(outcome.error) });
    process.exit(3);
  }
  emit("resumed", { request_id: outcome.requestId, status: outcome.job?.status ?? null });
}

const done = new Set((await kiosk.history(10_000)).map((entry) => entry.body.params.action));
for (let action = 0; action < delays.length; action += 1) {
  if (done.has(action)) continue;
  const job = await kiosk.generate("standard", { action, simulate: { delay_ms: delays[action] } });
  emit("generated", { action, request_id: job.request_id, status: job.status });
}
const journal = (await kiosk.history(10_000)).map((entry) => ({
  request_id: entry.request_id,
  state: entry.state,
  action: entry.body.params.action,
}));
emit("done", { journal });
await kiosk.close();
