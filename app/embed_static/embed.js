/* modalscope embeds: draw the panel's figure (JSON in #ms-embed-data) with plotly.js, fit it
   to the iframe, and re-read a relative window's data every data-refresh seconds (the same
   URL with Accept: application/json, so a signed link refreshes with its own signature).
   Served as a file: the embed's policy allows no inline script. Every piece of text from the
   server is set with textContent, never as HTML. */
(function () {
  "use strict";
  var root = document.getElementById("ms-embed");
  if (!root) { return; }
  var config = {responsive: true, displaylogo: false, displayModeBar: "hover",
                modeBarButtonsToRemove: ["lasso2d", "select2d", "autoScale2d", "toImage"]};

  function plotLayout(fig, box) {
    var layout = fig.layout || {};
    var natural = layout.height;
    delete layout.width;
    delete layout.height;
    layout.autosize = true;
    if (layout.dragmode === "select") { layout.dragmode = "zoom"; }  // no page here to narrow
    if (root.dataset.scroll === "1" && natural && natural > box.clientHeight) {
      layout.height = natural;  // a long waterfall keeps its rows readable; the box scrolls
    }
    return layout;
  }

  function drawFigure(fig) {
    var box = document.getElementById("ms-embed-figure");
    if (!box || !window.Plotly) { return; }
    window.Plotly.react(box, fig.data || [], plotLayout(fig, box), config);
  }

  function fillTable(table) {
    var el = document.getElementById("ms-embed-table");
    if (!el || !table) { return; }
    var body = el.tBodies[0];
    while (body.firstChild) { body.removeChild(body.firstChild); }
    table.rows.forEach(function (row, i) {
      var tr = document.createElement("tr");
      if (table.row_classes && table.row_classes[i]) { tr.className = table.row_classes[i]; }
      table.columns.forEach(function (col) {
        var td = document.createElement("td");
        td.className = "col-" + col[0];
        td.textContent = row[col[0]] == null ? "" : String(row[col[0]]);
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    var empty = document.getElementById("ms-embed-empty");
    if (empty) { empty.textContent = table.empty || ""; }
  }

  function refresh() {
    fetch(window.location.href, {headers: {"Accept": "application/json"}, credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (body) {
        if (!body) { return; }
        var label = document.getElementById("ms-embed-window");
        if (label && body.window) { label.textContent = body.window; }
        if (body.figure) { drawFigure(body.figure); }
        if (body.table) { fillTable(body.table); }
      })
      .catch(function () { /* offline for a moment: the next tick tries again */ });
  }

  var data = document.getElementById("ms-embed-data");
  if (data) { drawFigure(JSON.parse(data.textContent)); }
  var seconds = parseInt(root.dataset.refresh || "0", 10);
  if (seconds > 0) { window.setInterval(refresh, seconds * 1000); }
}());
