// fogshift dashboard: the throughput chart (uPlot) and a busy note on long actions.
"use strict";

const MARK_COLOURS = {
  migration: "#0b5cad", restore: "#9a6700", "node-lost": "#cf222e", "node-back": "#1a7f37",
  abnormal: "#cf222e", normal: "#1a7f37",
};
const LINE_COLOURS = ["#0b5cad", "#1a7f37", "#9a6700", "#8250df", "#cf222e", "#1b7c83", "#bc4c00"];

function marksPlugin(getMarks) {
  return {
    hooks: {
      draw: [(u) => {
        const ctx = u.ctx;
        ctx.save();
        for (const m of getMarks()) {
          const x = u.valToPos(m.t, "x", true);
          if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
          ctx.strokeStyle = MARK_COLOURS[m.kind] || "#57606a";
          ctx.setLineDash([4, 3]);
          ctx.beginPath();
          ctx.moveTo(x, u.bbox.top);
          ctx.lineTo(x, u.bbox.top + u.bbox.height);
          ctx.stroke();
          ctx.fillStyle = ctx.strokeStyle;
          ctx.fillText(m.text, x + 4, u.bbox.top + 12);
        }
        ctx.restore();
      }],
    },
  };
}

// A chart in ``figure`` redrawn every 2 s from the JSON at ``url``: ``build(data)`` gives
// ``{key, options, rows}`` (a new key: the chart is made again, e.g. another set of PEs).
async function liveChart(figure, url, build) {
  let marks = [];
  let plot = null;
  let key = null;
  const width = () => Math.max(figure.clientWidth - 16, 280);
  let busy = false;
  async function refresh() {
    // One request at a time, given up after 10 s: a slow orchestrator made one more every
    // 2 s, filling the browser's connections (and the polls and clicks behind them).
    if (busy) return;
    busy = true;
    let data;
    try {
      const response = await fetch(url, { credentials: "same-origin", signal: AbortSignal.timeout(10000) });
      if (!response.ok) return;
      data = await response.json();
    } catch (e) {
      return;
    } finally {
      busy = false;
    }
    marks = data.marks;
    const made = build(data);
    if (plot === null || made.key !== key) {
      if (plot !== null) plot.destroy();
      key = made.key;
      const options = { width: width(), height: 240, plugins: [marksPlugin(() => marks)] };
      plot = new uPlot({ ...options, ...made.options }, made.rows, figure);
    } else {
      plot.setData(made.rows);
    }
  }
  await refresh();
  setInterval(refresh, 2000);
  // The figure's own box, not the window: it also changes when the page around it does.
  new ResizeObserver(() => plot && plot.setSize({ width: width(), height: 240 })).observe(figure);
}

// Per PE of a pipeline: its throughput (``rates``) or per-hop latency (``latency``).
function startChart(figure) {
  const field = figure.dataset.field || "rates";
  return liveChart(figure, figure.dataset.series, (data) => {
    const values = data[field] || {};
    const elements = Object.keys(values).sort();
    return {
      key: elements.join(),
      rows: [data.t, ...elements.map((e) => values[e])],
      options: {
        // Latency is sampled when a PE emits: its gaps are joined; a rate's gaps are real.
        series: [{}, ...elements.map((e, i) => ({ label: e, stroke: LINE_COLOURS[i % LINE_COLOURS.length], width: 2, spanGaps: field === "latency" }))],
        axes: [{}, { label: figure.dataset.unit || "events/s" }],
      },
    };
  });
}

// The ECG view: one patient's filtered signal (x: seconds of the recording), alarms marked.
function startEcg(figure) {
  return liveChart(figure, figure.dataset.ecg, (data) => ({
    key: "ecg",
    rows: [data.t, data.y],
    options: {
      scales: { x: { time: false } },
      series: [{ label: "s" }, { label: "filtered", stroke: LINE_COLOURS[0], width: 1 }],
      axes: [{ label: "seconds of the recording" }, { label: "mV" }],
    },
  }));
}

// A live part is not refreshed while the keyboard focus is inside it: swapping it would
// throw the focus away every two seconds.
document.addEventListener("htmx:beforeRequest", (event) => {
  const live = event.detail.elt;
  if (live && live.contains(document.activeElement) && document.activeElement !== live) {
    event.preventDefault();
  }
});

// A live part whose poll fails keeps its last figures: say so until one succeeds (htmx
// swaps no error answer: a page went on showing a deleted pipeline, or figures of minutes
// ago while the orchestrator was away, with nothing said).
function pollFailed(text) {
  let note = document.getElementById("poll-failed");
  if (note === null) {
    note = document.createElement("p");
    note.id = "poll-failed";
    note.className = "banner";
    note.setAttribute("role", "status");
    document.getElementById("main").prepend(note);
  }
  note.textContent = `Not updated since ${new Date().toLocaleTimeString()}: ${text} (what is shown below may be old)`;
}
document.addEventListener("htmx:responseError", (event) => {
  const status = event.detail.xhr.status;
  pollFailed(status === 404 ? "it is no longer there (deleted?)" : `the dashboard answered ${status}`);
});
document.addEventListener("htmx:sendError", () => pollFailed("the dashboard does not answer"));
document.addEventListener("htmx:timeout", () => pollFailed("the dashboard does not answer"));
document.addEventListener("htmx:afterRequest", (event) => {
  if (!event.detail.successful) return;
  document.getElementById("poll-failed")?.remove();
  // (The page's own banner says how things were when it was loaded: a live part says now.)
  const banner = document.getElementById("page-banner");
  if (banner) banner.replaceChildren();
});

// Times in the browser's own zone, as the charts' axes are (the server writes UTC).
function localTimes(root) {
  root.querySelectorAll("time[datetime]").forEach((t) => {
    const when = new Date(t.getAttribute("datetime"));
    if (!Number.isNaN(when.getTime())) {
      t.title = t.getAttribute("datetime");
      t.textContent = when.toLocaleTimeString();
    }
  });
}
document.addEventListener("htmx:afterSwap", (event) => localTimes(event.detail.target));

// Back to a page whose button said "working…" (the browser's page cache): usable again.
window.addEventListener("pageshow", () => {
  document.querySelectorAll("button[data-busy]").forEach((button) => {
    button.disabled = false;
    if (button.dataset.label) button.textContent = button.dataset.label;
  });
});

document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  document.querySelectorAll("figure.chart[data-series]").forEach(startChart);
  document.querySelectorAll("figure.chart[data-ecg]").forEach(startEcg);
  // A migration or restore answers when it is done: say so while the browser waits.
  document.querySelectorAll("button[data-busy]").forEach((button) => {
    button.dataset.label = button.textContent;
    button.form.addEventListener("submit", () => {
      button.disabled = true;
      button.textContent = button.dataset.busy;
    });
  });
});
