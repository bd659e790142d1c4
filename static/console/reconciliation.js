// Reconciliation: a period, the totals, the per-account lines with their
// failed checks highlighted and linked to the account, and the CSV.

import { get, query, request } from "./api.js";
import { busyButton, clear, field, fill, h, messageArea, onSubmit, table, tokens } from "./dom.js";

/** `<input type=datetime-local step=1>` value (UTC, to the second) ↔ Date. */
function toLocalInput(date) {
  return date.toISOString().slice(0, 19);
}
function fromLocalInput(value) {
  return new Date(value.length === 16 ? `${value}:00Z` : `${value}Z`);
}

export async function renderReconciliation(container, context) {
  container.append(h("h1", {}, "Reconciliation"));
  // "To" is now (to the second: the books up to this instant), "From" 30
  // days before, as the API's defaults.
  const to = new Date(Math.floor(Date.now() / 1000) * 1000);
  const from = new Date(to.getTime() - 30 * 86400 * 1000);
  const fromField = field("From (UTC, inclusive)", { type: "datetime-local", step: 1, name: "from", required: true, value: toLocalInput(from) });
  const toField = field("To (UTC, exclusive)", { type: "datetime-local", step: 1, name: "to", required: true, value: toLocalInput(to) });
  const message = messageArea();
  const result = h("div", { id: "reconciliation-result" });
  const period = () => ({
    from: fromLocalInput(fromField.control.value).toISOString(),
    to: fromLocalInput(toField.control.value).toISOString(),
  });
  const download = busyButton("Download CSV", { id: "download-csv" }, async () => {
    message.clear();
    try {
      const { from: start, to: end } = period();
      const { data, headers } = await request(`/v1/reconciliation${query({ from: start, to: end })}`, { accept: "text/csv" });
      // The service names the file after the period (Content-Disposition).
      const named = /filename="?([^";]+)"?/.exec(headers.get("Content-Disposition") || "");
      const link = h("a", {
        href: URL.createObjectURL(new Blob([data], { type: "text/csv" })),
        download: named ? named[1] : `reconciliation_${start.slice(0, 16)}_${end.slice(0, 16)}.csv`.replace(/:/g, "-"),
      });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 60000);
      message.ok("CSV downloaded.");
    } catch (error) {
      message.error(error);
    }
  });
  const form = h(
    "form",
    { class: "toolbar", id: "reconciliation-form", "aria-label": "Period" },
    fromField.element,
    toField.element,
    h("button", { type: "submit" }, "Reconcile"),
    download,
  );
  container.append(h("section", { class: "card" }, form, message.element), result);

  const run = async () => {
    message.clear();
    try {
      const report = await get(`/v1/reconciliation${query(period())}`);
      show(report);
    } catch (error) {
      clear(result);
      message.error(error);
    }
  };

  const show = (report) => {
    const failed = new Map();
    for (const discrepancy of report.discrepancies) {
      const list = failed.get(discrepancy.account_id) || [];
      list.push(discrepancy);
      failed.set(discrepancy.account_id, list);
    }
    const totals = report.totals;
    const totalNames = ["accounts", "opening", "credited", "adjusted", "committed", "grant_expired", "closing", "reserved", "released", "expired", "jobs_succeeded", "job_commit_entries"];
    fill(result,
      h(
        "section",
        { class: "card" },
        h("h2", {}, "Result: ", h("span", { id: "reconciliation-status", class: `badge ${report.status === "ok" ? "ok" : "mismatch"}` }, report.status)),
        h("p", { class: "muted" }, `${report.from} to ${report.to} (UTC; amounts in tokens); books read up to ${report.generated_at}.`),
        table("Totals", totalNames, [h("tr", {}, totalNames.map((name) => h("td", { class: "number", "data-total": name }, tokens(totals[name]))))], { id: "totals-table" }),
      ),
      h(
        "section",
        { class: "card" },
        h("h2", {}, "Accounts"),
        report.accounts.length
          ? table(
            "Accounts of the period",
            ["Account", "Account id", "Status", "Opening", "Credited", "Adjusted", "Committed", "Grant expired", "Closing", "Failed checks"],
            report.accounts.map((line) => {
              const checks = failed.get(line.account_id) || [];
              return h(
                "tr",
                { class: checks.length ? "failed" : null, "data-account-id": line.account_id },
                h("td", { class: "account-name" }, h("a", { href: `#/accounts/${line.account_id}` }, line.name)),
                h("td", {}, h("code", {}, line.account_id)),
                h("td", {}, h("span", { class: `badge ${line.status === "ok" ? "ok" : "mismatch"}` }, line.status)),
                h("td", { class: "number" }, tokens(line.opening)),
                h("td", { class: "number" }, tokens(line.credited)),
                h("td", { class: "number" }, tokens(line.adjusted)),
                h("td", { class: "number" }, tokens(line.committed)),
                h("td", { class: "number" }, tokens(line.grant_expired)),
                h("td", { class: "number" }, tokens(line.closing)),
                h("td", {}, checks.map((check) => `${check.check} (expected ${check.expected}, got ${check.actual})`).join("; ") || "—"),
              );
            }),
            { id: "reconciliation-table" },
          )
          : h("p", {}, "No account had activity in this period."),
      ),
    );
  };

  onSubmit(form, run);
  await run();
}
