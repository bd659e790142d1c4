/**
 * The kiosk: journaled, retried calls to the token-billing service, with
 * the Python client's contract (docs/clients.md): `generate`, `submit`,
 * `wait`, `job`, `reserve`, `commit`, `release`, `extend`, `balance`,
 * `pending`, `history`, `resume`, `watch`.
 */

import { ApiError, CorsRefused, JobNotFinished, KioskError, ReservationNotHeld } from "./errors.js";
import { Http, INSPECT, REDACTED_KEY, type Fetch, type Logger, type RetryPolicy } from "./http.js";
import { Journal, type JournalEntry, type JournalStore } from "./journal.js";
import {
  isTerminal,
  topupStateOf,
  type Balance,
  type Event,
  type EventType,
  type Grant,
  type GrantStatus,
  type Job,
  type JobStatus,
  type LedgerEntry,
  type Reservation,
  type ReservationState,
  type ReservationView,
  type TopupRule,
  type TopupState,
} from "./models.js";

/** The service waits at most this long in one long poll (`wait_seconds`). */
export const LONG_POLL_MAX_SECONDS = 30;
/** The longest page of the event feed. */
export const EVENT_PAGE_MAX = 1000;

export interface KioskOptions {
  baseUrl: string;
  apiKey: string;
  accountId: string;
  /** Where the journal lives: `FileJournalStore` (Node, Electron),
   * `IndexedDbJournalStore` (a browser), `MemoryJournalStore` (tests). */
  journal: JournalStore;
  /** The deadline of each call, retries and waits included (ms). Default 120000. */
  timeoutMs?: number;
  /** One HTTP request's timeout (ms), plus the wait of a long poll. Default 15000. */
  requestTimeoutMs?: number;
  retry?: RetryPolicy;
  /** Your own fetch (a proxy, TLS settings, tests). Default: the global one. */
  fetch?: Fetch;
  /** Lines for each answer (info) and each retry (warn); never the key. Default: none. */
  logger?: Logger;
  /** Finished journal entries are forgotten after this many days. Default 30. */
  keepFinishedDays?: number;
  /**
   * Tell a CORS refusal from a dead network ({@link CorsRefused}): at
   * `open` and after a fetch that throws, a `cors` and a `no-cors` probe of
   * `/readyz`. Default: on in a web page whose origin is not the service's,
   * off elsewhere (Node, Electron's main process).
   */
  corsProbe?: boolean;
}

/** How long each CORS probe of `/readyz` waits (ms). */
export const CORS_PROBE_TIMEOUT_MS = 1_500;

/** The page's origin when this runs in a web page (a window or a worker), else null. */
function pageOrigin(): string | null {
  const location = (globalThis as { location?: { origin?: unknown } }).location;
  return typeof location?.origin === "string" && location.origin !== "null" ? location.origin : null;
}

/** What {@link Kiosk.resume} made of one open journal entry. */
export interface Outcome {
  entry: JournalEntry;
  requestId: string;
  operation: string;
  /** The job (normally finished; unless `error` is a JobNotFinished). */
  job: Job | null;
  /** A reserve's, commit's, release's or extend's reservation as it is now:
   * `state` "held" is yours to commit (the work it paid for is done) or
   * release. */
  reservation: Reservation | null;
  /** Refused (`error.pending` false) or still without an answer (true). */
  error: KioskError | null;
}

export interface CallTimeout {
  timeoutMs?: number;
}

/** How long {@link Kiosk.resume} tries, for the whole journal, by default (ms). */
export const RESUME_TIMEOUT_MS = 3_000;
/** Each background attempt at a press resume() left pending gives up after this (ms). */
const BACKGROUND_ATTEMPT_MS = 10_000;

export interface ResumeOptions {
  /** One deadline for the whole journal (ms). Default {@link RESUME_TIMEOUT_MS}. */
  timeoutMs?: number;
  /** Called once for each press settled in the background. */
  onSettled?: (outcome: Outcome) => void;
}

