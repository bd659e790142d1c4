// One account: balances and the invariant, its credit grants, its
// automatic top-up rules, the balance chart over a period, the usage per
// booth (kiosk key) of a period with its chart by day, reservations in
// flight, recent jobs, the ledger, and (admin) kiosk keys, credit,
// adjustment, suspend/reactivate and limits. Nine requests: the account,
// its grants, its top-up rules, the period's ledger, the usage by key and
// by day, held reservations, recent jobs, and (admin) the account's keys.

import { freshId, get, query, request } from "./api.js";
import { balanceChart, dayBarChart, daysOf, pointsOf } from "./chart.js";
import {
  busyButton,
  clear,
  countdown,
  field,
  fill,
  h,
  messageArea,
  onSubmit,
  table,
  time,
  tokens,
} from "./dom.js";
import { lowMarker, statusBadge } from "./accounts.js";
import { periodForm } from "./period.js";

const PERIODS = [
  ["15m", "last 15 minutes", 900],
  ["1h", "last hour", 3600],
  ["6h", "last 6 hours", 6 * 3600],
  ["24h", "last 24 hours", 86400],
  ["7d", "last 7 days", 7 * 86400],
  ["30d", "last 30 days", 30 * 86400],
];
/** The chart reads at most this many ledger pages of 1,000 entries. */
const LEDGER_PAGES_MAX = 5;
const LEDGER_ROWS_PER_PAGE = 20;
/** The grants card reads at most this many pages of 100 grants. */
const GRANT_PAGES_MAX = 5;
/** The usage card's figures: the API's names and their columns. */
const USAGE_FIGURES = [
  ["reserved", "Reserved"],
  ["used", "Used"],
  ["released", "Released"],
  ["expired", "Expired"],
  ["jobs_succeeded", "Jobs succeeded"],
  ["jobs_failed", "Jobs failed"],
];
/** The usage chart's bars per day. */
const USAGE_SERIES = ["used", "released", "expired"];
/** Times the usage card asks again while its period's end is not closed
 * yet (409 instant_not_closed), each after the answer's Retry-After. */
const USAGE_RETRIES = 3;

/** An `<input type=datetime-local>` value, read as UTC, in RFC 3339 ("2026-12-05T10:00:00Z"). */
function utcFromInput(value) {
  const seconds = value.length === 16 ? `${value}:00` : value;
  return new Date(`${seconds}Z`).toISOString().replace(/\.000Z$/, "Z");
}

