/**
 * A journal on a file, for Node and Electron: append-only JSON lines, each
 * write fsynced before `put` resolves (so before the request is sent), the
 * file and its directory fsynced when created, mode 0600. On open the file
 * is read back (a torn last line from a power cut is ignored: its request
 * was never sent) and rewritten compactly (temp file, fsync, rename, fsync
 * of the directory). One process at a time: `<path>.lock` holds the
 * owner's pid; a lock whose process is gone (a SIGKILL, a power cut) is
 * taken over.
 */

import { constants } from "node:fs";
import { open, readFile, rename, unlink, type FileHandle } from "node:fs/promises";
import { dirname } from "node:path";

import { JournalError } from "./errors.js";
import type { JournalEntry, JournalStore } from "./journal.js";

/** Journals this process holds (a second open of one is refused). */
const held = new Set<string>();

export class FileJournalStore implements JournalStore {
  private constructor(
    readonly path: string,
    private handle: FileHandle,
    private readonly entries: Map<string, JournalEntry>,
    private readonly lockPath: string,
  ) {}

  /** Opens (or creates) the journal at `path` and takes its lock. */
  static async open(path: string): Promise<FileJournalStore> {
    const lockPath = `${path}.lock`;
    if (held.has(lockPath)) throw new JournalError(`the journal is already open in this process (${path})`);
    await takeLock(lockPath);
    held.add(lockPath);
    try {
      const entries = await readEntries(path);
      // Compact: one line per entry, written to a temp file made durable
      // before it replaces the journal.
      // Created anew (O_EXCL, 0600): a leftover, or a link someone put
      // there, is removed first, never written through or kept readable.
      const temporary = `${path}.tmp`;
      await unlink(temporary).catch((error: NodeJS.ErrnoException) => {
        if (error.code !== "ENOENT") throw error;
      });
      const compact = await open(temporary, "wx", 0o600);
      try {
        await compact.writeFile([...entries.values()].map((entry) => `${JSON.stringify(entry)}\n`).join(""));
        await compact.sync();
      } finally {
        await compact.close();
      }
      await rename(temporary, path);
      await syncDirectory(dirname(path));
      const handle = await open(path, constants.O_WRONLY | constants.O_APPEND | constants.O_CREAT, 0o600);
      await handle.chmod(0o600);
      return new FileJournalStore(path, handle, entries, lockPath);
    } catch (error) {
      await unlink(lockPath).catch(() => undefined);
      held.delete(lockPath);
      if (error instanceof JournalError) throw error;
      throw new JournalError(`opening the journal ${path}: ${String(error)}`);
    }
  }

  async get(requestId: string): Promise<JournalEntry | undefined> {
    const entry = this.entries.get(requestId);
    return entry === undefined ? undefined : structuredClone(entry);
  }

  async put(entry: JournalEntry): Promise<void> {
    await this.handle.write(`${JSON.stringify(entry)}\n`);
    await this.handle.sync();
    this.entries.set(entry.request_id, structuredClone(entry));
  }

  async all(): Promise<JournalEntry[]> {
    return [...this.entries.values()].map((entry) => structuredClone(entry));
  }

  async delete(requestIds: readonly string[]): Promise<void> {
    for (const id of requestIds) {
      if (!this.entries.has(id)) continue;
      await this.handle.write(`${JSON.stringify({ request_id: id, deleted: true })}\n`);
      this.entries.delete(id);
    }
    await this.handle.sync();
  }

  async close(): Promise<void> {
    await this.handle.close();
    await unlink(this.lockPath).catch(() => undefined);
    held.delete(this.lockPath);
  }
}

async function readEntries(path: string): Promise<Map<string, JournalEntry>> {
  const entries = new Map<string, JournalEntry>();
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (error) {
    if ((error as { code?: string }).code === "ENOENT") return entries;
    throw error;
  }
  const lines = text.split("\n");
  for (const [index, line] of lines.entries()) {
    if (line === "") continue;
    let record: (JournalEntry & { deleted?: boolean }) | undefined;
    try {
      record = JSON.parse(line) as JournalEntry & { deleted?: boolean };
    } catch {
      // Only the last line can be torn (a crash mid-append): its fsync never
      // returned, so its request was never sent.
      if (index >= lines.length - 2) continue;
      throw new JournalError(`${path}: line ${index + 1} is not JSON; the journal is damaged`);
    }
    if (record.deleted === true) entries.delete(record.request_id);
    else entries.set(record.request_id, record);
  }
  return entries;
}

async function syncDirectory(directory: string): Promise<void> {
  const handle = await open(directory, "r");
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as { code?: string }).code === "EPERM";
  }
}

async function takeLock(lockPath: string): Promise<void> {
  for (let attempt = 0; attempt < 3; attempt += 1) {
    try {
      const handle = await open(lockPath, "wx", 0o600);
      try {
        await handle.writeFile(String(process.pid));
        await handle.sync();
      } finally {
        await handle.close();
      }
      return;
    } catch (error) {
      if ((error as { code?: string }).code !== "EEXIST") {
        throw new JournalError(`locking ${lockPath}: ${String(error)}`);
      }
    }
    const owner = Number.parseInt(await readFile(lockPath, "utf8").catch(() => ""), 10);
    if (Number.isInteger(owner) && owner > 0 && owner !== process.pid && alive(owner)) {
      throw new JournalError(`the journal is in use by process ${owner} (${lockPath})`);
    }
    // Its owner is gone (killed, or a power cut): take the lock over.
    await unlink(lockPath).catch(() => undefined);
  }
  throw new JournalError(`could not lock ${lockPath}`);
}