export interface GenerateOptions extends CallTimeout {
  /** The guest action's id: made once per press, reused by every retry. */
  requestId?: string;
}

export interface ReserveOptions extends CallTimeout {
  /** The reservation's id of request: made once per press, reused by every retry. */
  requestId?: string;
  /** It expires this long after it is made (or last extended), unless committed or released. */
  ttlSeconds?: number;
}

export interface CommitOptions extends CallTimeout {
  /** Tokens spent, at most the amount held (default: all); the rest goes back. */
  amount?: number;
}

/** A reservation, or its id. */
export type ReservationRef = Reservation | string;

export interface WatchOptions extends CallTimeout {
  /** Only these event types (all when omitted); a misspelled one does not compile. */
  types?: readonly EventType[];
  /** Start after this event id. Default: the end of the feed (from now on). */
  after?: string;
  /** Start after the last event created before this instant (a Date or RFC 3339). */
  since?: Date | string;
  /** Start at the beginning of the feed instead of its end. */
  fromStart?: boolean;
  /** Long poll length, 0…30 s. Default 30. */
  waitSeconds?: number;
  /** Stops the watch (the iterator ends after the current poll). */
  signal?: AbortSignal;
}

/** What every list reader takes: its page size, a cursor to start after, the deadline of each page. */
export interface ListOptions extends CallTimeout {
  /** Items per request (the service's default when omitted). */
  pageSize?: number;
  /** Start after this item (a previous item's id; the ledger: an `entry_id`). */
  after?: string | number;
}

export interface LedgerOptions extends ListOptions {
  /** Only entries written at or after this instant (a Date or RFC 3339). */
  since?: Date | string;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

function uuid(text: string): string {
  const lower = text.toLowerCase();
  if (!UUID.test(lower)) throw new TypeError(`not a UUID: ${text}`);
  return lower;
}

const silent: Logger = { info() {}, warn() {} };

export class Kiosk {
  readonly baseUrl: string;
  readonly accountId: string;
  readonly timeoutMs: number;
  private readonly journal: Journal;
  private readonly http: Http;
  private closed = false;
  private background: Promise<Outcome[]> | null = null;
  private readonly fetcher: Fetch;
  /** True once a `cors` probe was answered: CORS is fine, no more probes. */
  private corsFine: boolean;

  private constructor(options: KioskOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.accountId = uuid(options.accountId);
    this.timeoutMs = options.timeoutMs ?? 120_000;
    this.journal = new Journal(options.journal);
    this.fetcher = options.fetch ?? ((input, init) => fetch(input, init));
    const origin = pageOrigin();
    let crossOrigin = false;
    try {
      crossOrigin = origin !== null && new URL(this.baseUrl).origin !== origin;
    } catch {
      crossOrigin = false;
    }
    this.corsFine = !(options.corsProbe ?? crossOrigin);
    this.http = new Http(this.baseUrl, options.apiKey, {
      requestTimeoutMs: options.requestTimeoutMs ?? 15_000,
      retry: options.retry ?? {},
      fetch: this.fetcher,
      logger: options.logger ?? silent,
      diagnose: async () => this.probeCors(),
    });
  }

  /**
   * A kiosk on its journal (finished entries older than `keepFinishedDays`
   * are forgotten). In a web page on another origin than the service's it
   * first probes CORS (`corsProbe`): rejects with {@link CorsRefused} when
   * the service refuses this origin, within about 1.5 s; offline it goes on.
   */
  static async open(options: KioskOptions): Promise<Kiosk> {
    const kiosk = new Kiosk(options);
    const refused = await kiosk.probeCors();
    if (refused !== null) {
      await kiosk.journal.close();
      throw refused;
    }
    await kiosk.journal.prune((options.keepFinishedDays ?? 30) * 86_400_000);
    return kiosk;
  }

