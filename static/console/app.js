// The console's shell: sign in and out, the pages and the hash routes
// (#/accounts, #/accounts/<id>, #/reconciliation, #/revenue, #/system).

import { ApiError, forgetKey, get, onUnauthorized, storedKey, storeKey } from "./api.js";
import { clear, h } from "./dom.js";
import { renderAccounts } from "./accounts.js";
import { renderAccount } from "./account.js";
import { renderReconciliation } from "./reconciliation.js";
import { renderRevenue } from "./revenue.js";
import { renderSystem } from "./system.js";

const $ = (id) => document.getElementById(id);

/** Who is signed in: {scope, key_id}; null when nobody is. */
let session = null;
/** Cleanups of the current page (timers), run before the next one. */
let cleanups = [];

function flash(text) {
  $("flash").textContent = text;
}

/** Checks a key with GET /v1/me: admin and finance only. */
async function identify(key) {
  const me = await get("/v1/me", { key });
  if (me.scope === "kiosk") {
    throw new ApiError(403, {
      detail: "A kiosk key cannot use the console. Sign in with an admin or finance key.",
      code: "forbidden",
    });
  }
  return me;
}

function showSignedOut(message) {
  session = null;
  runCleanups();
  $("nav").hidden = true;
  $("who").hidden = true;
  clear($("page"));
  $("sign-in").hidden = false;
  const error = $("sign-in-error");
  error.hidden = !message;
  error.textContent = message || "";
  document.title = "Sign in · token-billing console";
  $("api-key").focus();
}

function showSignedIn(me) {
  session = me;
  $("sign-in").hidden = true;
  $("nav").hidden = false;
  $("who").hidden = false;
  const writes = me.scope === "admin" ? "read and write" : "read only";
  $("who-text").textContent = `Signed in: ${me.scope} key (${writes})`;
  document.body.dataset.scope = me.scope;
  route();
}

function signOut(message) {
  forgetKey();
  delete document.body.dataset.scope;
  $("api-key").value = "";
  if (location.hash !== "#/accounts" && location.hash !== "") location.hash = "";
  showSignedOut(message);
}

function runCleanups() {
  cleanups.forEach((cleanup) => cleanup());
  cleanups = [];
}

function route() {
  if (!session) return;
  runCleanups();
  const [, page = "accounts", id] = location.hash.replace(/^#/, "").split("/");
  const context = {
    scope: session.scope,
    canWrite: session.scope === "admin",
    navigate: (hash) => {
      location.hash = hash;
    },
    every: (milliseconds, action) => {
      const timer = setInterval(action, milliseconds);
      cleanups.push(() => clearInterval(timer));
    },
    flash,
  };
  const container = clear($("page"));
  document.querySelectorAll("#nav a").forEach((link) => {
    const current = link.dataset.page === page;
    if (current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  });
  flash("");
  const pages = {
    accounts: () => (id ? renderAccount(container, context, id) : renderAccounts(container, context)),
    reconciliation: () => renderReconciliation(container, context),
    revenue: () => renderRevenue(container, context),
    system: () => renderSystem(container, context),
  };
  const render = pages[page];
  if (!render) {
    container.append(h("p", { class: "message error", role: "alert" }, `No page “${page}”.`));
    return;
  }
  render().catch((error) => {
    container.append(h("p", { class: "message error", role: "alert" }, error.message));
  });
}

async function start() {
  $("sign-in-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    const button = event.target.querySelector("button");
    button.disabled = true;
    try {
      const me = await identify(key);
      storeKey(key);
      $("api-key").value = "";
      $("sign-in-error").hidden = true;
      showSignedIn(me);
      // The sign-in form is gone: keyboard and screen reader users go on from the page.
      $("main").focus({ preventScroll: true });
    } catch (error) {
      showSignedOut(error.message);
    } finally {
      button.disabled = false;
    }
  });
  $("sign-out").addEventListener("click", () => signOut("Signed out: the key is forgotten."));
  onUnauthorized((error) => signOut(`Signed out: ${error.message}`));
  window.addEventListener("hashchange", route);

  const key = storedKey();
  if (!key) {
    showSignedOut();
    return;
  }
  try {
    showSignedIn(await identify(key));
  } catch (error) {
    forgetKey();
    showSignedOut(error.message);
  }
}

start();
