// Small DOM helpers: elements are built with textContent, never innerHTML,
// so nothing the API returns can become markup.

/** h("a", {href: "#/x", class: "y"}, "text", child, …) */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      element.addEventListener(name.slice(2), value);
    } else if (value === true) {
      element.setAttribute(name, "");
    } else {
      element.setAttribute(name, String(value));
    }
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** SVG element (the chart). */
export function svg(tag, attributes = {}, ...children) {
  const element = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value !== undefined && value !== null) element.setAttribute(name, String(value));
  }
  append(element, children);
  return element;
}

export function clear(element) {
  element.replaceChildren();
  return element;
}

/** Replaces an element's children with `children`, skipping null,
 * undefined and false as h() does (the DOM's own append would write
 * "null"). */
export function fill(element, ...children) {
  element.replaceChildren();
  append(element, children);
  return element;
}

const numberFormat = new Intl.NumberFormat("en-US");
export function tokens(value) {
  return value === undefined || value === null ? "—" : numberFormat.format(value);
}

/** Digits after the decimal point of a currency (ISO 4217's minor unit:
 * 2 for EUR, 0 for JPY); 2 when the browser does not know the code. */
export function minorDigits(currency) {
  try {
    return new Intl.NumberFormat("en-US", { style: "currency", currency }).resolvedOptions().maximumFractionDigits;
  } catch (_) {
    return 2;
  }
}

/**
 * An amount of integer minor units (the API's money: 2000 is 20.00 EUR) for
 * display: "20.00", "-3.34", "1,500" (JPY). Integer arithmetic only
 * (BigInt), never a float.
 */
export function money(minor, currency) {
  if (minor === undefined || minor === null) return "—";
  const digits = minorDigits(currency);
  const scale = 10n ** BigInt(digits);
  const amount = BigInt(minor);
  const magnitude = amount < 0n ? -amount : amount;
  const whole = numberFormat.format(magnitude / scale);
  const fraction = digits ? `.${String(magnitude % scale).padStart(digits, "0")}` : "";
  return `${amount < 0n ? "-" : ""}${whole}${fraction}`;
}

export function time(value) {
  if (!value) return "—";
  const date = new Date(value);
  return date.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

/** "in 4 min 05 s" / "expired 3 s ago"; from an hour on "in 5 h 03 min", from a day on "in 1 d 23 h" */
export function countdown(until, now = Date.now()) {
  const seconds = Math.round((new Date(until).getTime() - now) / 1000);
  const text = (total) => {
    const days = Math.floor(total / 86400);
    const hours = Math.floor(total / 3600);
    const minutes = Math.floor(total / 60);
    const rest = String(total % 60).padStart(2, "0");
    if (days > 0) return `${days} d ${hours % 24} h`;
    if (hours > 0) return `${hours} h ${String(minutes % 60).padStart(2, "0")} min`;
    return minutes > 0 ? `${minutes} min ${rest} s` : `${total} s`;
  };
  return seconds >= 0 ? `in ${text(seconds)}` : `expired ${text(-seconds)} ago`;
}

/** A labelled form field: <div class="field"><label for=id>…</label><input id=id …></div> */
let fieldCounter = 0;
export function field(labelText, attributes = {}, tag = "input", ...children) {
  fieldCounter += 1;
  const id = attributes.id || `field-${fieldCounter}`;
  const control = h(tag, { ...attributes, id }, ...children);
  return { element: h("div", { class: "field" }, h("label", { for: id }, labelText), control), control };
}

/** A message area that shows API errors (problem+json `detail`) and results. */
export function messageArea() {
  const element = h("p", { class: "message", role: "status", "aria-live": "polite" });
  element.hidden = true;
  return {
    element,
    error(error) {
      element.hidden = false;
      element.className = "message error";
      element.setAttribute("role", "alert");
      const code = error && error.code ? ` (${error.code})` : "";
      element.textContent = `${error.message}${code}`;
    },
    ok(text) {
      element.hidden = false;
      element.className = "message ok";
      element.setAttribute("role", "status");
      element.textContent = text;
    },
    clear() {
      element.hidden = true;
      element.textContent = "";
    },
  };
}

/** A table in a horizontally scrolling wrapper (wide tables never widen the page). */
export function table(caption, headers, rows, attributes = {}) {
  return h(
    "div",
    { class: "table-wrap", tabindex: "0", role: "region", "aria-label": caption },
    h(
      "table",
      attributes,
      h("caption", {}, caption),
      h("thead", {}, h("tr", {}, headers.map((header) => (header instanceof Node && header.tagName === "TH" ? header : h("th", { scope: "col" }, header))))),
      h("tbody", {}, rows),
    ),
  );
}

/** A button that runs `action` once at a time (a double click is one request). */
export function busyButton(text, attributes, action) {
  const button = h("button", { type: "button", ...attributes }, text);
  button.addEventListener("click", async () => {
    if (button.disabled) return;
    button.disabled = true;
    try {
      await action();
    } finally {
      button.disabled = false;
    }
  });
  return button;
}

/** Runs `action` on submit, once at a time; the submit button is disabled meanwhile. */
export function onSubmit(form, action) {
  let running = false;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (running) return;
    running = true;
    const buttons = form.querySelectorAll("button[type=submit]");
    buttons.forEach((button) => (button.disabled = true));
    try {
      await action();
    } finally {
      running = false;
      buttons.forEach((button) => (button.disabled = false));
    }
  });
}