  /**
   * Two probes of `/readyz` at once: a `cors` one (what every call needs)
   * and a `no-cors` one (answered opaquely whenever the service is
   * reachable, whatever its CORS setting). The first refused while the
   * second is answered: a CORS refusal. Both refused: no network (retried
   * as usual). Null unless CORS is refused.
   */
  private async probeCors(): Promise<CorsRefused | null> {
    if (this.corsFine) return null;
    const probe = async (mode: RequestMode): Promise<boolean> => {
      const abort = new AbortController();
      const timer = setTimeout(() => abort.abort(), CORS_PROBE_TIMEOUT_MS);
      try {
        await this.fetcher(`${this.baseUrl}/readyz`, { method: "GET", mode, signal: abort.signal, cache: "no-store" });
        return true;
      } catch {
        return false;
      } finally {
        clearTimeout(timer);
      }
    };
    const [cors, opaque] = await Promise.all([probe("cors"), probe("no-cors")]);
    if (cors) {
      this.corsFine = true;
      return null;
    }
    if (!opaque) return null;
    const origin = pageOrigin();
    return new CorsRefused(
      `the service at ${this.baseUrl} answers, but the browser refuses its answers to this page ` +
        `(origin ${origin ?? "unknown"}): add the origin to the service's CORS_ALLOWED_ORIGINS`,
      { origin, baseUrl: this.baseUrl },
    );
  }

  /** What `JSON.stringify`, `console.log` and `util.inspect` show: never the key. */
  toJSON(): Record<string, unknown> {
    return { baseUrl: this.baseUrl, accountId: this.accountId, apiKey: REDACTED_KEY, timeoutMs: this.timeoutMs };
  }

  [INSPECT](): string {
    return `Kiosk ${JSON.stringify(this.toJSON())}`;
  }

  /**
   * Closes the journal (and releases its lock), after the background
   * settling of {@link resume} stops (within one attempt, at most 10 s).
   */
  async close(): Promise<void> {
    this.closed = true;
    await this.background?.catch(() => undefined);
    await this.journal.close();
  }

  private deadline(timeoutMs?: number): number {
    return Date.now() + (timeoutMs ?? this.timeoutMs);
  }

  private jobPath(requestId: string): string {
    return `/v1/accounts/${this.accountId}/jobs/${uuid(requestId)}`;
  }

  // -- reads ----------------------------------------------------------------

  /** The account's balances (`available`, `reserved`, `used`, …). */
  async balance(options: CallTimeout = {}): Promise<Balance> {
    const [, data] = await this.http.call("GET", `/v1/accounts/${this.accountId}`, {
      deadline: this.deadline(options.timeoutMs),
    });
    return data as unknown as Balance;
  }

  /** A job as it is now. */
  async job(requestId: string, options: CallTimeout = {}): Promise<Job> {
    const [, data] = await this.http.call("GET", this.jobPath(requestId), {
      deadline: this.deadline(options.timeoutMs),
      requestId,
    });
    return data as unknown as Job;
  }

  /**
   * The account's top-up rules (`GET …/topup-rules`, at most 20), oldest
   * first, each with `status`, `unconsumed_tokens` and `last_firing`.
   */
  async topupRules(options: CallTimeout = {}): Promise<TopupRule[]> {
    const [, data] = await this.http.call("GET", `/v1/accounts/${this.accountId}/topup-rules`, {
      deadline: this.deadline(options.timeoutMs),
    });
    return (data.rules as TopupRule[] | undefined) ?? [];
  }

  /**
   * What a sold-out booth asks on {@link InsufficientTokens}: is a top-up on
   * its way (`openRequest`: the rule whose request waits for the customer,
   * and the request; `armed`), or stopped by a cap (`capped`)?
   */
  async topupState(options: CallTimeout = {}): Promise<TopupState> {
    return topupStateOf(await this.topupRules(options));
  }

  /** This account's open journal entries (pending, accepted), oldest first. */
  pending(): Promise<JournalEntry[]> {
    return this.journal.open(this.accountId);
  }

  /** This account's journal entries, newest first. */
  history(limit = 100): Promise<JournalEntry[]> {
    return this.journal.entries(this.accountId, limit);
  }

