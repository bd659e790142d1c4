/**
 * A journal on IndexedDB, for a kiosk that is a web page. Each `put` is a
 * readwrite transaction asked for with `durability: "strict"` and resolves
 * on its `complete` event, so the entry is committed before the request is
 * sent. The limits are the browser's: see the README ("The browser
 * journal").
 */

import { JournalError } from "./errors.js";
import type { JournalEntry, JournalStore } from "./journal.js";

const STORE = "requests";

function request<T>(work: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    work.onsuccess = () => resolve(work.result);
    work.onerror = () => reject(work.error ?? new Error("IndexedDB request failed"));
  });
}

function done(transaction: IDBTransaction): Promise<void> {
  return new Promise((resolve, reject) => {
    transaction.oncomplete = () => resolve();
    transaction.onerror = () => reject(transaction.error ?? new Error("IndexedDB transaction failed"));
    transaction.onabort = () => reject(transaction.error ?? new Error("IndexedDB transaction aborted"));
  });
}

export class IndexedDbJournalStore implements JournalStore {
  private constructor(private readonly db: IDBDatabase) {}

  /** Opens (or creates) the database `name` of this origin. */
  static async open(name = "token-billing-kiosk-journal", factory: IDBFactory = indexedDB): Promise<IndexedDbJournalStore> {
    const opening = factory.open(name, 1);
    opening.onupgradeneeded = () => {
      opening.result.createObjectStore(STORE, { keyPath: "request_id" });
    };
    try {
      return new IndexedDbJournalStore(await request(opening));
    } catch (error) {
      throw new JournalError(`opening the IndexedDB journal ${name}: ${String(error)}`);
    }
  }

  private transaction(mode: IDBTransactionMode): IDBTransaction {
    // `durability` is a hint older browsers ignore (then: their default).
    return this.db.transaction(STORE, mode, { durability: "strict" });
  }

  async get(requestId: string): Promise<JournalEntry | undefined> {
    const result = await request(this.transaction("readonly").objectStore(STORE).get(requestId));
    return result as JournalEntry | undefined;
  }

  async put(entry: JournalEntry): Promise<void> {
    const transaction = this.transaction("readwrite");
    transaction.objectStore(STORE).put(entry);
    await done(transaction);
  }

  async all(): Promise<JournalEntry[]> {
    return (await request(this.transaction("readonly").objectStore(STORE).getAll())) as JournalEntry[];
  }

  async delete(requestIds: readonly string[]): Promise<void> {
    const transaction = this.transaction("readwrite");
    const store = transaction.objectStore(STORE);
    for (const id of requestIds) store.delete(id);
    await done(transaction);
  }

  async close(): Promise<void> {
    this.db.close();
  }
}
