// loopwarden dashboard: lease countdowns and relative times (the pages work without it).
// No inline script anywhere: this file is loaded from the dashboard's own origin (CSP 'self').
(function () {
  "use strict";
  function span(seconds) {
    var s = Math.max(0, Math.round(seconds));
    var d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    if (d) return d + "d " + h + "h";
    if (h) return h + "h " + m + "m";
    if (m) return m + "m " + (s % 60) + "s";
    return s + "s";
  }
  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-expires]").forEach(function (el) {
      var left = (Date.parse(el.getAttribute("data-expires")) - now) / 1000;
      el.textContent = left > 0 ? "in " + span(left) : "expired";
      el.classList.toggle("soon", left > 0 && left < 60);
      el.classList.toggle("expired", left <= 0);
    });
    document.querySelectorAll("time[data-ago]").forEach(function (el) {
      var ago = (now - Date.parse(el.getAttribute("datetime"))) / 1000;
      if (!isNaN(ago)) {
        el.title = el.getAttribute("datetime");
        el.textContent = ago >= 0 ? span(ago) + " ago" : "in " + span(-ago);
      }
    });
  }
  document.addEventListener("DOMContentLoaded", tick);
  document.addEventListener("htmx:afterSwap", tick);
  setInterval(tick, 1000);
})();
