// Revenue: a period in money, per currency — deferred revenue at both
// ends, sales, recognized revenue, breakage, adjustments — the same in
// tokens beside the unpriced grants' tokens, a chart per currency of the
// revenue recognized and the breakage of each UTC day, the per-account
// lines with their failed checks, and the CSV. The API's money is integer
// minor units (2000 is 20.00 EUR); money() only writes it for display.

import { dayBarChart, daysOf } from "./chart.js";
import { field, h, money, table, tokens } from "./dom.js";
import { accountCell, failedChecks, renderPeriodPage, reportHeading, statusBadge } from "./period.js";

const MONEY = {
  deferred_opening: "Deferred opening",
  sales: "Sales",
  recognized: "Recognized",
  breakage: "Breakage",
  adjustments: "Adjustments",
  deferred_closing: "Deferred closing",
};
const TOKENS = {
  deferred_opening: "Deferred opening",
  sold: "Sold",
  used: "Used",
  lapsed: "Lapsed",
  adjusted: "Adjusted",
  deferred_closing: "Deferred closing",
};
const DAY_SERIES = ["recognized", "breakage"];

export function renderRevenue(container) {
  const currency = field("Currency (optional)", {
    name: "currency", placeholder: "all", maxlength: 3, size: 6, pattern: "[A-Za-z]{3}", autocomplete: "off",
    title: "An ISO 4217 code such as EUR; empty: every currency",
  });
  return renderPeriodPage(container, {
    title: "Revenue",
    path: "/v1/revenue",
    formId: "revenue-form",
    resultId: "revenue-result",
    submit: "Report",
    csvName: "revenue",
    fields: [currency],
    filters: () => ({ currency: currency.control.value.trim().toUpperCase() }),
    show,
  });
}

/** The money figures of a currency line: for display, and in minor units (`data-minor`). */
function moneyCells(line) {
  return Object.keys(MONEY).map((name) =>
    h("td", { class: "number", "data-field": name, "data-minor": line[name] }, money(line[name], line.currency)));
}

function tokenCells(figures) {
  return Object.keys(TOKENS).map((name) => h("td", { class: "number", "data-field": name }, tokens(figures[name])));
}

function show(report) {
  const failed = failedChecks(report);
  const tokenRows = report.currencies.map((line) =>
    h("tr", { "data-currency": line.currency }, h("th", { scope: "row" }, line.currency), tokenCells(line.tokens)));
  if (report.unpriced_tokens) {
    tokenRows.push(h("tr", { "data-currency": "unpriced" }, h("th", { scope: "row" }, "unpriced"), tokenCells(report.unpriced_tokens)));
  }
  // An account's money lines; one without any but with a failed check
  // still gets a line, to show it.
  const accountRows = report.accounts.flatMap((account) => {
    const lines = account.currencies.length || !failed.of(account.account_id).length ? account.currencies : [{ currency: "—" }];
    return lines.map((line) =>
      h(
        "tr",
        { class: failed.of(account.account_id).length ? "failed" : null, "data-account-id": account.account_id, "data-currency": line.currency },
        accountCell(account),
        h("td", {}, statusBadge(account.status)),
        h("td", {}, line.currency),
        moneyCells(line),
        h("td", {}, failed.text(account.account_id)),
      ));
  });
  const unpricedRows = report.accounts
    .filter((account) => account.unpriced_tokens && Object.values(account.unpriced_tokens).some((value) => value !== 0))
    .map((account) =>
      h("tr", { "data-account-id": account.account_id }, accountCell(account), tokenCells(account.unpriced_tokens)));

  return [
    h(
      "section",
      { class: "card", id: "revenue-summary", "data-from": report.from, "data-to": report.to },
      reportHeading(report, "revenue-status", "money in each currency's units, from the API's integer minor units"),
      report.currencies.length
        ? table(
          "Totals per currency",
          ["Currency", ...Object.values(MONEY)],
          report.currencies.map((line) => h("tr", { "data-currency": line.currency }, h("th", { scope: "row" }, line.currency), moneyCells(line))),
          { id: "revenue-table", class: "money" },
        )
        : h("p", {}, "No priced grant in this period: nothing to value."),
      tokenRows.length
        ? table("The same in tokens, and the unpriced grants' tokens", ["Grants", ...Object.values(TOKENS)], tokenRows, { id: "revenue-tokens-table", class: "money" })
        : null,
      report.unpriced_tokens
        ? null
        : h("p", { class: "muted" }, "A report for one currency leaves the unpriced grants' tokens out."),
    ),
    h(
      "section",
      { class: "card" },
      h("h2", {}, "Per day"),
      report.currencies.length
        ? report.currencies.flatMap((line) => dayChart(report, line))
        : h("p", {}, "Nothing to draw."),
    ),
    h(
      "section",
      { class: "card" },
      h("h2", {}, "Accounts"),
      accountRows.length
        ? table(
          "Accounts with priced grants",
          ["Account", "Status", "Currency", ...Object.values(MONEY), "Failed checks"],
          accountRows,
          { id: "revenue-accounts-table", class: "money" },
        )
        : h("p", {}, "No account had priced grants by the end of this period."),
      unpricedRows.length
        ? table("Unpriced grants' tokens per account", ["Account", ...Object.values(TOKENS)], unpricedRows, { id: "revenue-unpriced-table", class: "money" })
        : null,
    ),
  ];
}

/** A currency's recognized revenue and breakage per UTC day, as bars. */
function dayChart(report, line) {
  const { currency } = line;
  const days = daysOf(report.from, report.to);
  const values = report.days.filter((day) => day.currency === currency && days.includes(day.day));
  const summary = `${currency}: recognized ${money(line.recognized, currency)}, breakage ${money(line.breakage, currency)} `
    + `over ${days.length} UTC days, ${values.length} of them with revenue or breakage.`;
  return [
    h("h3", {}, currency),
    dayBarChart({ id: `revenue-chart-${currency}`, "data-currency": currency }, summary, days, values, DAY_SERIES, {
      format: (value) => money(value, currency),
      valueAttribute: "data-minor",
      title: (day, name) => `${day.day}: ${name} ${money(day[name], currency)} ${currency}`,
    }),
  ];
}