  // -- jobs -----------------------------------------------------------------

  /**
   * Creates a generation job and waits for it to finish. The `requestId`
   * (a new UUID unless given) is journaled durably before the first send
   * and reused by every retry: the job is created and charged once,
   * whatever happens to the network or to this process. Resolves to the
   * final job (`succeeded`, or `failed`: its tokens went back). Rejects
   * with a typed {@link ApiError} when refused, or {@link JobNotFinished} /
   * {@link Unreachable} (`pending` true) when the deadline passes first.
   */
  async generate(kind: string, params: Record<string, unknown>, options: GenerateOptions = {}): Promise<Job> {
    const deadline = this.deadline(options.timeoutMs);
    return this.waitFor(await this.submitBy(kind, params, options.requestId, deadline), deadline);
  }

  /** Creates a job (journaled like `generate`) without waiting for it. */
  submit(kind: string, params: Record<string, unknown>, options: GenerateOptions = {}): Promise<Job> {
    return this.submitBy(kind, params, options.requestId, this.deadline(options.timeoutMs));
  }

  /** Long-polls a job until it is final. */
  async wait(requestId: string, options: CallTimeout = {}): Promise<Job> {
    const deadline = this.deadline(options.timeoutMs);
    return this.waitFor(await this.job(requestId, options), deadline);
  }

  private async submitBy(
    kind: string,
    params: Record<string, unknown>,
    requestId: string | undefined,
    deadline: number,
  ): Promise<Job> {
    const id = requestId === undefined ? crypto.randomUUID() : uuid(requestId);
    const body = { request_id: id, kind, params };
    const entry = await this.journal.begin(id, "job", this.accountId, body);
    if ((entry.state === "accepted" || entry.state === "done") && entry.answer !== null) {
      return entry.answer as Job;
    }
    return this.createJob(entry, deadline, false);
  }

  private async createJob(entry: JournalEntry, deadline: number, resumed: boolean): Promise<Job> {
    // A refusal changed nothing: recorded. A give-up that may still have
    // landed (pending) is not: recovery asks again.
    const job = (await this.postJournaled(entry, `/v1/accounts/${this.accountId}/jobs`, deadline, resumed)) as unknown as Job;
    await this.journal.record(entry.request_id, isTerminal(job) ? "done" : "accepted", job);
    return job;
  }

  private async waitFor(start: Job, deadline: number): Promise<Job> {
    let job = start;
    while (!isTerminal(job)) {
      const remaining = deadline - Date.now();
      if (remaining <= 0) {
        throw new JobNotFinished(`job ${job.request_id} is still ${job.status}; resume() finishes it`, job);
      }
      const wait = Math.max(1, Math.min(LONG_POLL_MAX_SECONDS, Math.ceil(remaining / 1000)));
      const [, data] = await this.http.call("GET", this.jobPath(job.request_id), {
        deadline,
        query: { wait_seconds: wait },
        readExtraMs: wait * 1000,
        requestId: job.request_id,
        pendingOnGiveUp: true,
      });
      job = data as unknown as Job;
    }
    await this.journal.record(job.request_id, "done", job);
    return job;
  }

  // -- reservations (kiosks that run their own model) -----------------------

  /**
   * Reserves `amount` tokens, journaled like {@link generate}: the
   * `requestId` (a new UUID unless given) is durable before the first send
   * and reused by every retry and restart, so it is reserved once. Commit
   * or release it when the work is done; until then {@link pending} lists
   * it and {@link resume} hands it back (`reservation.state` "held").
   */
  async reserve(amount: number, options: ReserveOptions = {}): Promise<Reservation> {
    const id = options.requestId === undefined ? crypto.randomUUID() : uuid(options.requestId);
    const body: Record<string, unknown> = { request_id: id, amount };
    if (options.ttlSeconds !== undefined) body.ttl_seconds = options.ttlSeconds;
    const entry = await this.journal.begin(id, "reserve", this.accountId, body);
    if ((entry.state === "held" || entry.state === "done") && entry.answer !== null) {
      return entry.answer as Reservation;
    }
    return this.sendReserve(entry, this.deadline(options.timeoutMs), false);
  }

