// The file journal: durable entries that survive a reopen, a torn last
// line ignored, one process at a time, a dead owner's lock taken over,
// mode 0600, another body under the same request_id refused before sending.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { appendFile, readFile, stat, writeFile } from "node:fs/promises";
import { test } from "node:test";

import { IdempotencyKeyReused, Journal, JournalError } from "../dist/index.js";
import { FileJournalStore } from "../dist/node.js";
import { scratchJournal } from "./scratch.mjs";

const ACCOUNT = "7b7c5a52-2f43-4a2e-9a55-2f1d1c1e4b10";

test("entries survive a reopen; a refused one becomes pending again", async () => {
  const path = await scratchJournal("tb-journal-");
  let journal = new Journal(await FileJournalStore.open(path));
  const first = await journal.begin("11111111-1111-4111-8111-111111111111", "job", ACCOUNT, { kind: "standard", params: { a: 1, b: [1, 2] } });
  assert.equal(first.state, "pending");
  await journal.begin("22222222-2222-4222-8222-222222222222", "job", ACCOUNT, { kind: "standard", params: {} });
  await journal.record("22222222-2222-4222-8222-222222222222", "refused", { code: "insufficient_tokens" });
  await journal.close();

  journal = new Journal(await FileJournalStore.open(path));
  const open = await journal.open(ACCOUNT);
  assert.deepEqual(open.map((entry) => entry.request_id), ["11111111-1111-4111-8111-111111111111"]);
  // Key order does not make another request.
  const again = await journal.begin("11111111-1111-4111-8111-111111111111", "job", ACCOUNT, { params: { b: [1, 2], a: 1 }, kind: "standard" });
  assert.equal(again.created_at, first.created_at);
  const retried = await journal.begin("22222222-2222-4222-8222-222222222222", "job", ACCOUNT, { kind: "standard", params: {} });
  assert.equal(retried.state, "pending");
  await assert.rejects(
    journal.begin("11111111-1111-4111-8111-111111111111", "job", ACCOUNT, { kind: "standard", params: { a: 2 } }),
    IdempotencyKeyReused,
  );
  await journal.close();
  assert.equal((await stat(path)).mode & 0o777, 0o600);
});

test("a torn last line (a crash mid-append) is ignored; damage elsewhere is refused", async () => {
  const path = await scratchJournal("tb-journal-");
  const journal = new Journal(await FileJournalStore.open(path));
  await journal.begin("33333333-3333-4333-8333-333333333333", "job", ACCOUNT, { kind: "standard", params: {} });
  await journal.close();
  await appendFile(path, '{"request_id":"44444444-4444-4444-8444-44');
  const reopened = new Journal(await FileJournalStore.open(path));
  assert.deepEqual((await reopened.open(ACCOUNT)).map((entry) => entry.request_id), ["33333333-3333-4333-8333-333333333333"]);
  await reopened.close();
  const text = await readFile(path, "utf8");
  await writeFile(path, `garbage\n${text}`);
  await assert.rejects(FileJournalStore.open(path), JournalError);
});

test("one process at a time; a dead owner's lock is taken over", async () => {
  const path = await scratchJournal("tb-journal-");
  const store = await FileJournalStore.open(path);
  await assert.rejects(FileJournalStore.open(path), /already open in this process/);
  await store.close();

  // A live process holds it: refused.
  const holder = spawn(process.execPath, [
    "--input-type=module",
    "-e",
    `import { FileJournalStore } from ${JSON.stringify(new URL("../dist/node.js", import.meta.url).href)};
     await FileJournalStore.open(${JSON.stringify(path)});
     process.stdout.write("locked\\n");
     setInterval(() => {}, 1000);`,
  ]);
  await new Promise((resolve, reject) => {
    holder.stdout.on("data", (chunk) => String(chunk).includes("locked") && resolve());
    holder.on("exit", (code) => reject(new Error(`the holder exited ${code}`)));
  });
  await assert.rejects(FileJournalStore.open(path), /in use by process/);
  // SIGKILLed: its lock is left behind, and taken over.
  const exited = new Promise((resolve) => holder.on("exit", resolve));
  holder.kill("SIGKILL");
  await exited;
  const taken = await FileJournalStore.open(path);
  await taken.close();
});
