// verifyWebhook against the service's own deliveries (a real endpoint, a
// real HTTP receiver of the test's own, the service started by
// tests/typescript/run.sh with WEBHOOK_ALLOW_PRIVATE_URLS=true) and against
// an independent implementation of Standard Webhooks (the `standardwebhooks`
// package), both ways.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { createServer } from "node:http";
import { after, before, test } from "node:test";

import standardwebhooks from "standardwebhooks";

import { WEBHOOK_TOLERANCE_SECONDS, WebhookVerificationError, verifyWebhook } from "../dist/index.js";
import { admin, funded } from "./service.mjs";

const { Webhook } = standardwebhooks;

// The receiver: every delivery's raw body and headers, answered 204.
const deliveries = [];
const waiters = [];
const receiver = createServer((request, response) => {
  const chunks = [];
  request.on("data", (chunk) => chunks.push(chunk));
  request.on("end", () => {
    deliveries.push({ body: Buffer.concat(chunks), headers: request.headers });
    response.writeHead(204).end();
    for (const wake of waiters.splice(0)) wake();
  });
});
let receiverUrl;

before(async () => {
  await new Promise((resolve) => receiver.listen(0, "127.0.0.1", resolve));
  receiverUrl = `http://127.0.0.1:${receiver.address().port}/hook`;
});
after(() => new Promise((resolve) => receiver.close(resolve)));

