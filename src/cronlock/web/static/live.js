// Live updates without reloading: every few seconds, fetch the server-rendered (and
// server-escaped) fragment of the part marked data-live, and swap it in.
(function () {
  "use strict";
  var box = document.querySelector("[data-live]");
  if (!box) { return; }
  var every = Math.max(1, Number(box.getAttribute("data-every")) || 3) * 1000;
  function tick() {
    fetch(box.getAttribute("data-live"), { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { if (!r.ok) { throw new Error(String(r.status)); } return r.text(); })
      .then(function (html) { box.innerHTML = html; box.removeAttribute("data-stale"); })
      .catch(function () { box.setAttribute("data-stale", "true"); })
      .then(function () { window.setTimeout(tick, every); });
  }
  window.setTimeout(tick, every);
}());
