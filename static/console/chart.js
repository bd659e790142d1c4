// The console's charts, plain SVG (colours come from console.css classes):
// the balance chart (available, reserved and used over a period, drawn as
// step lines from the ledger's balances-after: a balance holds until the
// next entry), and the plot and figure the other charts draw in.

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

/**
 * The plot area for values 0…`largest`: `y` of a value, the left and right
 * edges (`left` leaves room for the longest axis label), the grid lines
 * with their labels (`format` writes a value), and `xLabel(x, text,
 * anchor)` for the labels under the plot.
 */
export function plot(largest, format = (value) => String(Math.round(value))) {
  const { step, top } = axis(Math.max(1, largest));
  const values = [];
  for (let value = 0; value <= top; value += step) values.push(value);
  const texts = values.map(format);
  const left = Math.max(MARGIN.left, 14 + 7 * Math.max(...texts.map((text) => text.length)));
  const right = WIDTH - MARGIN.right;
  const innerHeight = HEIGHT - MARGIN.top - MARGIN.bottom;
  const y = (value) => MARGIN.top + innerHeight - (value / top) * innerHeight;
  const grid = values.flatMap((value, index) => [
    svg("line", { class: "grid", x1: left, x2: right, y1: y(value), y2: y(value) }),
    svg("text", { class: "axis", x: left - 6, y: y(value) + 4, "text-anchor": "end" }, texts[index]),
  ]);
  const xLabel = (x, text, anchor) => svg("text", { class: "axis", x, y: HEIGHT - 8, "text-anchor": anchor }, text);
  return { y, left, right, bottom: MARGIN.top + innerHeight, grid, xLabel };
}

/** A chart as a <figure>: the SVG of `elements`, the legend of `series`
 * (class names, colours from console.css), and `summary` as its caption
 * (read by people and tests). */
export function chartFigure(attributes, summary, series, elements) {
  const picture = svg(
    "svg",
    { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-label": summary, class: "chart" },
    svg("title", {}, summary),
    ...elements,
  );
  const legend = h(
    "ul",
    { class: "legend" },
    series.map((name) => h("li", {}, h("span", { class: `swatch ${name}`, "aria-hidden": "true" }), name)),
  );
  return h("figure", { class: "chart-figure", ...attributes }, picture, legend, h("figcaption", {}, summary));
}

/** The balance chart as a <figure>; `summary` is its caption. */
export function balanceChart(points, from, to, summary) {
  const span = Math.max(1, to - from);
  const area = plot(Math.max(...points.flatMap((point) => SERIES.map((name) => point[name]))));
  const x = (time) => area.left + ((time - from) / span) * (area.right - area.left);

  const labels = [0, 0.5, 1].map((fraction) => {
    const time = new Date(from.getTime() + span * fraction);
    const anchor = fraction === 0 ? "start" : fraction === 1 ? "end" : "middle";
    return area.xLabel(x(time), label(time, span), anchor);
  });

  const lines = SERIES.map((name) => {
    let path = "";
    points.forEach((point, index) => {
      const px = x(point.time).toFixed(1);
      const py = area.y(point[name]).toFixed(1);
      path += index === 0 ? `M${px},${py}` : `H${px}V${py}`;
    });
    return svg("path", { class: `series ${name}`, d: path, "data-series": name });
  });

  return chartFigure({ id: "balance-chart", "data-points": points.length - 2 }, summary, SERIES, [...area.grid, ...labels, ...lines]);
}

const DAY_MS = 86400 * 1000;

/** The UTC days of the period [from, to) (RFC 3339 instants): "YYYY-MM-DD"s. */
export function daysOf(from, to) {
  const start = new Date(from);
  const first = Date.UTC(start.getUTCFullYear(), start.getUTCMonth(), start.getUTCDate());
  const last = new Date(to).getTime() - 1;
  const days = [];
  for (let day = first; day <= last || days.length === 0; day += DAY_MS) {
    days.push(new Date(day).toISOString().slice(0, 10));
  }
  return days;
}

/**
 * A chart of bars per UTC day as a <figure>: for each of `lines` (`{day,
 * …}`, a day of `days`) one bar per name of `series`, side by side, its
 * value as the API gave it in `valueAttribute` and `title(line, name)` as
 * its tooltip; `format` writes the axis' values. `attributes` (with
 * `data-days`) go on the figure, `summary` is its caption.
 */
export function dayBarChart(attributes, summary, days, lines, series, { format, valueAttribute, title }) {
  const values = lines.filter((line) => days.includes(line.day));
  const area = plot(Math.max(0, ...values.flatMap((line) => series.map((name) => line[name]))), format);
  const slot = (area.right - area.left) / days.length;
  const width = Math.max(0.5, Math.min(24, (slot * 0.76) / series.length));
  const bars = values.flatMap((line) =>
    series.map((name, index) => {
      const top = line[name] > 0 ? Math.min(area.y(line[name]), area.bottom - 1) : area.bottom;
      const x = area.left + days.indexOf(line.day) * slot + slot / 2 + (index - series.length / 2) * width;
      return svg(
        "rect",
        { class: `bar ${name}`, x: x.toFixed(1), y: top.toFixed(1), width: width.toFixed(1), height: (area.bottom - top).toFixed(1), "data-day": line.day, "data-series": name, [valueAttribute]: line[name] },
        svg("title", {}, title(line, name)),
      );
    }));
  const middle = Math.floor((days.length - 1) / 2);
  const labels = [...new Set([0, middle, days.length - 1])].map((index) => {
    const anchor = days.length === 1 ? "middle" : index === 0 ? "start" : index === days.length - 1 ? "end" : "middle";
    const x = anchor === "start" ? area.left : anchor === "end" ? area.right : area.left + (index + 0.5) * slot;
    return area.xLabel(x, days[index].slice(5), anchor);
  });
  return chartFigure({ ...attributes, "data-days": days.length }, summary, series, [...area.grid, ...labels, ...bars]);
}