/** The first delivery whose body's event matches, waiting up to 60 s (else fails with `attempts()`). */
async function delivery(matches, attempts) {
  const deadline = Date.now() + 60_000; // the feed's horizon: another session's open transaction delays it
  for (;;) {
    const found = deliveries.find((d) => matches(JSON.parse(d.body.toString("utf8"))));
    if (found) return found;
    const left = deadline - Date.now();
    if (left <= 0) throw new Error(`no matching delivery within 60 s; the endpoint's attempts: ${JSON.stringify(await attempts())}`);
    await new Promise((resolve) => {
      const timer = setTimeout(resolve, left);
      waiters.push(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }
}

function randomSecret() {
  return `whsec_${randomBytes(24).toString("base64")}`;
}

async function refused(promise, reason) {
  await assert.rejects(promise, (error) => {
    assert.ok(error instanceof WebhookVerificationError, `${error}`);
    assert.equal(error.reason, reason);
    return true;
  });
}

test("webhooks: the service's deliveries verify; tampered, wrong-secret and stale ones are refused", async () => {
  const account = await funded(0, "webhook");
  const endpoint = await admin("POST", "/v1/webhook-endpoints", {
    url: receiverUrl,
    events: ["credit.created"],
    account_id: account.id,
  });
  assert.match(endpoint.secret, /^whsec_/);
  const credit = async (amount) => {
    const ref = `ts-webhook-${crypto.randomUUID()}`;
    await admin("POST", `/v1/accounts/${account.id}/credits`, { amount, external_ref: ref });
    return delivery(
      (event) => event.type === "credit.created" && event.data.credit?.external_ref === ref,
      () => admin("GET", `/v1/webhook-endpoints/${endpoint.endpoint_id}/deliveries`),
    );
  };

  const { body, headers } = await credit(7);
  const event = await verifyWebhook(body, headers, endpoint.secret);
  assert.equal(event.type, "credit.created");
  assert.equal(event.id, headers["webhook-id"]);
  assert.equal(event.data.account_id, account.id);
  assert.equal(event.data.credit.amount, 7);
  assert.equal(event.data.balances.available, 7);
  // The independent library accepts the service's signature too.
  assert.equal(new Webhook(endpoint.secret).verify(body, headers).id, event.id);
  // The same delivery as a fetch Request's Headers and the body as text.
  const fetchHeaders = new Headers(Object.entries(headers).filter(([, v]) => typeof v === "string"));
  assert.equal((await verifyWebhook(body.toString("utf8"), fetchHeaders, endpoint.secret)).id, event.id);

  const tampered = Buffer.from(body.toString("utf8").replace('"amount":7', '"amount":70'));
  assert.notDeepEqual(tampered, body);
  await refused(verifyWebhook(tampered, headers, endpoint.secret), "no_matching_signature");
  await refused(verifyWebhook(body, headers, randomSecret()), "no_matching_signature");
  const sent = Number(headers["webhook-timestamp"]) * 1000;
  const tolerance = WEBHOOK_TOLERANCE_SECONDS * 1000;
  assert.equal((await verifyWebhook(body, headers, endpoint.secret, { now: sent + tolerance - 1000 })).id, event.id);
  await refused(verifyWebhook(body, headers, endpoint.secret, { now: sent + tolerance + 1000 }), "timestamp_out_of_tolerance");
  await refused(verifyWebhook(body, headers, endpoint.secret, { now: sent - tolerance - 1000 }), "timestamp_out_of_tolerance");
  const { ["webhook-signature"]: _, ...unsigned } = headers;
  await refused(verifyWebhook(body, unsigned, endpoint.secret), "missing_header");
  await refused(verifyWebhook(body, { ...headers, "webhook-timestamp": "soon" }, endpoint.secret), "malformed_header");

  // A rotation: the service signs with both secrets; either one verifies.
  const rotated = await admin("POST", `/v1/webhook-endpoints/${endpoint.endpoint_id}/rotate-secret`);
  assert.notEqual(rotated.secret, endpoint.secret);
  const during = await credit(5);
  assert.equal(during.headers["webhook-signature"].split(" ").length, 2);
  for (const secret of [rotated.secret, endpoint.secret]) {
    const verified = await verifyWebhook(during.body, during.headers, secret);
    assert.equal(verified.data.credit.amount, 5);
  }
  await refused(verifyWebhook(during.body, during.headers, randomSecret()), "no_matching_signature");
  await admin("DELETE", `/v1/webhook-endpoints/${endpoint.endpoint_id}`);
});

test("webhooks: the standardwebhooks package and verifyWebhook agree, both ways", async () => {
  const secret = randomSecret();
  const library = new Webhook(secret);
  const id = crypto.randomUUID();
  const payload = JSON.stringify({
    id,
    type: "account.balance_low",
    created_at: new Date().toISOString(),
    data: { account_id: crypto.randomUUID(), balances: { available: 3, reserved: 0, used: 7, credited: 10, adjusted: 0 } },
  });
  const timestamp = new Date();
  const headers = {
    "webhook-id": id,
    "webhook-timestamp": String(Math.floor(timestamp.getTime() / 1000)),
    "webhook-signature": library.sign(id, timestamp, payload),
  };
  // The library signs; verifyWebhook accepts, and refuses a changed byte.
  const event = await verifyWebhook(payload, headers, secret);
  assert.equal(event.type, "account.balance_low");
  assert.equal(event.data.balances.available, 3);
  await refused(verifyWebhook(payload.replace('"available":3', '"available":4'), headers, secret), "no_matching_signature");
  // Signatures the library made with another secret before ours: any one that matches is enough.
  const other = new Webhook(randomSecret()).sign(id, timestamp, payload);
  const several = { ...headers, "webhook-signature": `${other} v2,ignored ${headers["webhook-signature"]}` };
  assert.equal((await verifyWebhook(payload, several, secret)).id, id);

  // The library and verifyWebhook agree on the same headers, and on a stale one.
  assert.deepEqual(library.verify(payload, headers), JSON.parse(payload));
  const stale = { ...headers, "webhook-timestamp": String(Math.floor(Date.now() / 1000) - WEBHOOK_TOLERANCE_SECONDS - 10) };
  stale["webhook-signature"] = library.sign(id, new Date(Number(stale["webhook-timestamp"]) * 1000), payload);
  assert.throws(() => library.verify(payload, stale));
  await refused(verifyWebhook(payload, stale, secret), "timestamp_out_of_tolerance");
});
