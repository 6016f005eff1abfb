// memstream console: the few things a server-rendered page cannot do alone.
// Refresh a region from its fragment URL (data-refresh, every data-every ms) until
// the fragment says it is complete; "/" focuses the search box.
(function () {
  "use strict";
  function refresh(region) {
    var url = region.getAttribute("data-refresh");
    var every = parseInt(region.getAttribute("data-every") || "5000", 10);
    function tick() {
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.text(); })
        .then(function (html) {
          region.innerHTML = html;
          if (!region.querySelector('[data-complete="true"]')) { setTimeout(tick, every); }
        })
        .catch(function () { setTimeout(tick, every * 2); });
    }
    setTimeout(tick, every);
  }
  // Load a region's fragment once (data-fragment): a slower read (e.g. the log) does
  // not hold up the page; its links work without script too.
  function load(region) {
    fetch(region.getAttribute("data-fragment"), { credentials: "same-origin", headers: { "X-Console-Fragment": "1" } })
      .then(function (r) { return r.text().then(function (html) { return { ok: r.ok, html: html }; }); })
      .then(function (r) { region.innerHTML = r.ok ? r.html : '<p role="alert">This part could not be loaded.</p>'; })
      .catch(function () { region.innerHTML = '<p role="alert">This part could not be loaded.</p>'; });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh]").forEach(refresh);
    document.querySelectorAll("[data-fragment]").forEach(load);
  });
  document.addEventListener("keydown", function (e) {
    var t = e.target;
    var typing = t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.tagName === "SELECT" || t.isContentEditable);
    if (e.key === "/" && !typing) {
      var q = document.getElementById("q");
      if (q) { e.preventDefault(); q.focus(); q.select(); }
    }
  });
})();
