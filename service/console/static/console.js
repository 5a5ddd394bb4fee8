// The owner console. Calls the service's public HTTP API with the signed-in key, exactly like
// the CLI and the Python client; it shows only what the API returns to that key.
//
// Key handling: the key is kept in sessionStorage (this tab only, gone when the tab closes or on
// "Sign out") and sent only as "Authorization: Bearer"; never in a URL, a cookie or a form body.
// No cookie means no ambient credential, so no cross-site request can act with it (no CSRF).
// Escaping: every value from the API reaches the page through textContent or a DOM property,
// never parsed as markup; the page's CSP allows no inline script.
"use strict";

(function () {
  const KEY_STORAGE = "dp-curator.console.key";
  const KINDS_OF_VIEW = ["datasets", "budget", "ledger", "releases", "chart", "account"];

  const state = {
    key: null,
    me: null,
    datasets: [],
    dataset: null, // the selected dataset (DatasetRead)
    principals: new Map(), // id -> {name, role}, as far as this key may know them
    grants: [],
    view: "datasets",
    ledgerOffset: 0,
    viewToken: 0,
    focusView: null, // the view whose heading takes the focus once it has loaded
    chart: null,
  };

  // ---- small DOM helpers (text only, never HTML) ---------------------------------------------

  const $ = (id) => document.getElementById(id);

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (value === undefined || value === null) continue;
      if (name === "className") node.className = value;
      else if (name === "text") node.textContent = String(value);
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }

  function cell(value, className) {
    return el("td", { className, text: value === null || value === undefined ? "—" : value });
  }

  function fmtNumber(x) {
    if (x === null || x === undefined) return "—";
    const n = Number(x);
    if (!Number.isFinite(n)) return String(x);
    if (n !== 0 && Math.abs(n) < 1e-2) return Number(n.toPrecision(3)).toExponential();
    return String(Number(n.toPrecision(6)));
  }

  function fmtTime(iso) {
    if (!iso) return "—";
    return String(iso).replace("T", " ").replace(/\.\d+/, "").replace("+00:00", "");
  }

  function principalName(id) {
    const p = state.principals.get(id);
    if (p) {
      // two principals may share a name: tell them apart by their keys' public prefixes
      const twins = [...state.principals.values()].filter((q) => q.name === p.name).length;
      return twins > 1 && p.key_prefix ? p.name + " (key " + p.key_prefix + "…)" : p.name;
    }
    if (state.me && id === state.me.id) return state.me.name;
    return "principal " + String(id).slice(0, 8);
  }

  // A dataset's name, with its id's first characters where another visible dataset shares it.
  function datasetLabel(d) {
    const twins = state.datasets.filter((x) => x.name === d.name).length;
    return twins > 1 ? d.name + " · " + String(d.id).slice(0, 8) : d.name;
  }

  function plural(count, one, many) {
    return count + " " + (count === 1 ? one : many);
  }

  // ---- the API ---------------------------------------------------------------------------------

  class ApiProblem extends Error {
    constructor(status, body) {
      super((body && body.title) || "HTTP " + status);
      this.status = status;
      this.body = body || { title: "HTTP " + status, status };
    }
  }

  async function api(method, path, { body, query, accept } = {}) {
    const url = new URL(path, window.location.origin);
    for (const [k, v] of Object.entries(query || {})) {
      if (v !== "" && v !== null && v !== undefined) url.searchParams.set(k, String(v));
    }
    const headers = { Authorization: "Bearer " + state.key, Accept: accept || "application/json" };
    const init = { method, headers, credentials: "omit", cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(url, init);
    } catch (err) {
      throw new ApiProblem(0, { title: "The service cannot be reached", detail: String(err) });
    }
    if (!response.ok) {
      let problem = null;
      try {
        problem = await response.json();
      } catch (_) {
        problem = { title: response.statusText || "HTTP " + response.status };
      }
      if (typeof problem !== "object" || problem === null) problem = { title: String(problem) };
      problem.status = problem.status || response.status;
      throw new ApiProblem(response.status, problem);
    }
    if (response.status === 204) return null;
    if ((accept || "").startsWith("text/")) return response.text();
    return response.json();
  }

  // ---- messages --------------------------------------------------------------------------------

  function renderProblem(target, err) {
    clear(target);
    const body = err instanceof ApiProblem ? err.body : { title: String(err) };
    const status = err instanceof ApiProblem && err.status ? " (" + err.status + ")" : "";
    target.append(el("div", { className: "title", text: (body.title || "Error") + status }));
    const errors = Array.isArray(body.errors) ? body.errors : [];
    // a 422's detail summarises its first error ("#/x: ... (and 1 more)"): the list says it all
    const first = errors.length && errors[0] && errors[0].detail ? String(errors[0].detail) : null;
    const repeats = first !== null && String(body.detail || "").includes(first);
    if (body.detail && !repeats) target.append(el("div", { className: "detail", text: body.detail }));
    if (errors.length) {
      const list = el("ul");
      for (const e of errors) {
        const field = e && e.pointer ? String(e.pointer).replace(/^#\/?/, "") : "";
        const where = field ? field + ": " : "";
        list.append(el("li", { text: where + (e && e.detail ? e.detail : "") }));
      }
      target.append(list);
    }
    if (body.type) {
      target.append(el("div", { className: "help" }, "Problem type: ", el("code", { text: body.type })));
    }
    target.hidden = false;
  }

  function showProblem(err) {
    hideNotice();
    renderProblem($("problem"), err);
  }

  function hideProblem() {
    $("problem").hidden = true;
    clear($("problem"));
  }

  function showNotice(text, { focus } = {}) {
    $("notice").textContent = text;
    $("notice").hidden = false;
    if (focus) $("notice").focus();
  }

  function hideNotice() {
    $("notice").hidden = true;
    $("notice").textContent = "";
  }

  // A modal confirmation (native <dialog>: focus is trapped, Escape cancels).
  function confirmAction(title, text, okLabel) {
    const dialog = $("confirm");
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    $("confirm-ok").textContent = okLabel || "Confirm";
    return new Promise((resolve) => {
      const done = (answer) => {
        $("confirm-ok").removeEventListener("click", ok);
        $("confirm-cancel").removeEventListener("click", cancel);
        dialog.removeEventListener("cancel", cancel);
        if (dialog.open) dialog.close();
        resolve(answer);
      };
      const ok = () => done(true);
      const cancel = (event) => {
        if (event) event.preventDefault();
        done(false);
      };
      $("confirm-ok").addEventListener("click", ok);
      $("confirm-cancel").addEventListener("click", cancel);
      dialog.addEventListener("cancel", cancel);
      dialog.showModal();
      $("confirm-cancel").focus();
    });
  }

  // ---- sign-in ---------------------------------------------------------------------------------

  async function signIn(key, { quiet } = {}) {
    state.key = key;
    try {
      state.me = await api("GET", "/v1/principals/me");
    } catch (err) {
      state.key = null;
      sessionStorage.removeItem(KEY_STORAGE);
      if (!quiet) {
        const body = err instanceof ApiProblem ? err.body : { title: String(err) };
        const title = err.status === 401 ? "Sign-in failed: this API key is not valid" : "Sign-in failed";
        renderProblem($("signin-error"), new ApiProblem(err.status, { ...body, title }));
      }
      showSignIn();
      return;
    }
    sessionStorage.setItem(KEY_STORAGE, key);
    $("api-key").value = "";
    $("signin-error").hidden = true;
    $("whoami-name").textContent = state.me.name;
    $("whoami-role").textContent = state.me.role;
    $("whoami").hidden = false;
    $("signin").hidden = true;
    $("app").hidden = false;
    document.body.dataset.role = state.me.role;
    await loadPrincipals();
    await loadDatasets();
  }

  function signOut() {
    sessionStorage.removeItem(KEY_STORAGE);
    state.key = null;
    state.me = null;
    state.dataset = null;
    state.datasets = [];
    state.principals = new Map();
    if (state.chart) {
      state.chart.destroy();
      state.chart = null;
    }
    delete document.body.dataset.role;
    $("whoami").hidden = true;
    $("app").hidden = true;
    hideProblem();
    hideNotice();
    showSignIn();
  }

  function showSignIn() {
    $("whoami").hidden = true;
    $("app").hidden = true;
    $("signin").hidden = false;
    $("api-key").focus();
  }

  // ---- data loading ----------------------------------------------------------------------------

  async function loadPrincipals() {
    state.principals = new Map();
    if (state.me.role !== "owner" && state.me.role !== "admin") return;
    try {
      for (const p of await api("GET", "/v1/principals")) {
        state.principals.set(p.id, { name: p.name, role: p.role, key_prefix: p.key_prefix, disabled: Boolean(p.disabled) });
      }
    } catch (err) {
      showProblem(err);
    }
  }

  async function loadDatasets(selectId) {
    try {
      state.datasets = await api("GET", "/v1/datasets");
    } catch (err) {
      return handleError(err);
    }
    const select = clear($("dataset-select"));
    for (const d of state.datasets) select.append(el("option", { value: d.id, text: datasetLabel(d) }));
    $("no-datasets").hidden = state.datasets.length > 0;
    $("admin-help").hidden = state.me.role !== "admin";
    $("cli-only-help").hidden = state.me.role !== "owner";
    select.disabled = state.datasets.length === 0;
    const wanted = selectId || (state.dataset && state.dataset.id);
    const chosen = state.datasets.find((d) => d.id === wanted) || state.datasets[0] || null;
    if (chosen) select.value = chosen.id;
    await selectDataset(chosen);
  }

  function isOwner() {
    return Boolean(state.me && state.dataset && state.dataset.owner_id === state.me.id);
  }

  async function selectDataset(dataset) {
    state.dataset = dataset;
    state.ledgerOffset = 0;
    state.grants = [];
    for (const node of document.querySelectorAll("[data-owner-only]")) node.hidden = !isOwner();
    renderDatasets();
    if (!isOwner() && state.view === "ledger") state.view = "datasets";
    $("chain").hidden = true;
    if (isOwner()) await verifyChain();
    await showView(state.view, { focus: false });
  }

  async function refreshDataset() {
    const fresh = await api("GET", "/v1/datasets/" + encodeURIComponent(state.dataset.id));
    state.datasets = state.datasets.map((d) => (d.id === fresh.id ? fresh : d));
    state.dataset = fresh;
    renderDatasets();
  }

  function handleError(err) {
    if (err instanceof ApiProblem && err.status === 401) {
      signOut();
      renderProblem($("signin-error"), new ApiProblem(401, { ...err.body, title: "Signed out: the API key is no longer valid" }));
      return;
    }
    showProblem(err);
  }

  // ---- views -----------------------------------------------------------------------------------

  async function showView(view, { focus } = { focus: true }) {
    if (!KINDS_OF_VIEW.includes(view)) view = "datasets";
    if (view === "ledger" && !isOwner()) view = "datasets";
    state.view = view;
    const token = ++state.viewToken; // a later showView wins over one still loading
    // A view the user opened keeps its claim on the focus when a reload of the same view (the
    // dataset list finishing after sign-in) supersedes it.
    if (focus) state.focusView = view;
    else if (state.focusView !== view) state.focusView = null;
    for (const button of document.querySelectorAll("#views button")) {
      if (button.dataset.view === view) button.setAttribute("aria-current", "page");
      else button.removeAttribute("aria-current");
    }
    for (const name of KINDS_OF_VIEW) $("view-" + name).hidden = name !== view;
    if (!state.dataset && view !== "datasets" && view !== "account") {
      $("view-" + view).hidden = true;
      $("view-datasets").hidden = false;
    }
    try {
      if (view === "account") await renderAccount();
      else if (state.dataset) {
        if (view === "budget") await renderBudget();
        if (view === "ledger") await renderLedger();
        if (view === "releases") await renderReleases();
        if (view === "chart") await renderChart();
      }
    } catch (err) {
      if (token === state.viewToken) handleError(err);
    }
    if (token === state.viewToken && state.focusView === view) {
      state.focusView = null;
      const heading = document.querySelector("#view-" + view + " h1");
      if (heading) heading.focus();
    }
  }

  function renderDatasets() {
    const body = clear($("datasets-table").querySelector("tbody"));
    for (const d of state.datasets) {
      const b = d.budget;
      const row = el(
        "tr",
        { "aria-selected": state.dataset && d.id === state.dataset.id ? "true" : "false" },
        el("td", { className: "name" }, el("button", { type: "button", className: "link", text: datasetLabel(d), onclick: () => chooseDataset(d.id) })),
        cell(d.n, "num"),
        cell(d.status),
        cell(d.version, "num"),
        cell(b.is_set ? fmtNumber(b.epsilon_spent) + " / " + fmtNumber(b.epsilon_total) : "not set", "num"),
        cell(b.is_set ? fmtNumber(b.delta_spent) + " / " + fmtNumber(b.delta_total) : "not set", "num"),
        cell(d.allow_paper_mode ? "allowed" : "forbidden"),
        cell(fmtTime(d.created_at)),
      );
      body.append(row);
    }
    renderSchema();
  }

  function renderSchema() {
    const body = clear($("schema-table").querySelector("tbody"));
    const d = state.dataset;
    $("schema-title").textContent = d ? "Public schema of " + datasetLabel(d) : "Public schema";
    if (!d) {
      $("schema-summary").textContent = "";
      return;
    }
    const s = d.schema || {};
    const parts = [];
    if (s.treatment) parts.push("treatment: " + s.treatment.name + codeLabels([0, 1], s.treatment.code_labels));
    if (s.outcome) {
      parts.push("outcome: " + s.outcome.name + " in [" + s.outcome.lower + ", " + s.outcome.upper + "]" +
        (s.outcome.unit ? " " + s.outcome.unit : ""));
    }
    if (s.design) parts.push("design: " + s.design);
    if (s.treatment_probability !== undefined && s.treatment_probability !== null) {
      parts.push("treatment probability: " + s.treatment_probability);
    }
    parts.push("rows (n): " + d.n);
    parts.push("schema hash: " + String(d.schema_hash).slice(0, 16) + "…");
    $("schema-summary").textContent = parts.join(" · ");
    for (const c of s.covariates || []) {
      let range = "—";
      if (Array.isArray(c.codes) && c.codes.length) range = "codes " + c.codes.join(", ") + codeLabels(c.codes, c.code_labels);
      else if (c.lower != null && c.upper != null) range = "[" + c.lower + ", " + c.upper + "]" + (c.unit ? " " + c.unit : "");
      // the analysis plan's pre-specified roles (public): the nuisance models' adjustment set,
      // the CATE effect model's modifiers
      const roles = [];
      if (c.adjust_for) roles.push("adjustment set");
      if (c.effect_modifier) roles.push("effect modifier");
      body.append(el("tr", {}, cell(c.name), cell(c.type || "numeric"), cell(range), cell(roles.join(", ") || "—")));
    }
  }

  // the owner's declared meaning of a column's codes, e.g. " (0 female, 1 male)"; "" when none
  function codeLabels(codes, labels) {
    if (!labels) return "";
    const named = codes.filter((code) => labels[String(code)] !== undefined)
      .map((code) => code + " " + labels[String(code)]);
    return named.length ? " (" + named.join(", ") + ")" : "";
  }

  function chooseDataset(id) {
    $("dataset-select").value = id;
    const d = state.datasets.find((x) => x.id === id) || null;
    hideProblem();
    hideNotice();
    selectDataset(d);
  }

  function gauge(kind, spent, total, isSet) {
    const meter = $("meter-" + kind);
    const text = $("gauge-" + kind + "-text");
    if (!isSet) {
      meter.max = 1;
      meter.value = 0;
      text.textContent = "No budget set yet: no release can be charged.";
      return;
    }
    meter.max = total > 0 ? total : 1;
    meter.value = Math.min(spent, meter.max);
    meter.high = meter.max * 0.8;
    meter.optimum = 0;
    meter.low = meter.max * 0.5;
    const left = Math.max(0, total - spent);
    // each release charges at most 1e-5 of delta by default (its own default delta)
    const releases = kind === "delta" ? " · at least " + plural(Math.floor(left / 1e-5 + 1e-9), "release", "releases") + " at the default δ (≤ 1e-5 each)" : "";
    text.textContent = "spent " + fmtNumber(spent) + " of " + fmtNumber(total) + " · remaining " + fmtNumber(left) + releases;
  }

  function capCell(spent, cap) {
    if (cap === null || cap === undefined) return el("td", { className: "num", text: fmtNumber(spent) + " / no cap" });
    const max = cap > 0 ? cap : 1;
    // coloured like the dataset's gauges: green while low, red from 80 % of the cap
    const meter = el("meter", {
      min: "0", max: String(max), value: String(Math.min(spent, cap)), low: String(max * 0.5),
      high: String(max * 0.8), optimum: "0", "aria-label": "spent of cap",
    });
    const reached = Number(spent) >= Number(cap);
    return el(
      "td",
      { className: "num cap" },
      fmtNumber(spent) + " / " + fmtNumber(cap),
      reached ? el("span", { className: "cap-reached", text: " · cap reached" }) : null,
      meter,
    );
  }

  async function renderBudget() {
    await refreshDataset();
    const b = state.dataset.budget;
    gauge("epsilon", b.epsilon_spent, b.epsilon_total, b.is_set);
    gauge("delta", b.delta_spent, b.delta_total, b.is_set);
    $("budget-paper").textContent =
      "Of the ε spent, " + fmtNumber(b.epsilon_spent_paper) + " was charged by paper-mode releases. Paper mode is " +
      (state.dataset.allow_paper_mode ? "allowed" : "forbidden") + " on this dataset.";
    try {
      state.grants = await api("GET", datasetPath("/grants"));
    } catch (err) {
      // The admin may read a dataset but not its grants (owner and grantees only).
      if (!(err instanceof ApiProblem && err.status === 403)) throw err;
      state.grants = [];
    }
    const body = clear($("grants-table").querySelector("tbody"));
    for (const g of state.grants) {
      const row = el(
        "tr",
        { className: g.revoked ? "state-revoked" : "" },
        cell(principalName(g.principal_id), "name"),
        capCell(g.epsilon_spent, g.epsilon_cap),
        capCell(g.delta_spent, g.delta_cap),
        // a disabled principal's key is refused everywhere, whatever its grant says
        cell(g.revoked ? "revoked" : (state.principals.get(g.principal_id) || {}).disabled ? "disabled (key refused)" : "active"),
        cell(fmtTime(g.created_at)),
      );
      if (isOwner()) {
        const name = principalName(g.principal_id);
        const grantee = state.principals.get(g.principal_id);
        // a client's grant has no cap to change; a revoked one can be granted again
        const label = grantee && grantee.role === "client" ? (g.revoked ? "Grant again" : null) : "Change cap";
        row.append(
          el(
            "td",
            {},
            label === null
              ? null
              : el("button", { type: "button", text: label, "aria-label": label + " of " + name, onclick: () => prefillGrant(g) }),
            " ",
            g.revoked
              ? null
              : el("button", { type: "button", className: "danger", text: "Revoke", "aria-label": "Revoke grant of " + name, onclick: () => revokeGrant(g) }),
          ),
        );
      }
      body.append(row);
    }
    $("no-grants").hidden = state.grants.length > 0;
    if (isOwner()) {
      $("delta-limit").textContent = " (1/n = " + fmtNumber(1 / state.dataset.n) + " here)";
      $("budget-epsilon").value = b.is_set ? String(b.epsilon_total) : "";
      $("budget-delta").value = b.is_set ? String(b.delta_total) : "";
      $("paper-allowed").checked = Boolean(state.dataset.allow_paper_mode);
      const select = clear($("grant-principal"));
      for (const [id, p] of state.principals) {
        if (p.role === "analyst" || p.role === "client") {
          select.append(el("option", { value: id, text: principalName(id) + " (" + p.role + (p.disabled ? ", disabled" : "") + ")" }));
        }
      }
      syncGrantCaps();
    }
  }

  // A client never spends budget (the API refuses a cap in its grant): no cap fields for one.
  function syncGrantCaps() {
    const chosen = state.principals.get($("grant-principal").value);
    const client = Boolean(chosen && chosen.role === "client");
    for (const name of ["grant-epsilon", "grant-delta"]) {
      const input = $(name);
      input.disabled = client;
      if (client) input.value = "";
    }
    $("grant-client-help").hidden = !client;
  }

  function prefillGrant(grant) {
    $("grant-principal").value = grant.principal_id;
    syncGrantCaps();
    $("grant-epsilon").value = grant.epsilon_cap === null ? "" : String(grant.epsilon_cap);
    $("grant-delta").value = grant.delta_cap === null ? "" : String(grant.delta_cap);
    $("grant-epsilon").focus();
  }

  function numberOrNull(input) {
    const raw = input.value.trim();
    if (raw === "") return null;
    const n = Number(raw);
    return Number.isFinite(n) ? n : raw; // the API's 422 explains anything else
  }

  async function act(title, text, okLabel, call, done) {
    hideProblem();
    hideNotice();
    if (!(await confirmAction(title, text, okLabel))) return;
    try {
      await call();
    } catch (err) {
      handleError(err);
      $("problem").focus();
      return;
    }
    await loadDatasets(state.dataset.id);
    // the acting button may have been re-rendered away
    showNotice(typeof done === "function" ? done() : done, { focus: true });
  }

  function datasetPath(suffix) {
    return "/v1/datasets/" + encodeURIComponent(state.dataset.id) + (suffix || "");
  }

  function onBudgetSubmit(event) {
    event.preventDefault();
    const eps = numberOrNull($("budget-epsilon"));
    const dlt = numberOrNull($("budget-delta"));
    const missing = [];
    if (eps === null) missing.push({ pointer: "epsilon_total", detail: "enter the ε total" });
    if (dlt === null) missing.push({ pointer: "delta_total", detail: "enter the δ total (0 allows only pure ε-DP releases)" });
    if (missing.length) {
      showProblem(new ApiProblem(0, { title: "Both totals are needed", errors: missing }));
      $("problem").focus();
      return;
    }
    const limit = 1 / state.dataset.n;
    const weak = typeof dlt === "number" && dlt >= limit
      ? " Warning: δ ≥ 1/n (" + fmtNumber(limit) + "): a δ this large allows a release that exposes a record outright; keep δ well below 1/n."
      : "";
    let stored = null;
    act(
      "Set the budget?",
      "Set the privacy budget of “" + datasetLabel(state.dataset) + "” to ε = " + eps + ", δ = " + dlt +
        ". Every change is recorded in the ledger; a total can never drop below what is spent." + weak,
      "Set budget",
      async () => {
        stored = await api("PUT", datasetPath("/budget"), { body: { epsilon_total: eps, delta_total: dlt } });
      },
      () => "Budget set to ε = " + fmtNumber(stored.epsilon_total) + ", δ = " + fmtNumber(stored.delta_total) + ".",
    );
  }

  function onGrantSubmit(event) {
    event.preventDefault();
    const id = $("grant-principal").value;
    const eps = numberOrNull($("grant-epsilon"));
    const dlt = numberOrNull($("grant-delta"));
    const body = {};
    if (eps !== null) body.epsilon_cap = eps;
    if (dlt !== null) body.delta_cap = dlt;
    const grantee = state.principals.get(id);
    const caps = grantee && grantee.role === "client"
      ? "no cap (a client never spends budget)"
      : (eps === null ? "no ε cap" : "ε cap " + eps) + ", " + (dlt === null ? "no δ cap" : "δ cap " + dlt);
    const existing = state.grants.find((g) => g.principal_id === id && !g.revoked);
    const b = state.dataset.budget;
    const loose = [];
    if (typeof eps === "number" && b.is_set && eps > b.epsilon_total) loose.push("the ε cap is above the dataset's ε total (" + fmtNumber(b.epsilon_total) + ")");
    if (typeof dlt === "number" && b.is_set && dlt > b.delta_total) loose.push("the δ cap is above the dataset's δ total (" + fmtNumber(b.delta_total) + ")");
    const note = loose.length ? " Note: " + loose.join("; ") + ", so the dataset's budget binds first." : "";
    act(
      existing ? "Change the cap?" : "Grant access?",
      (existing ? "Change the cap of " + principalName(id) + " on “" : "Grant " + principalName(id) + " access to “") +
        datasetLabel(state.dataset) + "” to " + caps + "." + note,
      existing ? "Change cap" : "Grant",
      () => api("PUT", datasetPath("/grants/" + encodeURIComponent(id)), { body }),
      "Granted " + principalName(id) + " (" + caps + ").",
    );
  }

  function revokeGrant(grant) {
    const name = principalName(grant.principal_id);
    act(
      "Revoke the grant?",
      "Revoke " + name + "’s access to “" + datasetLabel(state.dataset) + "”. What they spent stays spent.",
      "Revoke",
      () => api("DELETE", datasetPath("/grants/" + encodeURIComponent(grant.principal_id))),
      "Revoked the grant of " + name + ".",
    );
  }

  function onPaperSubmit(event) {
    event.preventDefault();
    const allow = $("paper-allowed").checked;
    act(
      allow ? "Allow paper mode?" : "Forbid paper mode?",
      (allow ? "Allow" : "Forbid") + " paper-mode releases on “" + datasetLabel(state.dataset) + "”.",
      allow ? "Allow paper mode" : "Forbid paper mode",
      () => api("PATCH", datasetPath(), { body: { allow_paper_mode: allow } }),
      "Paper mode is now " + (allow ? "allowed" : "forbidden") + ".",
    );
  }

  // ---- ledger ------------------------------------------------------------------------------------

  async function verifyChain() {
    const box = $("chain");
    let v;
    try {
      v = await api("GET", datasetPath("/ledger/verify"));
    } catch (err) {
      handleError(err);
      return;
    }
    // The checkpoint this browser kept at its last valid check: the server can only recompute
    // a chain, and a chain rewritten whole (hashes recomputed) is consistent again.
    let rewritten = null;
    let unchanged = null;
    const saved = v.valid ? loadCheckpoint() : null;
    if (saved) {
      try {
        rewritten = await checkpointMismatch(saved, v);
      } catch (err) {
        handleError(err);
        return;
      }
      if (!rewritten) unchanged = saved;
    }
    if (v.valid && !rewritten && v.entries > 0) saveCheckpoint(v, unchanged);
    clear(box);
    const valid = v.valid && !rewritten;
    state.brokenSeq = valid ? null : (rewritten ? saved.seq : v.first_invalid_seq || null);
    box.className = "chain " + (valid ? "ok" : "bad");
    box.dataset.valid = valid ? "true" : "false";
    if (rewritten) {
      box.append("✘ Ledger verification FAILED at entry " + saved.seq + ": " + rewritten);
      box.append(el("span", { className: "detail", text: "Its hash chain is consistent, so it was rewritten whole by someone with database access after this browser's check of " + saved.at + ". Export it and contact the operator." }));
    } else if (v.valid) {
      box.append("✔ Ledger hash chain verified: " + plural(v.entries, "entry", "entries") + " intact.");
      const since = unchanged ? " Entry " + unchanged.seq + " is as this browser saw it on " + unchanged.at + "." : "";
      box.append(el("span", { className: "detail", text: "Head hash " + v.head_hash + "." + since }));
    } else {
      box.append("✘ Ledger verification FAILED" + (v.first_invalid_seq ? " at entry " + v.first_invalid_seq : "") + ": " + (v.reason || "unknown reason") + ".");
      box.append(el("span", { className: "detail", text: "The ledger was altered outside the service. Export it and contact the operator; " + v.entries + " entries were checked." }));
    }
    box.hidden = false;
  }

  function checkpointKey() {
    return "dpc-ledger-checkpoint:" + state.dataset.id;
  }

  function loadCheckpoint() {
    try {
      const saved = JSON.parse(window.localStorage.getItem(checkpointKey()) || "null");
      return saved && Number.isInteger(saved.seq) && typeof saved.hash === "string" ? saved : null;
    } catch (err) {
      return null;
    }
  }

  function saveCheckpoint(v, unchanged) {
    // Kept at the entry first seen unchanged, moved to the new head when the ledger grew.
    if (unchanged && unchanged.seq === v.entries) return;
    const at = new Date().toISOString().slice(0, 16).replace("T", " ") + " UTC";
    try {
      window.localStorage.setItem(checkpointKey(), JSON.stringify({ seq: v.entries, hash: v.head_hash, at: at }));
    } catch (err) {
      // storage full or disabled: the check still ran
    }
  }

  async function checkpointMismatch(saved, v) {
    if (saved.seq > v.entries) return "the ledger has fewer entries than this browser saw on " + saved.at + ".";
    const page = await api("GET", datasetPath("/ledger"), { query: { order: "asc", limit: 1, offset: saved.seq - 1 } });
    const entry = page.entries[0];
    if (!entry || entry.seq !== saved.seq || entry.row_hash !== saved.hash) {
      return "it is not the entry this browser saw on " + saved.at + ".";
    }
    return null;
  }

  function ledgerQuery() {
    return {
      principal_id: $("f-principal").value,
      entry_type: $("f-type").value,
      release_kind: $("f-kind").value,
      status: $("f-status").value,
      guarantee: $("f-guarantee").value,
    };
  }

  function fillPrincipalFilter() {
    const select = $("f-principal");
    const current = select.value;
    clear(select).append(el("option", { value: "", text: "any" }));
    // Only the owner and the grantees (revoked ones too) can appear in this dataset's ledger.
    const ids = new Set([state.dataset.owner_id, ...state.grants.map((g) => g.principal_id)]);
    for (const id of ids) select.append(el("option", { value: id, text: principalName(id) }));
    select.value = current;
  }

  // What a budget, grant or charge entry did, from its hashed details (the CLI's note column).
  function entryWhat(e) {
    let details = {};
    try {
      details = JSON.parse(e.details_json || "{}") || {};
    } catch (_) {
      details = {};
    }
    if (e.entry_type === "budget" && details.epsilon_total !== undefined) {
      return "set ε total " + fmtNumber(details.epsilon_total) + ", δ total " + fmtNumber(details.delta_total);
    }
    if (e.entry_type === "grant" && details.grantee) {
      const who = principalName(details.grantee);
      if (details.revoked) return "revoked " + who;
      const caps = [];
      if (details.epsilon_cap !== null && details.epsilon_cap !== undefined) caps.push("ε cap " + fmtNumber(details.epsilon_cap));
      if (details.delta_cap !== null && details.delta_cap !== undefined) caps.push("δ cap " + fmtNumber(details.delta_cap));
      return "granted " + who + " (" + (caps.join(", ") || "no cap") + ")";
    }
    if (e.entry_type === "charge" && e.release_id) return "release " + String(e.release_id).slice(0, 8);
    if (e.entry_type === "create") return "dataset uploaded";
    if (e.entry_type === "rows_deleted") return "the rows were deleted";
    if (e.entry_type === "settings" && details.allow_paper_mode !== undefined) {
      return "paper mode " + (details.allow_paper_mode ? "allowed" : "not allowed");
    }
    return "—";
  }

  // An exact decimal amount, shown short, exact on hover.
  function amountCell(value) {
    return el("td", { className: "num", title: String(value), text: fmtNumber(value) });
  }

  async function renderLedger() {
    if (!state.grants.length) {
      state.grants = await api("GET", datasetPath("/grants"));
    }
    fillPrincipalFilter();
    const size = Number($("f-size").value);
    const page = await api("GET", datasetPath("/ledger"), {
      query: { ...ledgerQuery(), order: "desc", limit: size, offset: state.ledgerOffset },
    });
    const body = clear($("ledger-table").querySelector("tbody"));
    for (const e of page.entries) {
      const broken = state.brokenSeq !== null && state.brokenSeq !== undefined && e.seq === state.brokenSeq;
      const hash = e.request_hash ? el("code", { title: e.request_hash, text: e.request_hash.slice(0, 12) + "…" }) : "—";
      body.append(
        el(
          "tr",
          broken ? { className: "broken", title: "the hash chain breaks at this entry" } : {},
          cell(e.seq, "num"),
          cell(fmtTime(e.created_at)),
          cell(principalName(e.principal_id), "name"),
          cell(e.entry_type),
          cell(entryWhat(e), "name"),
          cell(e.release_kind),
          cell(e.guarantee),
          amountCell(e.epsilon),
          amountCell(e.delta),
          cell(e.release_status),
          el("td", {}, hash),
        ),
      );
    }
    const first = page.total === 0 ? 0 : page.offset + 1;
    const last = page.offset + page.entries.length;
    $("page-info").textContent = "Entries " + first + "–" + last + " of " + page.total;
    $("page-prev").disabled = page.offset === 0;
    $("page-next").disabled = last >= page.total;
  }

  async function exportCsv() {
    hideProblem();
    let text;
    try {
      text = await api("GET", datasetPath("/ledger"), { query: { ...ledgerQuery(), format: "csv" }, accept: "text/csv" });
    } catch (err) {
      handleError(err);
      return;
    }
    const blob = new Blob([text], { type: "text/csv" });
    const url = URL.createObjectURL(blob);
    const link = el("a", { href: url, download: "ledger-" + state.dataset.id + ".csv" });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
    showNotice("Exported the ledger as CSV (with the filters applied).");
  }

  // ---- releases ----------------------------------------------------------------------------------

  function valueText(value) {
    if (Array.isArray(value)) {
      const shown = value.slice(0, 6).map((v) => (typeof v === "number" ? fmtNumber(v) : JSON.stringify(v)));
      return "[" + shown.join(", ") + (value.length > 6 ? ", … (" + value.length + " values)" : "") + "]";
    }
    if (typeof value === "number") return fmtNumber(value);
    if (value !== null && typeof value === "object") {
      const json = JSON.stringify(value);
      return json.length > 160 ? json.slice(0, 160) + "…" : json;
    }
    return String(value);
  }

  // The values a reader looks for first, in this order, where a result has them.
  const HEADLINE = [
    "estimate", "ci_lower", "ci_upper", "half_width", "ate", "ate_anchor", "shrinkage_factor",
    "estimator", "cells", "uplift", "estimates", "function_id", "design",
  ];

  // Released covariate positions (adjustment_columns, effect_columns) with their schema names.
  const POSITION_LISTS = ["adjustment_columns", "effect_columns"];

  function namedPositions(name, value) {
    const covariates = (state.dataset && state.dataset.schema && state.dataset.schema.covariates) || [];
    if (!POSITION_LISTS.includes(name) || !Array.isArray(value)) return null;
    return value.map((j) => (covariates[j] ? covariates[j].name : String(j))).join(", ");
  }

  function releasedValues(release) {
    if (release.status === "failed" && release.error) return el("td", { className: "values", text: release.error.title });
    if (!release.result) return el("td", { className: "values", text: "not yet released" });
    // The headline values first; every other released value one click away (<details>).
    const rank = (name) => (HEADLINE.includes(name) ? HEADLINE.indexOf(name) : HEADLINE.length);
    const entries = Object.entries(release.result).sort((a, b) => rank(a[0]) - rank(b[0]));
    const list = (pairs) => {
      const dl = el("dl");
      for (const [name, value] of pairs) {
        dl.append(el("dt", { text: name }), el("dd", { text: namedPositions(name, value) || valueText(value) }));
      }
      return dl;
    };
    const td = el("td", { className: "values" }, list(entries.slice(0, 5)));
    if (entries.length > 5) {
      td.append(el("details", {}, el("summary", { text: "all " + entries.length + " released values" }), list(entries.slice(5))));
    }
    return td;
  }

  const RELEASES_PAGE = 25;

  async function renderReleases({ shown } = {}) {
    // Analysts may read every release of a dataset granted to them (DP outputs); by default
    // the console shows their own, and all of them on request.
    const token = state.viewToken;
    const analyst = state.me.role === "analyst";
    $("mine-only-row").hidden = !analyst;
    let releases = await api("GET", datasetPath("/releases"));
    if (token !== state.viewToken) return; // another view (or a newer render) took over
    if (analyst && $("mine-only").checked) releases = releases.filter((r) => r.principal_id === state.me.id);
    const outcome = state.dataset.schema && state.dataset.schema.outcome;
    $("releases-caption").textContent = "Releases of this dataset visible to this key" +
      (outcome ? "; effects are in the units of the outcome, " + outcome.name : "");
    state.releasesShown = Math.max(shown || state.releasesShown || RELEASES_PAGE, RELEASES_PAGE);
    const newest = releases.slice().reverse().slice(0, state.releasesShown);
    const body = clear($("releases-table").querySelector("tbody"));
    for (const r of newest) {
      body.append(
        el(
          "tr",
          {},
          el("td", {}, el("code", { title: r.id, text: String(r.id).slice(0, 8) })),
          cell(fmtTime(r.created_at)),
          cell(principalName(r.principal_id), "name"),
          cell(r.kind),
          cell(r.guarantee),
          cell(fmtNumber(r.epsilon), "num"),
          cell(fmtNumber(r.delta), "num"),
          cell(r.status),
          releasedValues(r),
        ),
      );
    }
    $("no-releases").hidden = releases.length > 0;
    $("releases-more-row").hidden = releases.length <= newest.length;
    $("releases-count").textContent = "showing the newest " + newest.length + " of " + releases.length;
    // queued or running releases finish on their own: look again while this view is open
    clearTimeout(state.releasesTimer);
    if (newest.some((r) => r.status === "queued" || r.status === "running")) {
      state.releasesTimer = setTimeout(() => {
        if (token === state.viewToken && state.view === "releases") {
          renderReleases().catch((err) => handleError(err));
        }
      }, 3000);
    }
  }

  // ---- account: the signed-in principal's own account record -----------------------------------

  const EVENT_TEXT = {
    created: "created",
    disabled: "disabled",
    enabled: "enabled again",
    key_replaced: "key replaced",
  };

  async function renderAccount() {
    const chain = $("account-chain");
    if (state.me.role === "admin") {
      clear($("account-table").querySelector("tbody"));
      delete chain.dataset.valid;
      chain.textContent = "The admin is configured by CURATOR_ADMIN_KEY: it has no account record.";
      return;
    }
    const [page, check] = await Promise.all([
      api("GET", "/v1/principals/me/events"),
      api("GET", "/v1/principals/me/events/verify"),
    ]);
    // cleared only now, with no await before the rows are appended: two renders in flight (the
    // sign-in's and a click's) each replace the table instead of both appending to it (a CI run
    // once showed every event twice)
    const body = clear($("account-table").querySelector("tbody"));
    chain.dataset.valid = String(check.valid);
    chain.textContent = check.valid
      ? "Account record hash chain verified: " + plural(check.entries, "event", "events") + " intact"
      : "Account record hash chain FAILED at event " + check.first_invalid_seq + ": " + check.reason;
    for (const e of page.events.slice().reverse()) {
      const by = e.actor_id === state.me.id ? "you" : e.actor_id === "admin" ? "the admin" : principalName(e.actor_id);
      body.append(
        el(
          "tr",
          {},
          cell(String(e.seq), "num"),
          cell(fmtTime(e.created_at)),
          cell(EVENT_TEXT[e.event] || e.event),
          cell(by, "name"),
          cell(e.key_prefix + "…"),
        ),
      );
    }
  }

  // ---- chart: cumulative epsilon spent over time, per analyst -----------------------------------

  const COLOURS = ["#0b5cad", "#c2410c", "#15803d", "#7c3aed", "#b91c1c", "#0e7490", "#a16207", "#be185d"];

  async function spendEvents() {
    // Owner: every charge in the ledger. Others: their own releases (the API's view of them).
    if (isOwner()) {
      const page = await api("GET", datasetPath("/ledger"), { query: { entry_type: "charge" } });
      return page.entries.map((e) => ({ who: e.principal_id, at: e.created_at, epsilon: Number(e.epsilon) }));
    }
    const releases = await api("GET", datasetPath("/releases"));
    return releases
      .filter((r) => r.principal_id === state.me.id)
      .map((r) => ({ who: r.principal_id, at: r.created_at, epsilon: Number(r.epsilon) }));
  }

  async function renderChart() {
    const events = await spendEvents();
    events.sort((a, b) => (a.at < b.at ? -1 : a.at > b.at ? 1 : 0));
    const series = new Map();
    for (const e of events) {
      const s = series.get(e.who) || { points: [], total: 0, count: 0, last: null };
      s.total += e.epsilon;
      s.count += 1;
      s.last = e.at;
      s.points.push({ x: Date.parse(e.at), y: s.total });
      series.set(e.who, s);
    }
    const body = clear($("spend-table").querySelector("tbody"));
    for (const [who, s] of series) {
      body.append(el("tr", {}, cell(principalName(who), "name"), cell(s.count, "num"), cell(fmtNumber(s.total), "num"), cell(fmtTime(s.last))));
    }
    if (series.size === 0) body.append(el("tr", {}, el("td", { colspan: "4", text: "No charges yet." })));
    // Each line starts at 0 when the dataset was created and runs on to now.
    const start = Date.parse(state.dataset.created_at);
    const end = Date.now();
    const datasets = [...series].map(([who, s], i) => ({
      label: principalName(who),
      data: [{ x: start, y: 0 }, ...s.points, { x: end, y: s.total }],
      stepped: "before",
      borderColor: COLOURS[i % COLOURS.length],
      backgroundColor: COLOURS[i % COLOURS.length],
      pointRadius: (ctx) => (ctx.dataIndex === 0 || ctx.dataIndex === s.points.length + 1 ? 0 : 3),
    }));
    if (state.chart) state.chart.destroy();
    if (!window.Chart) return;
    const b = state.dataset.budget;
    state.chart = new window.Chart($("spend-chart"), {
      type: "line",
      data: { datasets },
      options: {
        animation: false,
        maintainAspectRatio: false,
        parsing: false,
        scales: {
          x: { type: "linear", title: { display: true, text: "time (UTC)" }, ticks: { callback: (v) => fmtTime(new Date(v).toISOString()).slice(5, 19), maxTicksLimit: 8 } },
          y: { beginAtZero: true, suggestedMax: b && b.is_set ? b.epsilon_total : undefined, title: { display: true, text: "cumulative ε spent" } },
        },
        plugins: {
          legend: { position: "bottom" },
          tooltip: { callbacks: { title: (items) => (items.length ? fmtTime(new Date(items[0].parsed.x).toISOString()) : "") } },
        },
      },
    });
  }

  // ---- wiring ------------------------------------------------------------------------------------

  function wire() {
    $("signin-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const key = $("api-key").value.trim();
      if (!key) {
        renderProblem($("signin-error"), new ApiProblem(0, { title: "Enter your API key" }));
        $("api-key").focus();
        return;
      }
      signIn(key);
    });
    $("sign-out").addEventListener("click", signOut);
    $("dataset-select").addEventListener("change", (event) => chooseDataset(event.target.value));
    for (const button of document.querySelectorAll("#views button")) {
      button.addEventListener("click", () => {
        hideProblem();
        hideNotice();
        showView(button.dataset.view);
      });
    }
    $("budget-form").addEventListener("submit", onBudgetSubmit);
    $("grant-form").addEventListener("submit", onGrantSubmit);
    $("grant-principal").addEventListener("change", syncGrantCaps);
    $("paper-form").addEventListener("submit", onPaperSubmit);
    $("ledger-filters").addEventListener("submit", (event) => {
      event.preventDefault();
      state.ledgerOffset = 0;
      hideProblem();
      renderLedger().catch(handleError);
    });
    $("export-csv").addEventListener("click", exportCsv);
    $("mine-only").addEventListener("change", () => renderReleases().catch(handleError));
    $("releases-more").addEventListener("click", () => {
      renderReleases({ shown: (state.releasesShown || RELEASES_PAGE) + RELEASES_PAGE }).catch(handleError);
    });
    $("verify-again").addEventListener("click", () => verifyChain());
    $("page-prev").addEventListener("click", () => {
      state.ledgerOffset = Math.max(0, state.ledgerOffset - Number($("f-size").value));
      renderLedger().catch(handleError);
    });
    $("page-next").addEventListener("click", () => {
      state.ledgerOffset += Number($("f-size").value);
      renderLedger().catch(handleError);
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    wire();
    const saved = sessionStorage.getItem(KEY_STORAGE);
    if (saved) signIn(saved, { quiet: true });
    else showSignIn();
  });
})();
