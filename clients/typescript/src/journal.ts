/**
 * The journal: each request's `request_id`, operation and body, written
 * durably before the first send, and its last answer. Storage is
 * pluggable ({@link JournalStore}): `token-billing-kiosk/node` has a file
 * store (fsync before the first send), `token-billing-kiosk/browser` an
 * IndexedDB one, and {@link MemoryJournalStore} keeps nothing across a
 * restart (tests only). Never holds the API key.
 */

import { IdempotencyKeyReused, JournalError } from "./errors.js";

export type EntryState = "pending" | "accepted" | "held" | "done" | "refused";
/** A job; a reservation; or a resolution of one (its `reservation_id`). */
export type Operation = "job" | "reserve" | "commit" | "release" | "extend";

export interface JournalEntry {
  request_id: string;
  operation: Operation;
  account_id: string;
  body: Record<string, unknown>;
  /** The reservation a commit, release or extend is for; a reserve's once
   * answered. Absent on entries of older versions (jobs only). */
  reservation_id?: string | null;
  /** pending: may or may not have reached the service; accepted: a job not
   * yet finished; held: a reservation not yet committed nor released;
   * done; refused (a refusal changed nothing). */
  state: EntryState;
  answer: unknown;
  created_at: number;
  updated_at: number;
}

/**
 * Where entries are kept. `put` resolves only once the entry is durable:
 * a kiosk sends nothing before it resolves.
 */
export interface JournalStore {
  get(requestId: string): Promise<JournalEntry | undefined>;
  put(entry: JournalEntry): Promise<void>;
  all(): Promise<JournalEntry[]>;
  delete(requestIds: readonly string[]): Promise<void>;
  close(): Promise<void>;
}

/** A store in memory: lost with the process. For tests and demos only. */
export class MemoryJournalStore implements JournalStore {
  private readonly entries = new Map<string, JournalEntry>();

  async get(requestId: string): Promise<JournalEntry | undefined> {
    const entry = this.entries.get(requestId);
    return entry === undefined ? undefined : structuredClone(entry);
  }

  async put(entry: JournalEntry): Promise<void> {
    this.entries.set(entry.request_id, structuredClone(entry));
  }

  async all(): Promise<JournalEntry[]> {
    return [...this.entries.values()].map((entry) => structuredClone(entry));
  }

  async delete(requestIds: readonly string[]): Promise<void> {
    for (const id of requestIds) this.entries.delete(id);
  }

  async close(): Promise<void> {}
}

/** Canonical JSON (sorted keys): two bodies are the same request when equal. */
export function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const object = value as Record<string, unknown>;
    return `{${Object.keys(object)
      .sort()
      .map((key) => `${JSON.stringify(key)}:${canonical(object[key])}`)
      .join(",")}}`;
  }
  return JSON.stringify(value);
}

export class Journal {
  private queue: Promise<unknown> = Promise.resolve();

  constructor(private readonly store: JournalStore) {}

  /** One change at a time, in order (entries are read, then written). */
  private serial<T>(work: () => Promise<T>): Promise<T> {
    const next = this.queue.then(work, work);
    this.queue = next.catch(() => undefined);
    return next;
  }

  /**
   * Journals a request before it is sent (durable when this resolves). The
   * same `request_id` with the same body continues the earlier entry (a
   * refused one becomes pending again); another body is refused here,
   * before anything is sent.
   */
  begin(
    requestId: string,
    operation: Operation,
    accountId: string,
    body: Record<string, unknown>,
    reservationId: string | null = null,
  ): Promise<JournalEntry> {
    return this.serial(async () => {
      const now = Date.now();
      const earlier = await this.read(requestId);
      if (earlier === undefined) {
        const entry: JournalEntry = {
          request_id: requestId,
          operation,
          account_id: accountId,
          body,
          reservation_id: reservationId,
          state: "pending",
          answer: null,
          created_at: now,
          updated_at: now,
        };
        await this.write(entry);
        return entry;
      }
      if (
        earlier.operation !== operation ||
        earlier.account_id !== accountId ||
        // A resolution names its reservation; a reserve learns its own from the answer.
        (reservationId !== null && earlier.reservation_id !== reservationId) ||
        canonical(earlier.body) !== canonical(body)
      ) {
        throw new IdempotencyKeyReused(
          422,
          "idempotency_key_reused",
          `request_id ${requestId} is journaled for a different request; nothing was sent`,
          { requestId },
        );
      }
      if (earlier.state === "refused") {
        const entry = { ...earlier, state: "pending" as const, updated_at: now };
        await this.write(entry);
        return entry;
      }
      return earlier;
    });
  }

  /** Records an answer (durable when this resolves); a reserve's answer
   * also its `reservationId`. */
  record(requestId: string, state: EntryState, answer: unknown, reservationId?: string): Promise<void> {
    return this.serial(async () => {
      const entry = await this.read(requestId);
      if (entry === undefined) return;
      const reservation_id = reservationId ?? entry.reservation_id ?? null;
      await this.write({ ...entry, state, answer, reservation_id, updated_at: Date.now() });
    });
  }

  /** The reserve entry of a reservation no longer held (committed,
   * released, expired): done, so resume() does not hand it back. */
  resolveReservation(reservationId: string): Promise<void> {
    return this.serial(async () => {
      for (const entry of await this.store.all()) {
        if (entry.operation === "reserve" && entry.state === "held" && entry.reservation_id === reservationId) {
          await this.write({ ...entry, state: "done", updated_at: Date.now() });
        }
      }
    });
  }

  /** This account's open entries (pending, accepted, held), oldest first. */
  async open(accountId: string): Promise<JournalEntry[]> {
    return (await this.entries(accountId)).filter(
      (entry) => entry.state === "pending" || entry.state === "accepted" || entry.state === "held",
    ).reverse();
  }

  /** This account's entries, newest first. */
  async entries(accountId: string, limit = Number.POSITIVE_INFINITY): Promise<JournalEntry[]> {
    const all = await this.store.all();
    return all
      .filter((entry) => entry.account_id === accountId)
      .sort((a, b) => b.created_at - a.created_at || (a.request_id < b.request_id ? 1 : -1))
      .slice(0, limit);
  }

  /** Forgets finished entries (done, refused) older than this many ms. */
  prune(olderThanMs: number): Promise<number> {
    return this.serial(async () => {
      const cutoff = Date.now() - olderThanMs;
      const old = (await this.store.all())
        .filter((entry) => (entry.state === "done" || entry.state === "refused") && entry.updated_at < cutoff)
        .map((entry) => entry.request_id);
      if (old.length > 0) await this.store.delete(old);
      return old.length;
    });
  }

  close(): Promise<void> {
    return this.serial(() => this.store.close());
  }

  private async read(requestId: string): Promise<JournalEntry | undefined> {
    try {
      return await this.store.get(requestId);
    } catch (error) {
      throw new JournalError(`reading the journal: ${String(error)}`, { requestId });
    }
  }

  private async write(entry: JournalEntry): Promise<void> {
    try {
      await this.store.put(entry);
    } catch (error) {
      throw new JournalError(`writing the journal: ${String(error)}`, { requestId: entry.request_id });
    }
  }
}
