// udfchain ui: the little JavaScript the pages use (served by the binary).
// Fills counts that are computed after the page shows (`data-count-url`).
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const el of document.querySelectorAll("[data-count-url]")) {
    fetch(el.dataset.countUrl, { credentials: "same-origin" })
      .then((r) => r.text().then((t) => ({ ok: r.ok, t })))
      .then(({ ok, t }) => {
        el.textContent = ok ? t : "unknown";
        if (!ok) el.title = t;
        el.dataset.done = "1";
      })
      .catch(() => { el.textContent = "unknown"; el.dataset.done = "1"; });
  }
});