  /** Spends `amount` (default: all held); the rest goes back. Journaled: a
   * commit cut off by a crash is sent again by {@link resume}, once. */
  commit(reservation: ReservationRef, options: CommitOptions = {}): Promise<Reservation> {
    const body: Record<string, unknown> = options.amount === undefined ? {} : { amount: options.amount };
    return this.resolve("commit", reservation, body, options.timeoutMs);
  }

  /** Gives every held token back. Journaled like {@link commit}. */
  release(reservation: ReservationRef, options: CallTimeout = {}): Promise<Reservation> {
    return this.resolve("release", reservation, {}, options.timeoutMs);
  }

  /** The reservation now expires `ttlSeconds` from now (capped at its
   * grants' expiry). Journaled like {@link commit}. */
  extend(reservation: ReservationRef, ttlSeconds: number, options: CallTimeout = {}): Promise<Reservation> {
    return this.resolve("extend", reservation, { ttl_seconds: ttlSeconds }, options.timeoutMs);
  }

  /**
   * Extends the reservation every `everyMs` (default a third of the TTL)
   * until `stop()`, so that a long piece of local work does not outlive
   * it. A refusal stops it (`error`: the reservation is no longer held); a
   * missed beat (no answer) is tried again at the next.
   */
  heartbeat(reservation: ReservationRef, ttlSeconds: number, options: { everyMs?: number } = {}): Heartbeat {
    const reservationId = uuid(typeof reservation === "string" ? reservation : reservation.reservation_id);
    return new Heartbeat(this, reservationId, ttlSeconds, options.everyMs ?? Math.max(1_000, (ttlSeconds * 1000) / 3));
  }

  private async sendReserve(entry: JournalEntry, deadline: number, resumed: boolean): Promise<Reservation> {
    const reservation = (await this.postJournaled(
      entry,
      `/v1/accounts/${this.accountId}/reservations`,
      deadline,
      resumed,
    )) as unknown as Reservation;
    await this.journal.record(
      entry.request_id,
      reservation.state === "held" ? "held" : "done",
      reservation,
      reservation.reservation_id,
    );
    return reservation;
  }

  private async resolve(
    operation: "commit" | "release" | "extend",
    reservation: ReservationRef,
    body: Record<string, unknown>,
    timeoutMs: number | undefined,
  ): Promise<Reservation> {
    const reservationId = uuid(typeof reservation === "string" ? reservation : reservation.reservation_id);
    const entry = await this.journal.begin(crypto.randomUUID(), operation, this.accountId, body, reservationId);
    return this.sendResolution(entry, this.deadline(timeoutMs), false);
  }

  private async sendResolution(entry: JournalEntry, deadline: number, resumed: boolean): Promise<Reservation> {
    const reservationId = entry.reservation_id ?? "";
    const path = `/v1/accounts/${this.accountId}/reservations/${reservationId}/${entry.operation}`;
    let reservation: Reservation;
    try {
      reservation = (await this.postJournaled(entry, path, deadline, resumed)) as unknown as Reservation;
    } catch (error) {
      if (error instanceof ReservationNotHeld && !error.pending) await this.journal.resolveReservation(reservationId);
      throw error;
    }
    await this.journal.record(entry.request_id, "done", reservation);
    if (reservation.state !== "held") await this.journal.resolveReservation(reservationId);
    return reservation;
  }

  /** POSTs a journaled request; a refusal is recorded before it is thrown,
   * a give-up that may still have landed (pending) is not. */
  private async postJournaled(
    entry: JournalEntry,
    path: string,
    deadline: number,
    resumed: boolean,
  ): Promise<Record<string, unknown>> {
    try {
      const [, data] = await this.http.call("POST", path, {
        deadline,
        body: entry.body,
        requestId: entry.request_id,
        pendingOnGiveUp: true,
        mayHaveLanded: resumed,
      });
      return data;
    } catch (error) {
      if (error instanceof ApiError && !error.pending) {
        await this.journal.record(entry.request_id, "refused", error.problem);
      }
      throw error;
    }
  }

