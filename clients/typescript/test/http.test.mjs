// The retry rules (docs/clients.md) against a scripted HTTP server: what is
// retried, what never is, what stays pending.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";

import {
  Http,
  InsufficientTokens,
  KeyBudgetExhausted,
  RateLimited,
  TooManyActiveReservations,
  Unauthorized,
  Unreachable,
  ApiError,
} from "../dist/index.js";

/** A server answering each request with the next scripted step. */
async function scripted(steps) {
  const seen = [];
  const server = createServer((request, response) => {
    let body = "";
    request.on("data", (chunk) => (body += chunk));
    request.on("end", () => {
      seen.push({ method: request.method, url: request.url, body, authorization: request.headers.authorization });
      const step = steps[Math.min(seen.length - 1, steps.length - 1)];
      if (step === "cut") {
        response.socket.destroy();
        return;
      }
      if (step === "half") {
        response.writeHead(200, { "Content-Type": "application/json", "Content-Length": "100" });
        response.write('{"partial":');
        response.socket.destroy();
        return;
      }
      const [status, json, headers = {}] = step;
      response.writeHead(status, { "Content-Type": "application/json", ...headers });
      response.end(JSON.stringify(json));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${server.address().port}`;
  return { url, seen, close: () => new Promise((resolve) => server.close(resolve)) };
}

function http(url) {
  return new Http(url, "tbk_secret_key", {
    requestTimeoutMs: 2000,
    retry: { baseDelayMs: 10, maxDelayMs: 50, serverErrors: 3 },
    fetch: (input, init) => fetch(input, init),
    logger: { info() {}, warn() {} },
  });
}

const problem = (code, extra = {}) => ({ type: `urn:token-billing:problem:${code}`, title: code, status: 0, detail: code, code, ...extra });

test("transport errors, 503 with Retry-After, 502/504 and rate_limited are retried with the same body", async () => {
  const server = await scripted([
    "cut",
    "half",
    [503, problem("unavailable"), { "Retry-After": "0" }],
    [502, {}],
    [429, problem("rate_limited"), { "Retry-After": "0" }],
    [201, { ok: true }],
  ]);
  try {
    const started = Date.now();
    const [status, data] = await http(server.url).call("POST", "/v1/x", {
      deadline: Date.now() + 10_000,
      body: { request_id: "r1" },
      requestId: "r1",
    });
    assert.equal(status, 201);
    assert.deepEqual(data, { ok: true });
    assert.equal(server.seen.length, 6);
    assert.ok(server.seen.every((request) => request.body === '{"request_id":"r1"}'));
    assert.ok(server.seen.every((request) => request.authorization === "Bearer tbk_secret_key"));
    assert.ok(Date.now() - started < 5000);
  } finally {
    await server.close();
  }
});

test("refusals are never retried and are typed, with their fields", async () => {
  const cases = [
    [[402, problem("insufficient_tokens", { available: 1, reserved: 4 })], InsufficientTokens, (error) => {
      assert.equal(error.available, 1);
      assert.equal(error.reserved, 4);
    }],
    [[402, problem("key_budget_exhausted", { remaining: 3, resets_at: "2026-12-07T00:00:00.000000Z" })], KeyBudgetExhausted, (error) => {
      assert.equal(error.remaining, 3);
      assert.equal(error.resetsAt, "2026-12-07T00:00:00.000000Z");
    }],
    [[429, problem("too_many_active_reservations", { max_active_reservations: 2 }), { "Retry-After": "1" }], TooManyActiveReservations, (error) => {
      assert.equal(error.maxActiveReservations, 2);
      assert.equal(error.retryAfter, 1);
    }],
    [[400, problem("invalid_request")], ApiError, (error) => assert.equal(error.code, "invalid_request")],
    [[418, {}], ApiError, (error) => assert.equal(error.code, "http_418")],
    [[401, problem("unauthorized")], Unauthorized, (error) => assert.equal(error.pending, false)],
  ];
  for (const [step, Kind, check] of cases) {
    const server = await scripted([step, [200, {}]]);
    try {
      await assert.rejects(
        http(server.url).call("POST", "/v1/x", { deadline: Date.now() + 5000, body: {}, pendingOnGiveUp: true }),
        (error) => {
          assert.ok(error instanceof Kind, `${error.name} is a ${Kind.name}`);
          assert.equal(error.pending, false);
          check(error);
          return true;
        },
      );
      assert.equal(server.seen.length, 1, `${Kind.name} was sent once`);
    } finally {
      await server.close();
    }
  }
});

test("a 401 after an attempt that may have landed leaves the request pending", async () => {
  const server = await scripted([[503, problem("unavailable"), { "Retry-After": "0" }], [401, problem("unauthorized")]]);
  try {
    await assert.rejects(
      http(server.url).call("POST", "/v1/x", { deadline: Date.now() + 5000, body: {}, pendingOnGiveUp: true }),
      (error) => error instanceof Unauthorized && error.pending === true,
    );
  } finally {
    await server.close();
  }
});

test("500s: a few retries, then a give-up that stays pending", async () => {
  const server = await scripted([[500, problem("internal_error")]]);
  try {
    await assert.rejects(
      http(server.url).call("POST", "/v1/x", { deadline: Date.now() + 5000, body: {}, pendingOnGiveUp: true }),
      (error) => error instanceof ApiError && error.code === "internal_error" && error.pending === true,
    );
    assert.equal(server.seen.length, 4);
  } finally {
    await server.close();
  }
});

test("no answer before the deadline: Unreachable, pending; rate limits past it: RateLimited", async () => {
  const server = await scripted(["cut"]);
  try {
    await assert.rejects(
      http(server.url).call("POST", "/v1/x", { deadline: Date.now() + 300, body: {}, pendingOnGiveUp: true }),
      (error) => error instanceof Unreachable && error.pending === true,
    );
    assert.ok(server.seen.length >= 1);
  } finally {
    await server.close();
  }
  const limited = await scripted([[429, problem("rate_limited"), { "Retry-After": "5" }]]);
  try {
    await assert.rejects(
      http(limited.url).call("GET", "/v1/x", { deadline: Date.now() + 1000 }),
      (error) => error instanceof RateLimited && error.retryAfter === 5,
    );
    assert.equal(limited.seen.length, 1, "Retry-After past the deadline: not waited for");
  } finally {
    await limited.close();
  }
});
