// The lag-over-time chart of a group's page: the samples the console took (in the element's
// data-series, [[time_ms, lag], ...]) drawn with the vendored uPlot, in place of the plain
// SVG line the page carries for browsers without JavaScript.
(function () {
  "use strict";
  function draw(box) {
    var series = JSON.parse(box.getAttribute("data-series") || "[]");
    if (series.length < 2 || typeof uPlot === "undefined") {
      return;
    }
    var times = series.map(function (s) { return s[0] / 1000; });
    var lags = series.map(function (s) { return s[1]; });
    var options = {
      width: Math.max(320, Math.min(900, box.clientWidth || 600)),
      height: 220,
      series: [{}, { label: "lag", stroke: "#2f6fb0", width: 2 }],
      axes: [{}, { label: "records behind" }],
      legend: { show: true },
    };
    box.textContent = "";
    new uPlot(options, [times, lags], box);
  }
  document.querySelectorAll("[data-lag-chart]").forEach(draw);
})();