  // -- recovery -------------------------------------------------------------

  /**
   * Finishes what a crash, a reboot or a dead network left open, with the
   * same `request_id`s: pending requests are sent again (the service
   * replays what it had), accepted jobs are waited for. Call it on every
   * start, before the first guest: it has **one deadline for the whole
   * journal** (`timeoutMs`, default 3 s), so a booth that starts without
   * network serves its first guest within seconds. The presses it could
   * not settle by then (their outcome's `error.pending` is true) stay in
   * the journal and are settled in the background, one at a time, with
   * their own `request_id`s (so never charged twice), until each is
   * answered; {@link settled} tells when, and `onSettled` each one. Never
   * throws for one entry: each outcome has its job or its error.
   */
  async resume(options: ResumeOptions = {}): Promise<Outcome[]> {
    const deadline = Date.now() + (options.timeoutMs ?? RESUME_TIMEOUT_MS);
    const outcomes: Outcome[] = [];
    for (const entry of await this.openInResumeOrder()) {
      outcomes.push(await this.resumeOne(entry, deadline));
    }
    const left = outcomes.filter((outcome) => outcome.error?.pending === true).map((outcome) => outcome.requestId);
    if (left.length > 0 && this.background === null) {
      this.background = this.settleInBackground(left, options.onSettled);
    }
    return outcomes;
  }

  /**
   * The outcomes of the presses {@link resume} left pending, once the
   * background has settled every one (or the kiosk was closed); `[]` when
   * nothing is left.
   */
  settled(): Promise<Outcome[]> {
    return this.background ?? Promise.resolve([]);
  }

  /**
   * Commits, releases and extensions first: a held reservation is read
   * again only after the resolution that was on its way, so it is not
   * handed back as held when it was in fact committed.
   */
  private async openInResumeOrder(): Promise<JournalEntry[]> {
    const open = await this.journal.open(this.accountId);
    const resolution = (entry: JournalEntry): boolean =>
      entry.operation === "commit" || entry.operation === "release" || entry.operation === "extend";
    return [...open.filter(resolution), ...open.filter((entry) => !resolution(entry))];
  }

  private async resumeOne(entry: JournalEntry, deadline: number): Promise<Outcome> {
    const outcome: Outcome = {
      entry,
      requestId: entry.request_id,
      operation: entry.operation,
      job: null,
      reservation: null,
      error: null,
    };
    try {
      if (entry.operation === "job") {
        const job =
          entry.state === "accepted" && entry.answer !== null
            ? (entry.answer as Job)
            : await this.createJob(entry, deadline, true);
        outcome.job = await this.waitFor(job, deadline);
      } else if (entry.operation === "reserve") {
        if (entry.state === "held" && typeof entry.reservation_id === "string") {
          const [, data] = await this.http.call(
            "GET",
            `/v1/accounts/${this.accountId}/reservations/${entry.reservation_id}`,
            { deadline, requestId: entry.request_id, pendingOnGiveUp: true },
          );
          const reservation = data as unknown as Reservation;
          if (reservation.state !== "held") await this.journal.record(entry.request_id, "done", reservation);
          outcome.reservation = reservation;
        } else {
          outcome.reservation = await this.sendReserve(entry, deadline, true);
        }
      } else {
        outcome.reservation = await this.sendResolution(entry, deadline, true);
      }
    } catch (error) {
      if (!(error instanceof KioskError)) throw error;
      // An extension of a reservation no longer held has nothing to do.
      if (error instanceof ReservationNotHeld && entry.operation === "extend") return outcome;
      outcome.error = error;
      if (error instanceof JobNotFinished) outcome.job = error.job;
    }
    return outcome;
  }