export async function renderAccount(container, context, accountId) {
  const base = `/v1/accounts/${encodeURIComponent(accountId)}`;
  const state = { period: "1h", ledgerPage: 0 };
  const sections = {
    header: h("div"),
    balances: h("section", { class: "card", "aria-labelledby": "balances-title" }),
    grants: h("section", { class: "card", "aria-labelledby": "grants-title" }),
    topups: h("section", { class: "card", "aria-labelledby": "topups-title" }),
    chart: h("section", { class: "card", "aria-labelledby": "chart-title" }),
    usage: h("section", { class: "card", id: "usage-card", "aria-labelledby": "usage-title" }),
    inFlight: h("section", { class: "card", "aria-labelledby": "in-flight-title" }),
    jobs: h("section", { class: "card", "aria-labelledby": "jobs-title" }),
    ledger: h("section", { class: "card", "aria-labelledby": "ledger-title" }),
    keys: h("section", { class: "card", "aria-labelledby": "keys-title" }),
    admin: h("div", { class: "admin-grid" }),
  };
  container.append(
    h("p", {}, h("a", { href: "#/accounts" }, "← All accounts")),
    sections.header,
    sections.balances,
    sections.grants,
    sections.topups,
    sections.chart,
    sections.usage,
    sections.inFlight,
    sections.jobs,
    sections.ledger,
  );
  if (context.canWrite) container.append(sections.admin, sections.keys);

  let account = await get(base);
  let entries = [];
  let period = null;

  const showAccount = () => {
    fill(sections.header,
      h("h1", { id: "account-name" }, account.name, " ", statusBadge(account.status), " ", lowMarker(account)),
      h("p", { class: "muted" }, `Account ${account.account_id} · created ${time(account.created_at)}`),
    );
    const inflow = account.credited + account.adjusted;
    const grantExpired = account.grant_expired;
    const accounted = account.available + account.reserved + account.used + grantExpired;
    const holds = inflow === accounted;
    const figure = (name, value) =>
      h("div", { class: "figure" }, h("span", { class: "figure-label" }, name), h("span", { class: "figure-value", id: `balance-${name}` }, tokens(value)));
    fill(sections.balances,
      h("h2", { id: "balances-title" }, "Balances"),
      h(
        "div",
        { class: "figures" },
        figure("available", account.available),
        figure("reserved", account.reserved),
        figure("used", account.used),
        figure("credited", account.credited),
        figure("adjusted", account.adjusted),
      ),
      h(
        "p",
        { id: "invariant", class: holds ? "invariant ok" : "invariant broken" },
        `credited ${tokens(account.credited)} + adjusted ${tokens(account.adjusted)} = ${tokens(inflow)}`,
        holds ? " = " : " ≠ ",
        `available ${tokens(account.available)} + reserved ${tokens(account.reserved)} + used ${tokens(account.used)} + grant expired ${tokens(grantExpired)} = ${tokens(accounted)}`,
        holds ? " ✓ holds" : " ✗ broken",
      ),
      h(
        "p",
        { class: "muted" },
        `${account.active_reservations} held reservation(s) of at most ${account.max_active_reservations || "unlimited"}`,
        typeof account.low_balance_threshold === "number"
          ? ` · low-balance threshold ${account.low_balance_threshold || "off"}`
          : "",
      ),
    );
  };

  const loadLedger = async () => {
    const seconds = PERIODS.find(([id]) => id === state.period)[2];
    const to = new Date();
    const from = new Date(to.getTime() - seconds * 1000);
    const loaded = [];
    let after = null;
    let truncated = false;
    for (let page = 0; page < LEDGER_PAGES_MAX; page += 1) {
      const data = await get(`${base}/ledger${query({ since: from.toISOString(), limit: 1000, after })}`);
      loaded.push(...data.entries);
      after = data.next_after;
      if (!after) break;
      truncated = page === LEDGER_PAGES_MAX - 1;
    }
    entries = loaded;
    period = { from, to, truncated };
  };

  const showChart = () => {
    const picker = field(
      "Period",
      { id: "chart-period" },
      "select",
      PERIODS.map(([id, text]) => h("option", { value: id, selected: id === state.period }, text)),
    );
    picker.control.addEventListener("change", async () => {
      state.period = picker.control.value;
      state.ledgerPage = 0;
      try {
        await loadLedger();
        showChart();
        showLedger();
      } catch (error) {
        context.flash(error.message);
      }
    });
    const points = pointsOf(entries, period.from, period.to, account);
    const last = points[points.length - 1];
    const summary =
      `${entries.length} ledger entries in the ${PERIODS.find(([id]) => id === state.period)[1]}; ` +
      `at the end: available ${last.available}, reserved ${last.reserved}, used ${last.used}` +
      (period.truncated ? " (the first 5,000 entries of the period only)" : "");
    fill(sections.chart,
      h("h2", { id: "chart-title" }, "Balances over time"),
      h("div", { class: "toolbar" }, picker.element),
      balanceChart(points, period.from, period.to, summary),
    );
  };

  const showLedger = () => {
    const newestFirst = [...entries].reverse();
    const pages = Math.max(1, Math.ceil(newestFirst.length / LEDGER_ROWS_PER_PAGE));
    state.ledgerPage = Math.min(state.ledgerPage, pages - 1);
    const shown = newestFirst.slice(state.ledgerPage * LEDGER_ROWS_PER_PAGE, (state.ledgerPage + 1) * LEDGER_ROWS_PER_PAGE);
    fill(sections.ledger,
      h("h2", { id: "ledger-title" }, "Ledger"),
      h("p", { class: "muted" }, "Entries of the chart's period, newest first."),
      table(
        "Ledger entries",
        ["Entry", "Time", "Kind", "Amount", "Available after", "Reserved after", "Used after", "Reference", "Actor"],
        shown.map((entry) =>
          h(
            "tr",
            { "data-kind": entry.kind },
            h("td", { class: "number" }, entry.entry_id),
            h("td", {}, time(entry.created_at)),
            h("td", {}, entry.kind),
            h("td", { class: "number" }, tokens(entry.amount)),
            h("td", { class: "number" }, tokens(entry.available_after)),
            h("td", { class: "number" }, tokens(entry.reserved_after)),
            h("td", { class: "number" }, tokens(entry.used_after)),
            h("td", {}, entry.external_ref || entry.reason || entry.reservation_id || ""),
            h("td", {}, entry.actor),
          ),
        ),
        { id: "ledger-table" },
      ),
      h(
        "div",
        { class: "pager" },
        h("button", { type: "button", disabled: state.ledgerPage === 0, onclick: () => { state.ledgerPage -= 1; showLedger(); } }, "Newer"),
        h("span", {}, ` Page ${state.ledgerPage + 1} of ${pages} `),
        h("button", { type: "button", disabled: state.ledgerPage >= pages - 1, onclick: () => { state.ledgerPage += 1; showLedger(); } }, "Older"),
      ),
    );
  };

  // Usage per booth: the API's report by key (the table) and by day (the
  // chart) for the card's period; every figure is the API's, none is
  // added up here.
  const usage = periodForm({
    formId: "usage-form",
    path: `${base}/usage`,
    submit: "Show usage",
    csvName: "usage",
    downloadId: "usage-download-csv",
    filters: () => ({ group_by: "key" }),
  });
  const usageResult = h("div", { id: "usage-result" });
  fill(sections.usage,
    h("h2", { id: "usage-title" }, "Usage per booth"),
    h("p", { class: "muted" }, "What each kiosk key reserved, used, released and let expire, and how its jobs ended. A reservation counts for the key that made it; “no key” is what no kiosk key made (an admin key, the CLI)."),
    usage.form,
    usage.message.element,
    usageResult,
  );
  let usageTicket = 0;
  // Never throws: an error is shown in the card.
  const loadUsage = async () => {
    usageTicket += 1;
    const ticket = usageTicket;
    usage.message.clear();
    const chosen = usage.parameters();
    for (let attempt = 0; ; attempt += 1) {
      try {
        const [byKey, byDay] = await Promise.all([
          get(`${base}/usage${query(chosen)}`),
          get(`${base}/usage${query({ ...chosen, group_by: "day" })}`),
        ]);
        if (ticket !== usageTicket) return;
        usage.message.clear();
        fill(usageResult, showUsage(byKey, byDay));
        return;
      } catch (error) {
        if (ticket !== usageTicket) return;
        if (error.code === "instant_not_closed" && attempt < USAGE_RETRIES) {
          const seconds = Math.min(Math.max(error.retryAfter || 1, 1), 10);
          usage.message.ok(`The books up to ${time(chosen.to)} are not closed yet; asking again in ${seconds} s.`);
          await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
          continue;
        }
        clear(usageResult);
        usage.message.error(error);
        return;
      }
    }
  };
  onSubmit(usage.form, loadUsage);

  const showUsage = (report, days) => {
    const cells = (figures) => USAGE_FIGURES.map(([name]) => h("td", { class: "number", "data-field": name }, tokens(figures[name])));
    const rows = report.lines.map((line) => h(
      "tr",
      { "data-key-id": line.api_key_id || "none" },
      h("th", { scope: "row", "data-field": "booth", title: line.api_key_id },
        line.api_key_id ? line.label || line.api_key_id : "no key"),
      cells(line),
    ));
    rows.push(h("tr", { class: "totals", "data-key-id": "totals" }, h("th", { scope: "row", "data-field": "booth" }, "Totals"), cells(report.totals)));
    const dayList = daysOf(days.from, days.to);
    const summary = `Per UTC day: used ${tokens(days.totals.used)}, released ${tokens(days.totals.released)} and expired ${tokens(days.totals.expired)} tokens `
      + `over ${dayList.length} days, ${days.lines.length} of them with reservations.`;
    return [
      h("p", { class: "muted", id: "usage-period", "data-from": report.from, "data-to": report.to }, `${time(report.from)} to ${time(report.to)}.`),
      report.lines.length
        ? table(
          "Usage per booth, and the totals",
          [h("th", { scope: "col" }, "Booth"), ...USAGE_FIGURES.map(([, title]) => h("th", { scope: "col", class: "number" }, title))],
          rows,
          { id: "usage-table" },
        )
        : h("p", { id: "usage-none" }, "No reservation in this period."),
      dayBarChart({ id: "usage-chart" }, summary, dayList, days.lines, USAGE_SERIES, {
        format: tokens,
        valueAttribute: "data-tokens",
        title: (line, name) => `${line.day}: ${name} ${tokens(line[name])} tokens`,
      }),
    ];
  };

  let grants = [];
  let grantsTruncated = false;
  const loadGrants = async () => {
    const loaded = [];
    let after = null;
    let truncated = false;
    for (let page = 0; page < GRANT_PAGES_MAX; page += 1) {
      const data = await get(`${base}/grants${query({ limit: 100, after })}`);
      loaded.push(...data.grants);
      after = data.next_after;
      if (!after) break;
      truncated = page === GRANT_PAGES_MAX - 1;
    }
    grants = loaded;
    grantsTruncated = truncated;
  };

  const grantCountdowns = [];
  const showGrants = () => {
    grantCountdowns.length = 0;
    const rows = grants.map((grant) => {
      const expires = h("td", { "data-field": "expires" });
      if (!grant.expires_at) {
        expires.append("never");
      } else if (grant.status === "active") {
        const left = h("span", { class: "countdown", "data-expires-at": grant.expires_at }, countdown(grant.expires_at));
        grantCountdowns.push(left);
        expires.append(time(grant.expires_at), " · ", left);
      } else {
        expires.append(time(grant.expires_at));
      }
      return h(
        "tr",
        { "data-grant-id": grant.grant_id },
        // The last 8 characters (the first are a time prefix, UUIDv7: the
        // same for grants made within a minute), the whole id on hover: the
        // table fits its card.
        h("td", { "data-field": "grant" },
          h("code", { class: "id short", title: grant.grant_id, "aria-label": `grant ${grant.grant_id}` },
            `…${grant.grant_id.slice(-8)}`)),
        h("td", { class: "number", "data-field": "priority" }, grant.priority),
        h("td", { class: "number", "data-field": "amount" }, tokens(grant.amount)),
        h("td", { class: "number", "data-field": "remaining" }, tokens(grant.remaining)),
        h("td", { class: "number", "data-field": "reserved" }, tokens(grant.reserved)),
        h("td", { "data-field": "status" }, statusBadge(grant.status)),
        expires,
        h("td", { "data-field": "created" }, time(grant.created_at)),
      );
    });
    fill(sections.grants,
      h("h2", { id: "grants-title" }, "Grants"),
      h(
        "p",
        { class: "muted", id: "grants-draw-order" },
        "Draw order: reservations, jobs and removals take tokens from the lowest priority first (0 before 100), then from the grant that expires soonest (grants that never expire last), then from the oldest.",
      ),
      grants.length
        ? table("Credit grants, oldest first", ["Grant", "Priority", "Amount", "Remaining", "Reserved", "Status", "Expires", "Created"], rows, { id: "grants-table" })
        : h("p", { id: "grants-none" }, "No grants yet: every credit makes one."),
      grantsTruncated ? h("p", { class: "muted" }, `The first ${tokens(grants.length)} grants only.`) : null,
    );
  };

  // Automatic top-up rules (docs/topups.md), each with its last firing.
  let rules = [];
  const describeTrigger = (rule) => rule.trigger === "threshold"
    ? `below ${tokens(rule.threshold_tokens)}`
    : `${rule.period}${rule.anchor_day ? ` from day ${rule.anchor_day}` : ""} (${rule.time_zone})`;
  const describeAmount = (rule) => (rule.method === "fixed"
    ? `+${tokens(rule.tokens)}`
    : `up to ${tokens(rule.target_tokens)}`) + (rule.mode === "request" ? " (requested)" : "");
  const describeCaps = (rule) => [
    rule.max_tokens_per_day ? `${tokens(rule.max_tokens_per_day)}/day` : null,
    rule.max_tokens_per_month ? `${tokens(rule.max_tokens_per_month)}/month` : null,
  ].filter(Boolean).join(", ") || "none";
  // What the rule is doing (its `status`), in words; a rule that waits or
  // stopped says what it waits for.
  const describeState = (rule) => ({
    disabled: "disabled",
    scheduled: "enabled",
    request_open: "request open: waits for the customer's credit",
    armed: "armed",
    waiting_for_use: `waiting: fires again after ${tokens(rule.unconsumed_tokens)} more tokens are used or credited`,
    cap_reached: "stopped: cap reached, re-arms at the threshold",
    waiting_for_balance: "waiting: re-arms at the threshold",
  })[rule.status] || rule.status;
  const describeFiring = (firing) => {
    if (!firing) return "never";
    const what = firing.outcome === "cap_reached" ? `cap reached (${firing.cap_period})`
      : firing.outcome === "requested" ? `requested ${tokens(firing.tokens)}, ${firing.state}`
      : firing.outcome === "granted" ? `granted ${tokens(firing.tokens)}`
      : "nothing to add";
    return h("span", {}, what, " · ", time(firing.created_at));
  };
  const showTopups = () => {
    const rows = rules.map((rule) => h(
      "tr",
      { "data-rule-id": rule.rule_id },
      h("td", { "data-field": "rule" }, h("code", { class: "id" }, rule.rule_id)),
      h("td", { "data-field": "trigger" }, describeTrigger(rule)),
      h("td", { "data-field": "adds" }, describeAmount(rule)),
      h("td", { "data-field": "caps" }, describeCaps(rule)),
      h("td", { "data-field": "state", "data-status": rule.status }, describeState(rule)),
      h("td", { "data-field": "last-firing" }, describeFiring(rule.last_firing)),
    ));
    fill(sections.topups,
      h("h2", { id: "topups-title" }, "Automatic top-ups"),
      rules.length
        ? table("Top-up rules, oldest first", ["Rule", "Fires", "Adds", "Caps", "State", "Last firing"], rows, { id: "topups-table" })
        : h("p", { id: "topups-none" }, "No top-up rules: an admin adds them with POST /v1/accounts/{account_id}/topup-rules (docs/topups.md)."),
    );
  };

  let held = [];
  const countdowns = [];
  const showInFlight = () => {
    countdowns.length = 0;
    const rows = held.map((reservation) => {
      const cell = h("td", { "data-expires-at": reservation.expires_at }, countdown(reservation.expires_at));
      countdowns.push(cell);
      return h(
        "tr",
        {},
        h("td", {}, reservation.reservation_id),
        h("td", { class: "number" }, tokens(reservation.amount)),
        h("td", {}, time(reservation.created_at)),
        cell,
        h("td", {}, reservation.job_id || "—"),
      );
    });
    fill(sections.inFlight,
      h("h2", { id: "in-flight-title" }, "Reservations in flight"),
      held.length
        ? table("Held reservations", ["Reservation", "Tokens", "Created", "Expires", "Job"], rows, { id: "held-table" })
        : h("p", { id: "held-none" }, "No tokens in flight."),
    );
  };
  context.every(1000, () => {
    const now = Date.now();
    [...countdowns, ...grantCountdowns].forEach((cell) => {
      cell.textContent = countdown(cell.dataset.expiresAt, now);
    });
  });

  let jobs = [];
  const showJobs = () => {
    fill(sections.jobs,
      h("h2", { id: "jobs-title" }, "Recent jobs"),
      jobs.length
        ? table(
          "Recent jobs",
          ["Request", "Kind", "Status", "Cost", "Attempts", "Created", "Error"],
          jobs.map((job) =>
            h(
              "tr",
              { class: job.status === "failed" ? "failed" : null },
              h("td", {}, job.request_id),
              h("td", {}, job.kind),
              h("td", {}, h("span", { class: `badge ${job.status}` }, job.status)),
              h("td", { class: "number" }, tokens(job.cost)),
              h("td", { class: "number" }, job.attempts),
              h("td", {}, time(job.created_at)),
              h("td", {}, job.error ? `${job.error.code || ""} ${job.error.message || ""}`.trim() : ""),
            ),
          ),
          { id: "jobs-table" },
        )
        : h("p", {}, "No jobs yet."),
    );
  };

  const refresh = async () => {
    // The usage card's default period (untouched) ends now again.
    usage.reset();
    const requests = [
      get(base),
      loadLedger(),
      get(`${base}/reservations${query({ state: "held", limit: 100 })}`),
      get(`${base}/jobs${query({ limit: 10 })}`),
      loadGrants(),
      get(`${base}/topup-rules`),
      loadUsage(),
    ];
    const [fresh, , reservations, jobPage, , rulePage] = await Promise.all(requests);
    account = fresh;
    rules = rulePage.rules;
    held = reservations.reservations;
    jobs = jobPage.jobs;
    showAccount();
    showGrants();
    showTopups();
    showChart();
    showInFlight();
    showJobs();
    showLedger();
    if (context.canWrite) await showKeys();
  };

  // `created`: a key just made, whose secret this render shows (once).
  const showKeys = async (created) => {
    const page = await get(`/v1/api-keys${query({ account_id: account.account_id, limit: 100 })}`);
    const message = messageArea();
    const label = field("Label", { name: "label", required: true, maxlength: 200, autocomplete: "off" });
    const secret = h("div", { id: "new-key", "aria-live": "polite" });
    const form = h("form", { class: "toolbar", id: "create-key", "aria-label": "New kiosk key" }, label.element, h("button", { type: "submit" }, "Create kiosk key"));
    let idempotencyKey = freshId("console-key");
    onSubmit(form, async () => {
      message.clear();
      try {
        const { data } = await request(`${base}/api-keys`, {
          method: "POST",
          headers: { "Idempotency-Key": idempotencyKey },
          body: { scope: "kiosk", label: label.control.value },
        });
        idempotencyKey = freshId("console-key");
        await showKeys(data);
      } catch (error) {
        message.error(error);
      }
    });
    const rows = page.keys.map((key) => {
      const actions = h("td", {});
      if (!key.revoked_at) {
        actions.append(
          h("button", {
            type: "button",
            class: "danger",
            "aria-label": `Revoke key ${key.label}`,
            onclick: () => {
              fill(actions,
                h("span", {}, "Revoke? The kiosk stops working at once. "),
                busyButton("Yes, revoke", { class: "danger", "aria-label": `Confirm revoking key ${key.label}` }, async () => {
                  try {
                    await request(`/v1/api-keys/${key.key_id}`, { method: "DELETE" });
                    context.flash(`Key “${key.label}” revoked.`);
                    await showKeys();
                  } catch (error) {
                    message.error(error);
                  }
                }),
                h("button", { type: "button", onclick: () => showKeys() }, "Cancel"),
              );
            },
          }, "Revoke"),
        );
      }
      return h(
        "tr",
        { "data-key-id": key.key_id },
        h("td", {}, key.label),
        h("td", {}, key.key_id),
        h("td", {}, time(key.created_at)),
        h("td", {}, time(key.last_used_at)),
        h("td", {}, key.revoked_at ? `revoked ${time(key.revoked_at)}` : key.expires_at ? `expires ${time(key.expires_at)}` : "active"),
        actions,
      );
    });
    fill(sections.keys,
      h("h2", { id: "keys-title" }, "Kiosk keys"),
      form,
      message.element,
      secret,
      table("Kiosk keys", ["Label", "Key id", "Created", "Last used", "State", "Actions"], rows, { id: "keys-table" }),
    );
    if (created) showSecret(created);
    function showSecret(created) {
      const value = h("code", { id: "new-key-secret" }, created.key);
      const copied = h("span", { role: "status" });
      fill(secret,
        h(
          "div",
          { class: "secret" },
          h("p", {}, h("strong", {}, "Copy this key now: it is shown only once."), ` Kiosk key “${created.label}”:`),
          value,
          " ",
          h("button", {
            type: "button",
            id: "copy-key",
            onclick: async () => {
              try {
                await navigator.clipboard.writeText(created.key);
                copied.textContent = " Copied.";
              } catch (_) {
                getSelection().selectAllChildren(value);
                copied.textContent = " Selected: press Ctrl+C to copy.";
              }
            },
          }, "Copy"),
          copied,
        ),
      );
    }
  };

  if (context.canWrite) sections.admin.append(creditForm(), adjustForm(), statusCard(), limitsCard());

  function afterChange(text) {
    context.flash(text);
    return refresh();
  }

  function moneyForm(title, id, fields, build, describe) {
    const message = messageArea();
    const reference = field("External reference (makes a retry safe)", { name: "external_ref", required: true, maxlength: 200 });
    reference.control.value = freshId(`console-${id}`);
    const form = h("form", { id, "aria-label": title }, ...fields.map((f) => f.element), reference.element, h("button", { type: "submit" }, title));
    onSubmit(form, async () => {
      message.clear();
      try {
        const { data, headers } = await request(`${base}/${id === "credit" ? "credits" : "adjustments"}`, {
          method: "POST",
          body: { ...build(), external_ref: reference.control.value },
        });
        const replayed = headers.get("Idempotent-Replayed") === "true";
        message.ok(`${describe(data)}${replayed ? " (already done earlier with this reference: not applied twice)" : ""}; available now ${tokens(data.available)}.`);
        // The next operation needs a new reference; this one is spent.
        reference.control.value = freshId(`console-${id}`);
        fields.forEach((f) => {
          f.control.value = "";
        });
        await refresh();
      } catch (error) {
        message.error(error);
      }
    });
    return h("section", { class: "card" }, h("h2", {}, title), form, message.element);
  }

  function creditForm() {
    const amount = field("Tokens", { name: "amount", type: "number", min: 1, max: 1000000, required: true });
    const note = field("Note (optional)", { name: "note", maxlength: 1000 });
    const priority = field("Priority (optional; 0 is drawn first, default 50)", { name: "priority", type: "number", min: 0, max: 100, step: 1 });
    const expires = field("Expires at (UTC, optional)", { name: "expires_at", type: "datetime-local" });
    return moneyForm(
      "Credit",
      "credit",
      [amount, note, priority, expires],
      () => ({
        amount: Number(amount.control.value),
        ...(note.control.value ? { note: note.control.value } : {}),
        ...(priority.control.value !== "" ? { priority: Number(priority.control.value) } : {}),
        ...(expires.control.value ? { expires_at: utcFromInput(expires.control.value) } : {}),
      }),
      (data) =>
        `Credited ${tokens(data.amount)} tokens` +
        (typeof data.priority === "number"
          ? ` (priority ${data.priority}, ${data.expires_at ? `expires ${time(data.expires_at)}` : "never expires"})`
          : ""),
    );
  }

  function adjustForm() {
    const amount = field("Tokens (negative takes away)", { name: "amount", type: "number", min: -1000000, max: 1000000, required: true });
    const reason = field("Reason", { name: "reason", required: true, maxlength: 1000 });
    return moneyForm(
      "Adjust",
      "adjustment",
      [amount, reason],
      () => ({ amount: Number(amount.control.value), reason: reason.control.value }),
      (data) => `Adjusted by ${tokens(data.amount)} tokens`,
    );
  }

  function statusCard() {
    const card = h("section", { class: "card", id: "status-card" });
    const message = messageArea();
    const render = () => {
      const next = account.status === "active" ? "suspended" : "active";
      fill(card,
        h("h2", {}, "Status"),
        h("p", {}, "Now ", statusBadge(account.status), next === "suspended" ? ": kiosks can reserve." : ": kiosks cannot reserve."),
        busyButton(next === "suspended" ? "Suspend account" : "Reactivate account", { id: "toggle-status", class: next === "suspended" ? "danger" : null }, async () => {
          message.clear();
          try {
            account = (await request(base, { method: "PATCH", body: { status: next } })).data;
            await afterChange(`Account ${next === "suspended" ? "suspended" : "reactivated"}.`);
            render();
          } catch (error) {
            message.error(error);
          }
        }),
        message.element,
      );
    };
    render();
    return card;
  }

  function limitsCard() {
    const message = messageArea();
    const maxHeld = field("Max. held reservations (0 = unlimited)", { name: "max_active_reservations", type: "number", min: 0, max: 100000, required: true });
    maxHeld.control.value = account.max_active_reservations;
    const fields = [maxHeld];
    // Shown only when the service has the field (0 = off).
    let threshold = null;
    if (typeof account.low_balance_threshold === "number") {
      threshold = field("Low-balance threshold (0 = off)", { name: "low_balance_threshold", type: "number", min: 0, required: true });
      threshold.control.value = account.low_balance_threshold;
      fields.push(threshold);
    }
    const form = h("form", { id: "limits", "aria-label": "Limits" }, ...fields.map((f) => f.element), h("button", { type: "submit" }, "Save limits"));
    onSubmit(form, async () => {
      message.clear();
      const body = { max_active_reservations: Number(maxHeld.control.value) };
      if (threshold) body.low_balance_threshold = Number(threshold.control.value);
      try {
        account = (await request(base, { method: "PATCH", body })).data;
        message.ok("Limits saved.");
        await afterChange("Limits saved.");
      } catch (error) {
        message.error(error);
      }
    });
    return h("section", { class: "card" }, h("h2", {}, "Limits"), form, message.element);
  }

  const refreshButton = busyButton("Refresh", { id: "refresh-account" }, async () => {
    try {
      await refresh();
    } catch (error) {
      context.flash(error.message);
    }
  });
  container.insertBefore(h("div", { class: "toolbar" }, refreshButton), sections.balances);
  await refresh();
}
