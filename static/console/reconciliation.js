// Reconciliation: a period, the totals, the per-account lines with their
// failed checks highlighted and linked to the account, and the CSV.

import { h, table, tokens } from "./dom.js";
import { accountCell, failedChecks, renderPeriodPage, reportHeading, statusBadge } from "./period.js";

export function renderReconciliation(container) {
  return renderPeriodPage(container, {
    title: "Reconciliation",
    path: "/v1/reconciliation",
    formId: "reconciliation-form",
    resultId: "reconciliation-result",
    submit: "Reconcile",
    csvName: "reconciliation",
    show,
  });
}

function show(report) {
  const failed = failedChecks(report);
  const totals = report.totals;
  const totalNames = ["accounts", "opening", "credited", "adjusted", "committed", "grant_expired", "closing", "reserved", "released", "expired", "jobs_succeeded", "job_commit_entries"];
  return [
    h(
      "section",
      { class: "card" },
      reportHeading(report, "reconciliation-status", "amounts in tokens"),
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
          report.accounts.map((line) =>
            h(
              "tr",
              { class: failed.of(line.account_id).length ? "failed" : null, "data-account-id": line.account_id },
              accountCell(line),
              h("td", {}, h("code", {}, line.account_id)),
              h("td", {}, statusBadge(line.status)),
              h("td", { class: "number" }, tokens(line.opening)),
              h("td", { class: "number" }, tokens(line.credited)),
              h("td", { class: "number" }, tokens(line.adjusted)),
              h("td", { class: "number" }, tokens(line.committed)),
              h("td", { class: "number" }, tokens(line.grant_expired)),
              h("td", { class: "number" }, tokens(line.closing)),
              h("td", {}, failed.text(line.account_id)),
            ),
          ),
          { id: "reconciliation-table" },
        )
        : h("p", {}, "No account had activity in this period."),
    ),
  ];
}
