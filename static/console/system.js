// System: readiness, the reaper's last pass and the invariant, tokens and
// jobs in flight, and the answering replica's provider error ratio and
// repairs. One request (GET /v1/system/summary), refreshed every 10 s.

import { get } from "./api.js";
import { busyButton, clear, countdown, fill, h, messageArea, table, time, tokens } from "./dom.js";

export async function renderSystem(container, context) {
  container.append(h("h1", {}, "System"));
  const message = messageArea();
  const body = h("div", { id: "system-summary" });
  const updated = h("span", { class: "muted" });
  const load = async () => {
    try {
      show(await get("/v1/system/summary"));
      message.clear();
      updated.textContent = ` Updated ${time(new Date().toISOString())}; refreshes every 10 s.`;
    } catch (error) {
      message.error(error);
    }
  };
  container.append(h("div", { class: "toolbar" }, busyButton("Refresh", { id: "refresh-system" }, load), updated), message.element, body);

  const tile = (id, label, value, status, note) =>
    h(
      "div",
      { class: `figure ${status || ""}`, id },
      h("span", { class: "figure-label" }, label),
      h("span", { class: "figure-value" }, value),
      note ? h("span", { class: "figure-note" }, note) : null,
    );

  const show = (summary) => {
    const database = summary.database;
    const replica = summary.replica;
    const reaperAge = database.reaper_last_success_at
      ? countdown(database.reaper_last_success_at).replace(/^expired /, "").replace(/^in .*/, "just now")
      : "never";
    const ratio = replica.provider_error_ratio;
    const counts = (object) => Object.entries(object).map(([name, count]) => h("tr", {}, h("td", {}, name), h("td", { class: "number" }, tokens(count))));
    fill(body,
      h(
        "section",
        { class: "card" },
        h("h2", {}, "Health"),
        h(
          "div",
          { class: "figures" },
          tile("system-readiness", "readiness", summary.readiness, summary.ready ? "ok" : "bad"),
          tile("system-invariant", "invariant", summary.invariant_status, summary.invariant_status === "ok" ? "ok" : summary.invariant_status === "violated" ? "bad" : ""),
          tile("system-reaper", "reaper last pass", reaperAge, database.reaper_last_success_at ? "" : "bad"),
          tile("system-violations", "accounts violating", database.invariant_violations ?? "—"),
        ),
      ),
      h(
        "section",
        { class: "card" },
        h("h2", {}, "In flight"),
        h(
          "div",
          { class: "figures" },
          tile("system-held", "held reservations", tokens(database.reservations_held)),
          tile("system-reserved", "reserved tokens", tokens(database.reserved_tokens)),
          tile("system-oldest", "oldest held", database.oldest_reservation_age_seconds == null ? "—" : `${Math.round(database.oldest_reservation_age_seconds)} s`),
          tile("system-next-expiry", "next expiry", database.next_expiry_at ? countdown(database.next_expiry_at) : "—"),
          tile("system-queued", "jobs queued", tokens(database.jobs_queued)),
          tile("system-running", "jobs running", tokens(database.jobs_running)),
          tile("system-accounts", "accounts", tokens(database.accounts), "", `${tokens(database.accounts_suspended)} suspended`),
        ),
      ),
      h(
        "section",
        { class: "card" },
        h("h2", {}, `This replica (version ${replica.version}, since it started)`),
        h(
          "div",
          { class: "figures" },
          tile("system-provider-errors", "provider error ratio", ratio == null ? "no requests yet" : `${(ratio * 100).toFixed(1)} %`, ratio > 0.1 ? "bad" : ""),
        ),
        table("Provider requests by outcome", ["outcome", "requests"], counts(replica.provider_requests)),
        table("Jobs finished by status", ["status", "jobs"], counts(replica.jobs_finished)),
        table("Reaper repairs by kind", ["kind", "repairs"], counts(replica.repairs)),
      ),
    );
  };
  context.every(10000, load);
  await load();
}
