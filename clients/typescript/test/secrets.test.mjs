// The client keeps its secrets: the key is in no printed or serialised form
// of a Kiosk (console.log, util.inspect, JSON.stringify, Object.keys), and
// the journal's files are the owner's alone, whatever was lying at the
// temporary path (a leftover readable by others, a link to another file).
import assert from "node:assert/strict";
import { lstat, readFile, stat, symlink, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { inspect } from "node:util";

import { Http, Kiosk, REDACTED_KEY } from "../dist/index.js";
import { FileJournalStore } from "../dist/node.js";
import { scratchJournal } from "./scratch.mjs";

const KEY = "tbk_0123456789abcdef0123456789abcdef_s3cr3t-never-printed-anywhere";
const SECRET = "s3cr3t-never-printed-anywhere";

test("a Kiosk and its Http show the key redacted, never the key", async () => {
  const path = await scratchJournal("secrets-");
  const kiosk = await Kiosk.open({
    baseUrl: "http://127.0.0.1:9",
    apiKey: KEY,
    accountId: "01a24609-4ff2-7444-903a-02cf3e9db5e9",
    journal: await FileJournalStore.open(path),
  });
  try {
    const shown = [
      inspect(kiosk, { depth: 20, showHidden: true }),
      JSON.stringify(kiosk),
      String(kiosk),
      JSON.stringify(Object.entries(kiosk)),
      inspect(new Http("http://127.0.0.1:9", KEY, {
        requestTimeoutMs: 1000, retry: {}, fetch, logger: { info() {}, warn() {} },
      }), { depth: 20, showHidden: true }),
    ];
    for (const text of shown) {
      assert.ok(!text.includes(SECRET), `the key in ${text}`);
    }
    assert.ok(shown[0].includes(REDACTED_KEY), shown[0]);
    assert.equal(JSON.parse(shown[1]).apiKey, REDACTED_KEY);
  } finally {
    await kiosk.close();
  }
});

test("the journal's temporary file is made anew, 0600, never written through a link", async () => {
  const path = await scratchJournal("secrets-");
  // Someone else's file, and a link to it where the temporary file goes.
  const victim = join(dirname(path), "victim.txt");
  await writeFile(victim, "not yours\n", { mode: 0o644 });
  await symlink(victim, `${path}.tmp`);
  const store = await FileJournalStore.open(path);
  try {
    assert.equal(await readFile(victim, "utf8"), "not yours\n", "written through the link");
    assert.ok(!(await lstat(path)).isSymbolicLink());
    assert.equal((await stat(path)).mode & 0o777, 0o600);
  } finally {
    await store.close();
  }
  // A leftover temporary file readable by others is not reused as it is.
  await writeFile(`${path}.tmp`, "", { mode: 0o644 });
  const again = await FileJournalStore.open(path);
  try {
    assert.equal((await stat(path)).mode & 0o777, 0o600);
  } finally {
    await again.close();
  }
});
