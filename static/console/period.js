// The books' pages (Reconciliation, Revenue): a period form (From and To
// in UTC to the second, the page's own filters), the report of the period
// drawn by the page, and its CSV (`Accept: text/csv`).

import { get, query, request } from "./api.js";
import { busyButton, clear, field, fill, h, messageArea, onSubmit } from "./dom.js";

/** `<input type=datetime-local step=1>` value (UTC, to the second) ↔ Date. */
function toLocalInput(date) {
  return date.toISOString().slice(0, 19);
}
function fromLocalInput(value) {
  return new Date(value.length === 16 ? `${value}:00Z` : `${value}Z`);
}

/** Saves `text` as a file: the name the service gives (Content-Disposition), else `fallback`. */
function save(text, headers, fallback) {
  const named = /filename="?([^";]+)"?/.exec(headers.get("Content-Disposition") || "");
  const link = h("a", {
    href: URL.createObjectURL(new Blob([text], { type: "text/csv" })),
    download: named ? named[1] : fallback,
  });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 60000);
}

/**
 * A period form (`formId`): From and To in UTC to the second (default:
 * the last 30 days up to now, as the API's defaults), the caller's own
 * `fields` (`filters()` their query parameters), a `submit` button and
 * "Download CSV" (`downloadId`) of `path` for the period. `parameters()`
 * are the query of the chosen period; `message` shows errors and results;
 * `reset()` moves an untouched default period to end now.
 */
export function periodForm({ formId, path, submit, csvName, downloadId = "download-csv", fields = [], filters = () => ({}) }) {
  // "To" is now (to the second: the books up to this instant), "From" 30
  // days before, as the API's defaults.
  const defaults = () => {
    const to = new Date(Math.floor(Date.now() / 1000) * 1000);
    return [new Date(to.getTime() - 30 * 86400 * 1000), to];
  };
  const [from, to] = defaults();
  const fromField = field("From (UTC, inclusive)", { type: "datetime-local", step: 1, name: "from", required: true, value: toLocalInput(from) });
  const toField = field("To (UTC, exclusive)", { type: "datetime-local", step: 1, name: "to", required: true, value: toLocalInput(to) });
  let edited = false;
  for (const control of [fromField.control, toField.control]) control.addEventListener("input", () => { edited = true; });
  const message = messageArea();
  const parameters = () => ({
    from: fromLocalInput(fromField.control.value).toISOString(),
    to: fromLocalInput(toField.control.value).toISOString(),
    ...filters(),
  });
  const download = busyButton("Download CSV", { id: downloadId }, async () => {
    message.clear();
    try {
      const chosen = parameters();
      const { data, headers } = await request(`${path}${query(chosen)}`, { accept: "text/csv" });
      save(data, headers, `${csvName}_${chosen.from.slice(0, 16)}_${chosen.to.slice(0, 16)}.csv`.replace(/:/g, "-"));
      message.ok("CSV downloaded.");
    } catch (error) {
      message.error(error);
    }
  });
  const form = h(
    "form",
    { class: "toolbar", id: formId, "aria-label": "Period" },
    fromField.element,
    toField.element,
    fields.map((extra) => extra.element),
    h("button", { type: "submit" }, submit),
    download,
  );
  const reset = () => {
    if (edited) return;
    const [start, end] = defaults();
    fromField.control.value = toLocalInput(start);
    toField.control.value = toLocalInput(end);
  };
  return { form, message, parameters, reset };
}

/**
 * Renders a period page into `container`: `title`, the period form
 * (periodForm), and the report of `path` for the period, drawn by
 * `show(report)` into the result (`resultId`). The first report (the
 * default period) comes at once.
 */
export async function renderPeriodPage(container, { title, path, formId, resultId, submit, csvName, fields = [], filters = () => ({}), show }) {
  container.append(h("h1", {}, title));
  const { form, message, parameters } = periodForm({ formId, path, submit, csvName, fields, filters });
  const result = h("div", { id: resultId });
  container.append(h("section", { class: "card" }, form, message.element), result);

  const run = async () => {
    message.clear();
    try {
      fill(result, show(await get(`${path}${query(parameters())}`)));
    } catch (error) {
      clear(result);
      message.error(error);
    }
  };
  onSubmit(form, run);
  await run();
}

/** An `ok` / `mismatch` badge. */
export function statusBadge(status, attributes = {}) {
  return h("span", { ...attributes, class: `badge ${status === "ok" ? "ok" : "mismatch"}` }, status);
}

/** A report's heading: its status (`statusId`), its period and what its amounts are in. */
export function reportHeading(report, statusId, units) {
  return [
    h("h2", {}, "Result: ", statusBadge(report.status, { id: statusId })),
    h("p", { class: "muted" }, `${report.from} to ${report.to} (UTC; ${units}); books read up to ${report.generated_at}.`),
  ];
}

/** The failed checks of a report, by account: `of(account_id)` is the
 * account's list, `text(account_id)` says them ("—" when none). */
export function failedChecks(report) {
  const failed = new Map();
  for (const discrepancy of report.discrepancies) {
    const list = failed.get(discrepancy.account_id) || [];
    list.push(discrepancy);
    failed.set(discrepancy.account_id, list);
  }
  const of = (accountId) => failed.get(accountId) || [];
  const text = (accountId) => of(accountId).map((check) => `${check.check} (expected ${check.expected}, got ${check.actual})`).join("; ") || "—";
  return { of, text };
}

/** A report line's account: its name, linked to its page. */
export function accountCell(line) {
  return h("td", { class: "account-name" }, h("a", { href: `#/accounts/${line.account_id}` }, line.name));
}
