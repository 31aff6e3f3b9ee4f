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

async function startChart(figure) {
  let marks = [];
  let plot = null;
  let names = [];
  const width = () => Math.max(figure.clientWidth - 16, 280);
  async function refresh() {
    let data;
    try {
      const response = await fetch(figure.dataset.series, { credentials: "same-origin" });
      if (!response.ok) return;
      data = await response.json();
    } catch (e) { return; }
    marks = data.marks;
    const values = data[figure.dataset.field || "rates"] || {};
    const elements = Object.keys(values).sort();
    const rows = [data.t, ...elements.map((e) => values[e])];
    if (plot === null || elements.join() !== names.join()) {
      if (plot !== null) plot.destroy();
      names = elements;
      plot = new uPlot({
        width: width(), height: 240,
        // Latency is sampled when a PE emits: its gaps are joined; a rate's gaps are real.
        series: [{}, ...elements.map((e, i) => ({ label: e, stroke: LINE_COLOURS[i % LINE_COLOURS.length], width: 2, spanGaps: figure.dataset.field === "latency" }))],
        axes: [{}, { label: figure.dataset.unit || "events/s" }],
        plugins: [marksPlugin(() => marks)],
      }, rows, figure);
    } else {
      plot.setData(rows);
    }
  }
  await refresh();
  setInterval(refresh, 2000);
  // The figure's own box, not the window: it also changes when the page around it does.
  new ResizeObserver(() => plot && plot.setSize({ width: width(), height: 240 })).observe(figure);
}

// The ECG view: one patient's filtered signal (x: seconds of the recording), alarms marked.
async function startEcg(figure) {
  let marks = [];
  let plot = null;
  const width = () => Math.max(figure.clientWidth - 16, 280);
  async function refresh() {
    let data;
    try {
      const response = await fetch(figure.dataset.ecg, { credentials: "same-origin" });
      if (!response.ok) return;
      data = await response.json();
    } catch (e) { return; }
    marks = data.marks;
    const rows = [data.t, data.y];
    if (plot === null) {
      plot = new uPlot({
        width: width(), height: 240,
        scales: { x: { time: false } },
        series: [{ label: "s" }, { label: "filtered", stroke: LINE_COLOURS[0], width: 1 }],
        axes: [{ label: "seconds of the recording" }, { label: "mV" }],
        plugins: [marksPlugin(() => marks)],
      }, rows, figure);
    } else {
      plot.setData(rows);
    }
  }
  await refresh();
  setInterval(refresh, 2000);
  new ResizeObserver(() => plot && plot.setSize({ width: width(), height: 240 })).observe(figure);
}

// A live part is not refreshed while the keyboard focus is inside it: swapping it would
// throw the focus away every two seconds.
document.addEventListener("htmx:beforeRequest", (event) => {
  const live = event.detail.elt;
  if (live && live.contains(document.activeElement) && document.activeElement !== live) {
    event.preventDefault();
  }
});

// Back to a page whose button said "working…" (the browser's page cache): usable again.
window.addEventListener("pageshow", () => {
  document.querySelectorAll("button[data-busy]").forEach((button) => {
    button.disabled = false;
    if (button.dataset.label) button.textContent = button.dataset.label;
  });
});

document.addEventListener("DOMContentLoaded", () => {
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
