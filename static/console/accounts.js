// Accounts: search by name and status, page with the API's cursor, sort
// the page by a balance, and (admin) create an account.

import { freshId, get, query, request } from "./api.js";
import { clear, field, fill, h, messageArea, onSubmit, table, tokens } from "./dom.js";

const PAGE_SIZE = 25;

/** The low-balance marker, when the account has a threshold (0 = off). */
export function isLow(account) {
  const threshold = account.low_balance_threshold;
  return typeof threshold === "number" && threshold > 0 && account.available < threshold;
}

export function lowMarker(account) {
  return isLow(account)
    ? h("span", { class: "badge low", title: `below ${account.low_balance_threshold}` }, "low balance")
    : null;
}

export function statusBadge(status) {
  return h("span", { class: `badge ${status}` }, status);
}

export async function renderAccounts(container, context) {
  container.append(h("h1", {}, "Accounts"));

  if (context.canWrite) container.append(createForm(context));

  const search = field("Name contains", { type: "search", name: "q", autocomplete: "off" });
  const status = field(
    "Status",
    { name: "status" },
    "select",
    h("option", { value: "" }, "any"),
    h("option", { value: "active" }, "active"),
    h("option", { value: "suspended" }, "suspended"),
  );
  const sort = field(
    "Sort this page by",
    { name: "sort" },
    "select",
    h("option", { value: "" }, "oldest first"),
    h("option", { value: "available-desc" }, "available, highest first"),
    h("option", { value: "available-asc" }, "available, lowest first"),
    h("option", { value: "used-desc" }, "used, highest first"),
    h("option", { value: "reserved-desc" }, "reserved, highest first"),
  );
  const form = h(
    "form",
    { class: "toolbar", role: "search", "aria-label": "Find accounts" },
    search.element,
    status.element,
    sort.element,
    h("button", { type: "submit" }, "Search"),
  );
  const message = messageArea();
  const results = h("div", { id: "account-list" });
  const pager = h("div", { class: "pager" });
  container.append(h("section", { class: "card" }, form, message.element, results, pager));

  // Cursors of the pages seen, so "Previous" works: cursors[i] is page i's `after`.
  let cursors = [null];
  let pageIndex = 0;
  let accounts = [];

  const show = () => {
    const order = sort.control.value;
    const shown = [...accounts];
    if (order) {
      const [column, direction] = order.split("-");
      shown.sort((a, b) => (direction === "asc" ? a[column] - b[column] : b[column] - a[column]));
    }
    fill(results,
      table(
        "Accounts",
        ["Name", "Status", "Available", "Reserved", "Used", "Low balance"],
        shown.map((account) =>
          h(
            "tr",
            { "data-account-id": account.account_id, class: isLow(account) ? "low" : null },
            h("td", {}, h("a", { href: `#/accounts/${account.account_id}` }, account.name)),
            h("td", {}, statusBadge(account.status)),
            h("td", { class: "number", "data-field": "available" }, tokens(account.available)),
            h("td", { class: "number", "data-field": "reserved" }, tokens(account.reserved)),
            h("td", { class: "number", "data-field": "used" }, tokens(account.used)),
            h("td", {}, lowMarker(account)),
          ),
        ),
        { id: "accounts-table" },
      ),
    );
    if (shown.length === 0) results.append(h("p", {}, "No account matches."));
  };

  const load = async () => {
    message.clear();
    try {
      const page = await get(
        `/v1/accounts${query({
          q: search.control.value.trim(),
          status: status.control.value,
          limit: PAGE_SIZE,
          after: cursors[pageIndex],
        })}`,
      );
      accounts = page.accounts;
      cursors = cursors.slice(0, pageIndex + 1);
      if (page.next_after) cursors.push(page.next_after);
      show();
      fill(pager,
        h("button", { type: "button", disabled: pageIndex === 0, onclick: () => { pageIndex -= 1; load(); } }, "Previous page"),
        h("span", {}, ` Page ${pageIndex + 1} `),
        h("button", { type: "button", disabled: !page.next_after, onclick: () => { pageIndex += 1; load(); } }, "Next page"),
      );
    } catch (error) {
      message.error(error);
    }
  };

  onSubmit(form, async () => {
    cursors = [null];
    pageIndex = 0;
    await load();
  });
  sort.control.addEventListener("change", show);
  await load();
}

function createForm(context) {
  const name = field("Name", { name: "name", required: true, maxlength: 200, autocomplete: "off" });
  const limit = field("Max. held reservations (0 = unlimited)", {
    name: "max_active_reservations", type: "number", min: 0, max: 100000, value: 50,
  });
  const message = messageArea();
  const form = h(
    "form",
    { class: "toolbar", id: "create-account", "aria-label": "New account" },
    name.element,
    limit.element,
    h("button", { type: "submit" }, "Create account"),
  );
  // One Idempotency-Key per account being created: a retry or a double
  // submit of the same form creates one account.
  let idempotencyKey = freshId("console-account");
  onSubmit(form, async () => {
    message.clear();
    try {
      const { data } = await request("/v1/accounts", {
        method: "POST",
        headers: { "Idempotency-Key": idempotencyKey },
        body: { name: name.control.value, max_active_reservations: Number(limit.control.value) },
      });
      idempotencyKey = freshId("console-account");
      context.flash(`Account “${data.name}” created.`);
      context.navigate(`#/accounts/${data.account_id}`);
    } catch (error) {
      message.error(error);
    }
  });
  return h("section", { class: "card" }, h("h2", {}, "New account"), form, message.element);
}
