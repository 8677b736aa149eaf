// keiro console: live refresh of changing tables and the operation forms.
// Plain JavaScript, no build step. Server data is only ever inserted as
// text (textContent) or as whole elements the server already escaped.
"use strict";
(function () {
  const body = document.body;
  const base = body.dataset.base || "";
  const TOKEN_KEY = "keiro.admin.token";

  const tokenInput = document.getElementById("token");
  if (tokenInput) {
    tokenInput.value = sessionStorage.getItem(TOKEN_KEY) || "";
    tokenInput.addEventListener("input", () => sessionStorage.setItem(TOKEN_KEY, tokenInput.value));
  }

  const result = document.getElementById("op-result");
  function say(text, failed) {
    result.textContent = text;
    result.classList.toggle("failed", !!failed);
  }

  function field(form, name) {
    const input = form.elements.namedItem(name);
    return input ? input.value : "";
  }

  function parseJson(text, what) {
    try {
      return JSON.parse(text);
    } catch (e) {
      throw new Error(what + " is not JSON: " + e.message);
    }
  }

  // The request a form stands for: its path under /api and its JSON body.
  function request(form) {
    let path = form.dataset.op;
    const shape = form.dataset.shape;
    if (path.includes("{awakeable}")) {
      const id = field(form, "awakeable").trim();
      if (!id) throw new Error("give the awakeable id");
      path = path.replace("{awakeable}", encodeURIComponent(id));
    }
    switch (shape) {
      case "fork": {
        const payload = { from_step: Number(field(form, "from_step")) };
        const newId = field(form, "new_id").trim();
        if (newId) payload.new_id = newId;
        return { path, body: payload };
      }
      case "message":
        return { path, body: { topic: field(form, "topic"), value: parseJson(field(form, "value"), "the value") } };
      case "resolve":
        return { path, body: parseJson(field(form, "value"), "the value") };
      case "reject":
        return { path, body: { reason: field(form, "reason") } };
      default:
        return { path, body: null };
    }
  }

  document.addEventListener("submit", async (event) => {
    const form = event.target.closest("form[data-op]");
    if (!form) return;
    event.preventDefault();
    let op;
    try {
      op = request(form);
    } catch (e) {
      say(e.message, true);
      return;
    }
    const headers = { Accept: "application/json" };
    const token = tokenInput ? tokenInput.value.trim() : "";
    if (token) headers.Authorization = "Bearer " + token;
    if (op.body !== null) headers["Content-Type"] = "application/json";
    say("working…", false);
    let response, reply;
    try {
      response = await fetch(base + "/api/" + op.path, {
        method: "POST",
        headers,
        body: op.body === null ? undefined : JSON.stringify(op.body),
      });
      const text = await response.text();
      try { reply = JSON.parse(text); } catch (_) { reply = { error: text }; }
    } catch (e) {
      say("request failed: " + e.message, true);
      return;
    }
    if (!response.ok) {
      say(response.status + ": " + (reply.error || response.statusText), true);
      return;
    }
    say("done", false);
    if (reply && typeof reply.id === "string" && op.path.endsWith("/fork")) {
      location.href = base + "/instances/" + encodeURIComponent(reply.id);
    } else {
      refresh(true);
    }
  });

  // Replaces each [data-refresh] element with the same one from a fresh
  // copy of the page; forms are left alone so typing is never lost.
  let refreshing = false;
  async function refresh(force) {
    const live = document.getElementById("live");
    if (refreshing || (!force && !(live && live.checked && document.querySelector("[data-live]")))) return;
    refreshing = true;
    try {
      const response = await fetch(location.href, { headers: { Accept: "text/html" } });
      if (!response.ok) return;
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      for (const old of document.querySelectorAll("[data-refresh]")) {
        const replacement = fresh.querySelector('[data-refresh="' + old.dataset.refresh + '"]');
        if (replacement) old.replaceWith(document.importNode(replacement, true));
      }
      // After an operation the offered operations change with the status.
      if (force) {
        for (const id of ["ops", "forms"]) {
          const old = document.getElementById(id);
          const replacement = fresh.getElementById(id);
          if (old && replacement) old.replaceWith(document.importNode(replacement, true));
          else if (old) old.remove();
        }
      }
    } catch (_) {
      // The next tick tries again.
    } finally {
      refreshing = false;
    }
  }
  setInterval(() => refresh(false), 2000);
})();
