// The dashboard's own script: no inline script anywhere (the Content-Security-Policy forbids it).
(function () {
  "use strict";

  // "Select every job shown" checkbox.
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box.matches || !box.matches("[data-select-all]")) return;
    var form = box.form || document;
    form.querySelectorAll('input[type=checkbox][name="' + box.dataset.selectAll + '"]').forEach(function (c) {
      c.checked = box.checked;
    });
  });

  // Forms that ask before they change something (delete).
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });

  // The lag chart of a job's history: [[epoch seconds...], [lag ms...]] in data-lag-chart.
  function drawCharts(root) {
    if (typeof uPlot === "undefined") return;
    root.querySelectorAll("[data-lag-chart]").forEach(function (el) {
      if (el.dataset.drawn) return;
      var data;
      try { data = JSON.parse(el.dataset.lagChart); } catch (e) { return; }
      el.dataset.drawn = "1";
      if (!data[0].length) { el.textContent = "No lag figures yet."; return; }
      var opts = {
        width: Math.max(el.clientWidth, 300),
        height: 160,
        legend: { show: false },
        cursor: { drag: { x: false, y: false } },
        series: [
          {},
          { label: "lag (ms)", stroke: "#3867d6", width: 1.5, points: { show: data[0].length < 60 } }
        ],
        axes: [{}, { label: "lag ms", size: 60 }],
        scales: { x: { time: true } }
      };
      new uPlot(opts, data, el);
    });
  }

  document.addEventListener("DOMContentLoaded", function () { drawCharts(document); });
  document.addEventListener("htmx:load", function (event) { drawCharts(event.detail.elt); });
})();
