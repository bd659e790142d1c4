// The balance chart: available, reserved and used over a period, drawn as
// step lines from the ledger's balances-after (a balance holds until the
// next entry). Plain SVG; colours come from console.css classes.

import { h, svg } from "./dom.js";

const WIDTH = 800;
const HEIGHT = 260;
const MARGIN = { top: 12, right: 16, bottom: 28, left: 56 };
export const SERIES = ["available", "reserved", "used"];

/** Balances before an entry, from the entry's balances-after (the engine's moves, inverted). */
export function balancesBefore(entry) {
  const after = { available: entry.available_after, reserved: entry.reserved_after, used: entry.used_after };
  const amount = entry.amount;
  switch (entry.kind) {
    case "credit":
    case "adjustment":
      return { ...after, available: after.available - amount };
    case "reserve":
      return { ...after, available: after.available + amount, reserved: after.reserved - amount };
    case "commit":
      return { ...after, reserved: after.reserved + amount, used: after.used - amount };
    case "release":
    case "expire":
      return { ...after, available: after.available - amount, reserved: after.reserved + amount };
    case "grant_expire":
      // A lapsed grant's tokens leave the account: from `reserved` when the
      // entry names a reservation (a return to a lapsed grant), else from
      // `available` (the amount is positive, as for every kind but an
      // adjustment).
      return entry.reservation_id
        ? { ...after, reserved: after.reserved + amount }
        : { ...after, available: after.available + amount };
    default:
      return after;
  }
}

/**
 * The points of the period [from, to]: the balances at `from` (before the
 * first entry of the period, or `current` when the period has none), one
 * point per entry, and the balances at `to`.
 */
export function pointsOf(entries, from, to, current) {
  const start = entries.length ? balancesBefore(entries[0]) : current;
  const points = [{ time: from, ...start }];
  for (const entry of entries) {
    points.push({
      time: new Date(entry.created_at),
      available: entry.available_after,
      reserved: entry.reserved_after,
      used: entry.used_after,
    });
  }
  const last = points[points.length - 1];
  points.push({ ...last, time: to });
  return points;
}

/** A round tick step giving at most 5 steps up to `value`, and the axis top. */
function axis(value) {
  const rough = Math.max(1, value / 5);
  const magnitude = 10 ** Math.floor(Math.log10(rough));
  const step = [1, 2, 5, 10].map((factor) => factor * magnitude).find((candidate) => candidate >= rough);
  return { step, top: Math.max(step, Math.ceil(value / step) * step) };
}

function label(date, spanMs) {
  const iso = date.toISOString();
  return spanMs <= 36 * 3600 * 1000 ? `${iso.slice(11, 16)} UTC` : iso.slice(5, 10);
}

/** The chart as a <figure>; `summary` is its caption (read by people and tests). */
export function balanceChart(points, from, to, summary) {
  const span = Math.max(1, to - from);
  const { step, top: max } = axis(Math.max(1, ...points.flatMap((point) => SERIES.map((name) => point[name]))));
  const innerWidth = WIDTH - MARGIN.left - MARGIN.right;
  const innerHeight = HEIGHT - MARGIN.top - MARGIN.bottom;
  const x = (time) => MARGIN.left + ((time - from) / span) * innerWidth;
  const y = (value) => MARGIN.top + innerHeight - (value / max) * innerHeight;

  const grid = [];
  for (let value = 0; value <= max; value += step) {
    grid.push(
      svg("line", { class: "grid", x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: y(value), y2: y(value) }),
      svg("text", { class: "axis", x: MARGIN.left - 6, y: y(value) + 4, "text-anchor": "end" }, String(Math.round(value))),
    );
  }
  for (const fraction of [0, 0.5, 1]) {
    const time = new Date(from.getTime() + span * fraction);
    const anchor = fraction === 0 ? "start" : fraction === 1 ? "end" : "middle";
    grid.push(svg("text", { class: "axis", x: x(time), y: HEIGHT - 8, "text-anchor": anchor }, label(time, span)));
  }

  const lines = SERIES.map((name) => {
    let path = "";
    points.forEach((point, index) => {
      const px = x(point.time).toFixed(1);
      const py = y(point[name]).toFixed(1);
      path += index === 0 ? `M${px},${py}` : `H${px}V${py}`;
    });
    return svg("path", { class: `series ${name}`, d: path, "data-series": name });
  });

  const picture = svg(
    "svg",
    { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-label": summary, class: "chart" },
    svg("title", {}, summary),
    ...grid,
    ...lines,
  );
  const legend = h(
    "ul",
    { class: "legend" },
    SERIES.map((name) => h("li", {}, h("span", { class: `swatch ${name}`, "aria-hidden": "true" }), name)),
  );
  return h("figure", { class: "chart-figure", id: "balance-chart", "data-points": points.length - 2 }, picture, legend, h("figcaption", {}, summary));
}
