// CORS refusals named (docs/clients.md): a fetch a browser refuses for CORS
// rejects with the same TypeError as lost Wi-Fi. The client's two probes of
// /readyz (cors refused, no-cors answered) tell them apart. Here a fetch
// that behaves like a browser's on a refused origin; the real browser is
// tests/typescript/browser.py.
import assert from "node:assert/strict";
import { test } from "node:test";

import { CorsRefused, Kiosk, MemoryJournalStore, Unreachable } from "../dist/index.js";

const ACCOUNT = "3f0c4a4e-8a57-4a53-9a55-2f8c2b6b1e10";

/** A browser's fetch: `cors` requests refused (or all refused: offline), `no-cors` answered opaquely. */
function browserFetch({ corsAllowed, online }) {
  const calls = [];
  const fetcher = async (url, init) => {
    calls.push({ url, mode: init.mode ?? "cors", method: init.method });
    if (!online) throw new TypeError("Failed to fetch");
    if ((init.mode ?? "cors") === "no-cors") return new Response(null, { status: 200 });
    if (!corsAllowed) throw new TypeError("Failed to fetch");
    return new Response(JSON.stringify({ status: "ready" }), { status: 200 });
  };
  return { fetcher, calls };
}

const options = (fetcher, extra = {}) => ({
  baseUrl: "http://service.example",
  apiKey: "tbk_test",
  accountId: ACCOUNT,
  journal: new MemoryJournalStore(),
  fetch: fetcher,
  corsProbe: true,
  retry: { baseDelayMs: 10, maxDelayMs: 50 },
  ...extra,
});

test("a refused origin: open() rejects with CorsRefused at once, nothing but the probes sent", async () => {
  const { fetcher, calls } = browserFetch({ corsAllowed: false, online: true });
  const started = Date.now();
  await assert.rejects(Kiosk.open(options(fetcher)), (error) => {
    assert.ok(error instanceof CorsRefused, `${error}`);
    assert.equal(error.pending, false);
    assert.equal(error.baseUrl, "http://service.example");
    assert.match(error.message, /CORS_ALLOWED_ORIGINS/);
    return true;
  });
  assert.ok(Date.now() - started < 1_000);
  assert.deepEqual(calls.map((call) => [call.url, call.mode]).sort(), [
    ["http://service.example/readyz", "cors"],
    ["http://service.example/readyz", "no-cors"],
  ]);
});

test("offline at open: no CorsRefused; a call is Unreachable as before", async () => {
  const { fetcher } = browserFetch({ corsAllowed: false, online: false });
  const kiosk = await Kiosk.open(options(fetcher));
  await assert.rejects(kiosk.balance({ timeoutMs: 300 }), Unreachable);
  await kiosk.close();
});

test("CORS refused after an offline open: the first failing call names it, not retried until its deadline", async () => {
  const network = { online: false };
  const refused = browserFetch({ corsAllowed: false, online: true });
  const offline = browserFetch({ corsAllowed: false, online: false });
  const fetcher = (url, init) => (network.online ? refused.fetcher : offline.fetcher)(url, init);
  const kiosk = await Kiosk.open(options(fetcher));
  network.online = true;
  const started = Date.now();
  await assert.rejects(kiosk.balance({ timeoutMs: 30_000 }), CorsRefused);
  assert.ok(Date.now() - started < 2_000, `${Date.now() - started} ms`);
  await kiosk.close();
});

test("an allowed origin: one pair of probes at open, then none", async () => {
  const { fetcher, calls } = browserFetch({ corsAllowed: true, online: true });
  const kiosk = await Kiosk.open(options(fetcher));
  assert.equal(calls.length, 2);
  await kiosk.balance();
  assert.equal(calls.filter((call) => call.url.endsWith("/readyz")).length, 2);
  await kiosk.close();
});

test("outside a web page (Node), no probe by default", async () => {
  const { fetcher, calls } = browserFetch({ corsAllowed: false, online: true });
  const kiosk = await Kiosk.open(options(fetcher, { corsProbe: undefined }));
  assert.equal(calls.length, 0);
  await kiosk.close();
});
