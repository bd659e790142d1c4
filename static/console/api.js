// The console's only way to the service: the public /v1 API, with the key
// from this tab's sessionStorage as `Authorization: Bearer`. The key is
// never put in a URL or a cookie (`credentials: "omit"`).

const STORAGE_KEY = "token-billing.console.api-key";

export function storedKey() {
  return sessionStorage.getItem(STORAGE_KEY);
}

export function storeKey(key) {
  sessionStorage.setItem(STORAGE_KEY, key);
}

export function forgetKey() {
  sessionStorage.removeItem(STORAGE_KEY);
}

/** An error answer of the API: its problem+json `detail` is what people read. */
export class ApiError extends Error {
  constructor(status, problem) {
    const detail = (problem && (problem.detail || problem.title)) || `HTTP ${status}`;
    super(detail);
    this.status = status;
    this.code = problem && problem.code;
    this.problem = problem;
  }
}

/** Listeners told when the key stops working (401), to sign out. */
const unauthorizedListeners = [];
export function onUnauthorized(listener) {
  unauthorizedListeners.push(listener);
}

/**
 * One API request. `body` is sent as JSON; `accept: "text/csv"` answers
 * text. Resolves to `{data, status, headers}`; rejects with ApiError.
 */
export async function request(path, { method = "GET", body, accept, key, headers = {} } = {}) {
  const bearer = key || storedKey();
  const sent = { Accept: accept || "application/json", ...headers };
  if (bearer) sent.Authorization = `Bearer ${bearer}`;
  const init = { method, headers: sent, credentials: "omit", cache: "no-store" };
  if (body !== undefined) {
    sent["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    throw new ApiError(0, { detail: `The service did not answer (${error.message}).` });
  }
  if (!response.ok) {
    let problem = null;
    try {
      problem = await response.json();
    } catch (_) {
      problem = { detail: `HTTP ${response.status} ${response.statusText}` };
    }
    const error = new ApiError(response.status, problem);
    // Seconds to wait before asking again (409 instant_not_closed, 429, 503).
    error.retryAfter = Number(response.headers.get("Retry-After")) || null;
    if (response.status === 401 && !key) unauthorizedListeners.forEach((listener) => listener(error));
    throw error;
  }
  let data = null;
  if (response.status !== 204) {
    data = accept === "text/csv" ? await response.text() : await response.json();
  }
  return { data, status: response.status, headers: response.headers };
}

export async function get(path, options) {
  return (await request(path, options)).data;
}

/** A query string from the defined values of `params`. */
export function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(name, value);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

/** A fresh idempotency key (external_ref, Idempotency-Key). */
export function freshId(prefix) {
  return `${prefix}-${crypto.randomUUID()}`;
}
