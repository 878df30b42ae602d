// rlmesh dashboard: reads the path, fetches /api/..., draws with plotly.js (Plotly.react keeps zoom on refresh).
// Every chart arrives as {id, title, kind, x_label, y_label, x_axis, series: [{name, x, y}]}: the same
// ChartSpec data `rlmesh plot` draws. Nulls in x/y are gaps (a stall), so lines are never bridged.
"use strict";

const $ = (sel) => document.querySelector(sel);
const REFRESH = (window.RLMESH && window.RLMESH.refreshMs) || 2000;
const parts = location.pathname.split("/").filter(Boolean);
const RUN = parts[0] === "run" ? decodeURIComponent(parts[1]) : null;
const TAB = RUN ? (parts[2] || "curves") : (parts[0] === "compare" ? "compare" : "runs");
const ENV_STEP_CHARTS = new Set(["eval_env_steps", "reward_env_steps", "loss_env_steps"]);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

async function api(path) {
  const r = await fetch(path, {credentials: "same-origin"});
  const body = await r.json().catch(() => ({error: `HTTP ${r.status}`}));
  if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
  return body;
}

function fmt(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number") return Number.isInteger(v) ? v.toLocaleString("en") : v.toPrecision(5);
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function table(columns, rows, id) {
  const t = el("table", id ? {id} : {});
  t.append(el("tr", {}, ...columns.map((c) => el("th", {text: c}))));
  for (const r of rows) {
    t.append(el("tr", {}, ...columns.map((c) => {
      const v = r[c];
      const td = el("td", {text: fmt(v), class: typeof v === "number" ? "num" : ""});
      if (c === "event" || c === "state") td.classList.add(`ev-${v}`);
      if (c === "status") td.classList.add(`status-${v}`);
      return td;
    })));
  }
  return t;
}

function nav() {
  const links = [["/", "runs", "Runs"]];
  if (RUN) {
    const base = `/run/${encodeURIComponent(RUN)}`;
    links.push([base, "curves", `Run ${RUN}`], [`${base}/meshes`, "meshes", "Meshes"],
               [`${base}/health`, "health", "Health"], [`${base}/samples`, "samples", "Samples"],
               [`${base}/sql`, "sql", "SQL"]);
  }
  links.push(["/compare", "compare", "Compare"]);
  $("#nav").replaceChildren(...links.map(([href, tab, label]) =>
    el("a", {href, class: tab === TAB ? "active" : "", id: `nav-${tab}`, text: label})));
}

function traces(chart) {
  const mode = chart.kind === "markers" ? "markers" : (chart.kind === "line" ? "lines+markers" : undefined);
  return chart.series.map((s) => chart.kind === "bar"
    ? {type: "bar", name: s.name, x: s.x, y: s.y}
    : {type: "scatter", mode: s.x.length > 60 && chart.kind === "line" ? "lines" : mode, name: s.name,
       x: s.x, y: s.y, connectgaps: false, marker: {size: 6}});
}

// Series whose typical values differ by this factor or more share a log y axis on the Compare page: a
// 2k-step run's throughput (bins of a few ms: 300-400k steps/s) on a linear axis flattens a long run's line.
const LOG_SPREAD = 10;

function median(values) {
  const v = values.filter((x) => x != null && x > 0).sort((a, b) => a - b);
  return v.length ? v[Math.floor(v.length / 2)] : null;
}

function spread(chart) {
  if (chart.kind === "bar") return 1;
  const all = chart.series.flatMap((s) => s.y).filter((y) => y != null);
  if (!all.length || all.some((y) => y <= 0)) return 1;  // a log axis cannot show 0 or a negative value
  const medians = chart.series.map((s) => median(s.y)).filter((m) => m != null);
  return medians.length > 1 ? Math.max(...medians) / Math.min(...medians) : 1;
}

// The modebar (plotly's toolbar) sits in the top 28 px of the figure; the title goes in a row below it.
const HEIGHT = 320, MODEBAR_PX = 30;

function drawChart(div, chart, deaths, opts = {}) {
  const shapes = [];
  if (deaths && ENV_STEP_CHARTS.has(chart.id)) {
    for (const s of deaths.series) for (const x of s.x) if (x != null) {
      shapes.push({type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1,
                   line: {color: "#d62728", dash: "dash", width: 1}});
    }
  }
  const points = chart.series.reduce((n, s) => n + s.x.filter((v, i) => v != null && s.y[i] != null).length, 0);
  const ratio = opts.compare ? spread(chart) : 1;
  const logY = ratio >= LOG_SPREAD;
  const yTitle = logY ? `${chart.y_label} (log)` : chart.y_label;  // the runs differ `ratio` times
  const layout = {
    title: {text: chart.title, font: {size: 14}, yref: "container", y: 1 - MODEBAR_PX / HEIGHT, yanchor: "top"},
    margin: {l: 60, r: 20, t: MODEBAR_PX + 34, b: 50}, height: HEIGHT,
    xaxis: {title: {text: chart.x_label}}, yaxis: {title: {text: yTitle}, automargin: true, type: logY ? "log" : "linear"},
    shapes, uirevision: `${chart.id}-${logY}`, showlegend: chart.series.length > 1, legend: {orientation: "h", y: -0.25},
    annotations: points ? [] : [{text: "no rows yet", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5}],
  };
  Plotly.react(div, traces(chart), layout, {displaylogo: false, responsive: true});
  div.dataset.points = String(points);
  div.dataset.rows = String(chart.rows);
}

function chartGrid(charts, deaths, container, opts = {}) {
  for (const c of charts) {
    let div = document.getElementById(`chart-${c.id}`);
    if (!div) {
      div = el("div", {id: `chart-${c.id}`, class: "card chart"});
      container.append(div);
    }
    drawChart(div, c, deaths, opts);
  }
}

function live(text) { $("#live").textContent = text; }

async function every(fn) {
  for (;;) {
    const t0 = performance.now();
    try {
      const more = await fn();
      live(`updated ${new Date().toLocaleTimeString()} (${Math.round(performance.now() - t0)} ms)`);
      if (more === false) return;
    } catch (e) {
      live(`update failed: ${e.message}`);
    }
    await new Promise((r) => setTimeout(r, REFRESH));
  }
}

async function runsPage(main) {
  main.append(el("h2", {text: "Runs"}),
    el("div", {class: "toolbar"}, el("button", {id: "compare-selected", text: "Compare selected"})),
    el("div", {id: "runs"}));
  $("#compare-selected").onclick = () => {
    const ids = [...document.querySelectorAll("input.pick:checked")].map((i) => i.value);
    location.href = `/compare?runs=${ids.map(encodeURIComponent).join(",")}`;
  };
  await every(async () => {
    const runs = await api("/api/runs");
    const picked = new Set([...document.querySelectorAll("input.pick:checked")].map((i) => i.value));
    const t = table(["", "id", "status", "recipe", "duration_s", "final eval", "env steps"], [], "runs-table");
    for (const r of runs) {
      const box = el("input", {type: "checkbox", class: "pick", value: r.id});
      box.checked = picked.has(r.id);
      const final = r.final_value == null ? "" : `${r.final_metric} ${fmt(r.final_value)}`;
      t.append(el("tr", {},
        el("td", {}, box), el("td", {}, el("a", {href: `/run/${encodeURIComponent(r.id)}`, text: r.id})),
        el("td", {text: r.status, class: `status-${r.status}`}), el("td", {text: r.recipe}),
        el("td", {text: fmt(r.duration_s), class: "num"}), el("td", {text: final, class: "num"}),
        el("td", {text: fmt(r.final_env_steps), class: "num"})));
    }
    $("#runs").replaceChildren(runs.length ? t : el("p", {text: "no runs yet"}));
  });
}

async function chartsPage(main, page) {
  const grid = el("div", {class: "grid", id: `${page}-charts`});
  main.append(el("h2", {text: page === "run" ? `Run ${RUN}` : `Health of run ${RUN}`}), grid);
  await every(async () => {
    const charts = await api(`/api/run/${encodeURIComponent(RUN)}/charts?page=${page}`);
    const deaths = charts.find((c) => c.id === "deaths");
    chartGrid(charts.filter((c) => c.id !== "deaths"), deaths, grid);
  });
}

async function meshesPage(main) {
  main.append(el("h2", {text: `Meshes of run ${RUN}`}),
    el("h3", {text: "Procs"}), el("div", {id: "procs", class: "scroll"}),
    el("div", {class: "card chart", id: "chart-proc_events"}),
    el("h3", {text: "Deaths, restarts and injected faults"}), el("div", {id: "events", class: "scroll"}),
    el("h3", {text: "Work items"}), el("div", {id: "work"}));
  await every(async () => {
    const m = await api(`/api/run/${encodeURIComponent(RUN)}/meshes`);
    $("#procs").replaceChildren(table(m.procs.columns.map((c) => c.name), m.procs.rows, "procs-table"));
    drawChart($("#chart-proc_events"), m.timeline[0]);
    $("#events").replaceChildren(m.events.rows.length
      ? table(m.events.columns.map((c) => c.name), m.events.rows, "events-table")
      : el("p", {id: "events-table", text: "no deaths, restarts or injected faults"}));
    const w = m.work;
    const rows = [["issued", w.issued], ["re-issued", w.reissued], ["completed", w.completed],
      ["consumed by training", w.consumed], ["dropped", w.dropped], ["abandoned", w.abandoned], ["unused", w.unused],
      ["rescored", w.rescored], ["open (in flight while live; lost if the run ended)", w.lost],
      ["counted twice", w.counted_twice]].map(([k, v]) => ({account: k, items: v}));
    $("#work").replaceChildren(table(["account", "items"], rows, "work-table"));
  });
}

async function samplesPage(main) {
  main.append(el("h2", {text: `Samples of run ${RUN}`}),
    el("p", {text: "The newest completions the generators wrote, with their prompts, answers and rewards."}),
    el("div", {id: "samples", class: "scroll"}));
  await every(async () => {
    const s = await api(`/api/run/${encodeURIComponent(RUN)}/samples`);
    $("#samples").replaceChildren(s.rows.length
      ? table(s.columns.map((c) => c.name), s.rows, "samples-table")
      : el("p", {id: "samples-table", text: "no samples: an LLM recipe writes them (generator.samples_per_item)"}));
  });
}

async function sqlPage(main) {
  const base = `/api/run/${encodeURIComponent(RUN)}`;
  const input = el("textarea", {id: "sql-input", spellcheck: "false"});
  input.value = "SELECT policy_version, count(*) AS rollouts, avg(reward) AS mean_reward\n" +
                "FROM rollouts GROUP BY policy_version ORDER BY policy_version";
  const xSel = el("select", {id: "sql-x"}), ySel = el("select", {id: "sql-y"});
  const left = el("div", {},
    el("h2", {text: `SQL on run ${RUN} (read-only)`}), input,
    el("div", {class: "toolbar"}, el("button", {id: "sql-run", text: "Run (Ctrl+Enter)"}),
       el("a", {id: "sql-csv", href: "#", text: "download CSV"}), el("a", {id: "sql-parquet", href: "#", text: "download Parquet"}),
       el("span", {text: "chart x:"}), xSel, el("span", {text: "y:"}), ySel),
    el("div", {id: "sql-status"}), el("div", {class: "card chart", id: "sql-chart"}), el("div", {id: "sql-result", class: "scroll"}));
  const schemaBox = el("div", {class: "schema", id: "schema"}, el("p", {text: "loading schema…"}));
  main.append(el("div", {class: "sqlpage"}, left, schemaBox));
  let last = null;

  function drawResult() {
    if (!last || !last.rows.length) { Plotly.purge("sql-chart"); return; }
    const x = xSel.value, y = ySel.value;
    const rows = last.rows;
    const chart = {id: "sql", title: `${y} by ${x}`, kind: rows.length > 1 ? "line" : "markers", x_label: x, y_label: y,
      rows: rows.length, series: [{name: y, x: rows.map((r) => r[x]), y: rows.map((r) => r[y])}]};
    drawChart($("#sql-chart"), chart);
  }

  async function run() {
    const q = input.value;
    const enc = encodeURIComponent(q);
    $("#sql-csv").href = `${base}/sql?format=csv&q=${enc}`;
    $("#sql-parquet").href = `${base}/sql?format=parquet&q=${enc}`;
    $("#sql-status").replaceChildren(el("span", {text: "running…"}));
    $("#sql-chart").dataset.points = "0";  // nothing stale is taken for this query's result
    try {
      const t0 = performance.now();
      last = await api(`${base}/sql?q=${enc}`);
      const names = last.columns.map((c) => c.name);
      const numeric = last.columns.filter((c) => /int|float|double|decimal/i.test(c.type)).map((c) => c.name);
      xSel.replaceChildren(...names.map((n) => el("option", {value: n, text: n})));
      ySel.replaceChildren(...numeric.map((n) => el("option", {value: n, text: n})));
      if (numeric.length) ySel.value = numeric.find((n) => n !== names[0]) || numeric[0];
      $("#sql-status").replaceChildren(el("span", {id: "sql-ok",
        text: `${last.row_count} row${last.row_count === 1 ? "" : "s"} in ${Math.round(performance.now() - t0)} ms` +
              (last.truncated ? " (first 5000 shown; the downloads have all)" : "")}));
      $("#sql-result").replaceChildren(table(names, last.rows, "sql-table"));
      drawResult();
    } catch (e) {
      last = null;
      $("#sql-status").replaceChildren(el("div", {class: "error", id: "sql-error", text: e.message}));
      $("#sql-result").replaceChildren();
    }
  }
  $("#sql-run").onclick = run;
  xSel.onchange = ySel.onchange = drawResult;
  input.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) run(); });
  const schema = await api(`${base}/schema`);
  const byTable = {};
  for (const r of schema) (byTable[r.table] = byTable[r.table] || []).push(r);
  schemaBox.replaceChildren(el("h3", {text: "Schema"}), ...Object.entries(byTable).map(([t, cols]) =>
    el("details", {}, el("summary", {text: t}), ...cols.map((c) =>
      el("div", {title: c.description || ""}, el("span", {class: "col", text: c.column}), " ",
         el("span", {class: "type", text: c.type}))))));
}

async function comparePage(main) {
  const params = new URLSearchParams(location.search);
  const ids = (params.get("runs") || "").split(",").filter(Boolean);
  main.append(el("h2", {text: ids.length ? `Comparing ${ids.join(", ")}` : "Compare runs"}));
  if (ids.length < 2) {
    main.append(el("p", {text: "Pick two or more runs on the Runs page and press “Compare selected”."}));
    return;
  }
  const grid = el("div", {class: "grid", id: "compare-charts"});
  main.append(grid);
  await every(async () => {
    chartGrid(await api(`/api/compare?runs=${ids.map(encodeURIComponent).join(",")}`), null, grid, {compare: true});
  });
}

nav();
const main = $("#main");
(({runs: runsPage, curves: (m) => chartsPage(m, "run"), health: (m) => chartsPage(m, "health"), meshes: meshesPage,
  samples: samplesPage, sql: sqlPage, compare: comparePage})[TAB] || runsPage)(main);