  /** One press at a time, each until it is answered (or the kiosk closes). */
  private async settleInBackground(requestIds: string[], onSettled?: (outcome: Outcome) => void): Promise<Outcome[]> {
    const settled: Outcome[] = [];
    for (const requestId of requestIds) {
      while (!this.closed) {
        // The entry as the journal has it now (accepted meanwhile, or done).
        const entry = (await this.journal.open(this.accountId)).find((open) => open.request_id === requestId);
        if (entry === undefined) break;
        const outcome = await this.resumeOne(entry, Date.now() + BACKGROUND_ATTEMPT_MS);
        // A configuration error: retrying cannot help; the entry stays
        // pending for the next start, once the setting is fixed.
        if (outcome.error instanceof CorsRefused) return settled;
        if (outcome.error?.pending !== true) {
          settled.push(outcome);
          onSettled?.(outcome);
          break;
        }
      }
    }
    return settled;
  }

  // -- lists, every page ---------------------------------------------------

  /**
   * Every ledger entry of the account, oldest first, page after page
   * (Stripe's auto-paging): `for await (const entry of kiosk.ledger()) …`.
   * Each page is one request, retried like every read within `timeoutMs`,
   * waiting as `Retry-After` says when the key is over its rate limit; the
   * next page is asked only when the loop reaches it.
   */
  ledger(options: LedgerOptions = {}): AsyncIterableIterator<LedgerEntry> {
    const query: Record<string, string> = {};
    if (options.since !== undefined) {
      query.since = options.since instanceof Date ? options.since.toISOString() : options.since;
    }
    return this.pages<LedgerEntry>("ledger", "entries", query, options);
  }

  /** Every reservation of the account, newest first (`state`: only those), as {@link ledger}. */
  reservations(options: ListOptions & { state?: ReservationState } = {}): AsyncIterableIterator<ReservationView> {
    const query: Record<string, string> = options.state === undefined ? {} : { state: options.state };
    return this.pages<ReservationView>("reservations", "reservations", query, options);
  }

  /** Every generation job of the account, newest first (`status`: only those), as {@link ledger}. */
  jobs(options: ListOptions & { status?: JobStatus } = {}): AsyncIterableIterator<Job> {
    const query: Record<string, string> = options.status === undefined ? {} : { status: options.status };
    return this.pages<Job>("jobs", "jobs", query, options);
  }

  /**
   * Every credit grant of the account, in creation order (`status`: only
   * those), as {@link ledger}. The top-up rules (at most 20) come in one
   * answer: {@link topupRules}.
   */
  grants(options: ListOptions & { status?: GrantStatus } = {}): AsyncIterableIterator<Grant> {
    const query: Record<string, string> = options.status === undefined ? {} : { status: options.status };
    return this.pages<Grant>("grants", "grants", query, options);
  }

  /**
   * The items of a cursor-paged list (docs/api.md): `next_after` is the
   * next request's `after`, null on the last page.
   */
  private pages<T>(
    resource: string,
    member: string,
    filters: Record<string, string>,
    options: ListOptions,
  ): AsyncIterableIterator<T> {
    const path = `/v1/accounts/${this.accountId}/${resource}`;
    const self = this;
    async function* items(): AsyncGenerator<T> {
      let cursor: string | null = options.after === undefined ? null : String(options.after);
      for (;;) {
        const query: Record<string, string | number> = { ...filters };
        if (options.pageSize !== undefined) query.limit = options.pageSize;
        if (cursor !== null) query.after = cursor;
        const [, page] = await self.http.call("GET", path, { deadline: self.deadline(options.timeoutMs), query });
        for (const item of (page[member] as T[] | undefined) ?? []) yield item;
        const next = page.next_after;
        if (next === null || next === undefined) return;
        // A cursor that does not move would page for ever.
        if (String(next) === cursor) throw new KioskError(`GET ${path}: the service gave the cursor ${cursor} again`);
        cursor = String(next);
      }
    }
    return items();
  }

  // -- the event feed -------------------------------------------------------

