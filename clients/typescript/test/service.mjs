// The test's own view of the service, as an admin (TB_URL, TB_ADMIN_KEY).
const url = process.env.TB_URL;
const key = process.env.TB_ADMIN_KEY;
if (!url || !key) {
  throw new Error("TB_URL and TB_ADMIN_KEY are not set: run these tests through tests/typescript/run.sh");
}

export async function admin(method, path, body) {
  const response = await fetch(url + path, {
    method,
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`);
  return text === "" ? null : JSON.parse(text);
}

/** An account with `tokens` and a kiosk key: {id, key}. */
export async function funded(tokens, name, maxActive) {
  const body = { name: `${name} ${crypto.randomUUID()}` };
  if (maxActive !== undefined) body.max_active_reservations = maxActive;
  const { account_id: id } = await admin("POST", "/v1/accounts", body);
  if (tokens > 0) {
    await admin("POST", `/v1/accounts/${id}/credits`, { amount: tokens, external_ref: `ts-test-${crypto.randomUUID()}` });
  }
  const { key: kioskKey } = await admin("POST", `/v1/accounts/${id}/api-keys`, { scope: "kiosk", label: "ts test" });
  return { id, key: kioskKey };
}

export const serviceUrl = url;
