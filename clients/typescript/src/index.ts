/**
 * token-billing-kiosk: a crash-safe kiosk client for the token-billing
 * service, for Node, Electron and browsers. No runtime dependency beyond
 * `fetch`. Journals: `token-billing-kiosk/node` (a file, fsynced) and
 * `token-billing-kiosk/browser` (IndexedDB).
 */

export * from "./errors.js";
export { Http, REDACTED_KEY, RETRIED_STATUSES, type Diagnose, type Fetch, type Logger, type RetryPolicy } from "./http.js";
export {
  Journal,
  MemoryJournalStore,
  canonical,
  type EntryState,
  type JournalEntry,
  type JournalStore,
  type Operation,
} from "./journal.js";
export {
  CORS_PROBE_TIMEOUT_MS,
  EVENT_PAGE_MAX,
  Heartbeat,
  Kiosk,
  LONG_POLL_MAX_SECONDS,
  RESUME_TIMEOUT_MS,
  type CallTimeout,
  type CommitOptions,
  type ReservationRef,
  type ReserveOptions,
  type ResumeOptions,
  type GenerateOptions,
  type KioskOptions,
  type LedgerOptions,
  type ListOptions,
  type Outcome,
  type WatchOptions,
} from "./kiosk.js";
export * from "./models.js";
export {
  WEBHOOK_TOLERANCE_SECONDS,
  WebhookVerificationError,
  verifyWebhook,
  type VerifyWebhookOptions,
  type WebhookHeaders,
  type WebhookVerificationReason,
} from "./webhooks.js";
