// A journal path in a scratch directory of its own for each caller; every
// directory a test file made is removed when that file's tests end
// (`node --test` runs each file in a process of its own).
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after } from "node:test";

const made = [];

after(() => Promise.all(made.map((dir) => rm(dir, { recursive: true, force: true }))));

export async function scratchJournal(prefix) {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  made.push(dir);
  return join(dir, "journal.jsonl");
}