  /**
   * The account's events as they commit, oldest first, for ever (from now,
   * without reading the history; or `after` an event id, `since` an
   * instant, or `fromStart`): a long
   * poll that holds no connection on the service while nothing happens, so
   * a top-up (`credit.created`) reaches a sold-out booth within a second.
   * "From now on" is decided when `watch` is called (it reads the end of
   * the feed before resolving); the feed shows an event only once no earlier
   * transaction can still commit, so events committed just before the call
   * may still come. A poll failing past the timeout throws from
   * the iterator (`Unreachable`, or a refusal): call `watch({after})` with
   * the last event's id to go on without a gap.
   */
  async watch(options: WatchOptions = {}): Promise<AsyncIterableIterator<Event>> {
    const wanted = options.types === undefined ? null : new Set<string>(options.types);
    const given = [options.after !== undefined, options.since !== undefined, options.fromStart === true];
    if (given.filter(Boolean).length > 1) throw new TypeError("give at most one of after, since and fromStart");
    let cursor: string | null = options.after ?? null;
    const start =
      options.since === undefined
        ? null
        : options.since instanceof Date
          ? options.since.toISOString()
          : options.since;
    if (cursor === null && start === null && options.fromStart !== true) cursor = await this.endOfFeed(options.timeoutMs);
    const wait = Math.max(0, Math.min(LONG_POLL_MAX_SECONDS, Math.floor(options.waitSeconds ?? LONG_POLL_MAX_SECONDS)));
    const only = wanted !== null && wanted.size === 1 ? [...wanted][0] : undefined;
    const self = this;
    async function* events(): AsyncGenerator<Event> {
      while (options.signal?.aborted !== true) {
        const query: Record<string, string | number> = { account_id: self.accountId, wait_seconds: wait };
        if (cursor !== null) query.after = cursor;
        else if (start !== null) query.start = start; // until the feed gives a cursor
        if (only !== undefined) query.type = only;
        const [, page] = await self.http.call("GET", "/v1/events", {
          deadline: self.deadline(options.timeoutMs),
          query,
          readExtraMs: wait * 1000,
        });
        for (const event of (page.events as Event[] | undefined) ?? []) {
          cursor = event.id;
          if (wanted === null || wanted.has(event.type)) yield event;
        }
        if (typeof page.next_after === "string") cursor = page.next_after;
      }
    }
    return events();
  }

  /** The account's latest listed event (null: none yet): `start=now`, one request, no history. */
  private async endOfFeed(timeoutMs?: number): Promise<string | null> {
    const [, page] = await this.http.call("GET", "/v1/events", {
      deadline: this.deadline(timeoutMs),
      query: { account_id: this.accountId, start: "now", limit: 1 },
    });
    return typeof page.next_after === "string" ? page.next_after : null;
  }
}

/** A running {@link Kiosk.heartbeat}: `beats` extensions so far; `error`
 * the refusal that stopped it early, if any. */
export class Heartbeat {
  beats = 0;
  error: KioskError | null = null;
  private stopped = false;
  private wake: () => void = () => {};
  private readonly loop: Promise<void>;

  constructor(
    private readonly kiosk: Kiosk,
    readonly reservationId: string,
    readonly ttlSeconds: number,
    readonly everyMs: number,
  ) {
    this.loop = this.run();
  }

  /** Stops it (and waits for a beat on its way). */
  async stop(): Promise<void> {
    this.stopped = true;
    this.wake();
    await this.loop;
  }

  private async run(): Promise<void> {
    while (!this.stopped) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, this.everyMs);
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      if (this.stopped) return;
      try {
        // Up to half the TTL per attempt: a slow answer is still in time.
        const timeoutMs = Math.max(this.everyMs, (this.ttlSeconds * 1000) / 2);
        await this.kiosk.extend(this.reservationId, this.ttlSeconds, { timeoutMs });
        this.beats += 1;
      } catch (error) {
        if (!(error instanceof KioskError)) throw error;
        if (!error.pending) {
          this.error = error;
          return;
        }
      }
    }
  }
}
