// The console's only script: a one-time sign-in link's token (in the URL fragment, never sent to
// the server) posted through the sign-in form, times in the viewer's time zone, and the usage
// charts (uPlot, vendored) drawn from the page's JSON data block. The same numbers are in the tables.
(function () {
  "use strict";
  var signin = document.getElementById("signin-form");
  var fromLink = function () {
    if (!signin || location.hash.indexOf("#token=") !== 0) { return false; }
    var token = decodeURIComponent(location.hash.slice("#token=".length));
    history.replaceState(null, "", location.pathname);  // the token leaves the address bar and history
    document.getElementById("token").value = token;
    signin.submit();
    return true;
  };
  if (signin) { window.addEventListener("hashchange", fromLink); }  // a link opened on this page
  if (fromLink()) { return; }
  document.querySelectorAll("time[datetime]").forEach(function (el) {
    var at = new Date(el.getAttribute("datetime"));
    if (!isNaN(at)) { el.textContent = at.toLocaleString(); el.title = el.getAttribute("datetime"); }
  });
  var block = document.getElementById("usage-data");
  if (!block || typeof uPlot === "undefined") { return; }
  var data = JSON.parse(block.textContent);
  var colours = ["#2b6cb0", "#c05621", "#2f855a", "#6b46c1", "#b83280", "#4a5568"];
  var utc = function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); };
  document.querySelectorAll(".chart[data-metric]").forEach(function (el) {
    var metric = el.getAttribute("data-metric");
    var series = [{}];
    var columns = [data.days];
    data.models.forEach(function (m, i) {
      series.push({ label: m, stroke: colours[i % colours.length], width: 2 });
      columns.push(data.series[m][metric]);
    });
    var fmt = function (u, vals) { return vals.map(function (v) { return metric === "cost" ? v.toPrecision(2) : v; }); };
    var axes = [{}, { values: fmt, size: 60 }];
    new uPlot({ width: 360, height: 220, tzDate: utc, series: series, axes: axes, scales: { x: { time: true } } }, columns, el);
  });
})();
