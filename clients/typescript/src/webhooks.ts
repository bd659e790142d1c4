/**
 * Verifying the service's webhook deliveries (Stripe's `constructEvent`),
 * as the Standard Webhooks specification signs them (docs/webhooks.md):
 * `webhook-signature` is `v1,<base64 HMAC-SHA256 of "{webhook-id}.{webhook-timestamp}.{body}">`
 * with the key the base64 after `whsec_`, several space-separated during a
 * secret rotation. WebCrypto only (Node ≥ 20, browsers, workers): no
 * dependency, and `crypto.subtle.verify` compares in constant time.
 */

import { KioskError } from "./errors.js";
import type { Event } from "./models.js";

/** How far `webhook-timestamp` may be from now, either way (the standard's five minutes). */
export const WEBHOOK_TOLERANCE_SECONDS = 300;

export type WebhookVerificationReason =
  | "missing_header"
  | "malformed_header"
  | "timestamp_out_of_tolerance"
  | "no_matching_signature"
  | "invalid_secret"
  | "malformed_body";

/** A delivery that is forged, stale or malformed: answer it 400 and do not act on it. */
export class WebhookVerificationError extends KioskError {
  readonly reason: WebhookVerificationReason;

  constructor(reason: WebhookVerificationReason, message: string) {
    super(message);
    this.reason = reason;
  }
}

/** A fetch `Headers`, or Node's `IncomingMessage.headers` (any case of the names). */
export type WebhookHeaders = Headers | Record<string, string | string[] | undefined>;

export interface VerifyWebhookOptions {
  /** Seconds `webhook-timestamp` may differ from now; default {@link WEBHOOK_TOLERANCE_SECONDS}. */
  toleranceSeconds?: number;
  /** Now, for tests: a Date or Unix milliseconds. */
  now?: Date | number;
}

function header(headers: WebhookHeaders, name: string): string {
  let value: string | string[] | null | undefined;
  if (typeof (headers as Headers).get === "function") {
    value = (headers as Headers).get(name);
  } else {
    for (const [key, found] of Object.entries(headers)) {
      if (key.toLowerCase() === name) value = found;
    }
  }
  if (Array.isArray(value)) value = value.join(" ");
  if (value === undefined || value === null || value === "") {
    throw new WebhookVerificationError("missing_header", `the delivery has no ${name} header`);
  }
  return value;
}

function base64(text: string): Uint8Array<ArrayBuffer> | null {
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(text)) return null;
  try {
    const binary = atob(text);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes;
  } catch {
    return null;
  }
}

function bytesOf(body: string | Uint8Array | ArrayBuffer): Uint8Array {
  if (typeof body === "string") return new TextEncoder().encode(body);
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  return body;
}

/**
 * Checks a delivery and returns its event: `body` is the raw body as
 * received (bytes, or the exact text; never a re-encoded JSON), `secret` the
 * endpoint's `whsec_…`. Throws {@link WebhookVerificationError} when a
 * header is missing or malformed, the timestamp is further than the
 * tolerance from now, no `v1` signature matches, or the body is not an
 * event.
 */
export async function verifyWebhook(
  body: string | Uint8Array | ArrayBuffer,
  headers: WebhookHeaders,
  secret: string,
  options: VerifyWebhookOptions = {},
): Promise<Event> {
  const id = header(headers, "webhook-id");
  const timestamp = header(headers, "webhook-timestamp");
  const signatures = header(headers, "webhook-signature");
  const key = base64(secret.startsWith("whsec_") ? secret.slice("whsec_".length) : secret);
  if (key === null || key.length === 0) {
    throw new WebhookVerificationError("invalid_secret", "the secret is not `whsec_` followed by base64");
  }
  if (!/^[0-9]{1,15}$/.test(timestamp)) {
    throw new WebhookVerificationError("malformed_header", "webhook-timestamp is not Unix seconds");
  }
  const now = options.now === undefined ? Date.now() : Number(options.now);
  const tolerance = options.toleranceSeconds ?? WEBHOOK_TOLERANCE_SECONDS;
  if (Math.abs(now / 1000 - Number(timestamp)) > tolerance) {
    throw new WebhookVerificationError(
      "timestamp_out_of_tolerance",
      `webhook-timestamp is more than ${tolerance} s from now (a replay, or a clock to fix)`,
    );
  }
  const payload = bytesOf(body);
  const prefix = new TextEncoder().encode(`${id}.${timestamp}.`);
  const signed = new Uint8Array(prefix.length + payload.length);
  signed.set(prefix);
  signed.set(payload, prefix.length);
  const hmac = await crypto.subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["verify"]);
  for (const candidate of signatures.split(" ")) {
    const [version, value] = candidate.split(",", 2);
    if (version !== "v1" || value === undefined) continue;
    const signature = base64(value);
    if (signature === null) continue;
    if (await crypto.subtle.verify("HMAC", hmac, signature, signed)) {
      return parse(payload);
    }
  }
  throw new WebhookVerificationError("no_matching_signature", "no v1 signature of the delivery matches the secret");
}

function parse(payload: Uint8Array): Event {
  let event: unknown;
  try {
    event = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(payload));
  } catch {
    throw new WebhookVerificationError("malformed_body", "the signed body is not JSON");
  }
  const fields = event as Record<string, unknown> | null;
  if (
    typeof fields !== "object" || fields === null || typeof fields.id !== "string" ||
    typeof fields.type !== "string" || typeof fields.data !== "object" || fields.data === null
  ) {
    throw new WebhookVerificationError("malformed_body", "the signed body is not an event (id, type, data)");
  }
  return event as Event;
}
