"""The viewer's page: one self-contained HTML file (no network, no CDN; opens from a file URL).

    text = render_html(view)      # view: pipeline.view.model.View

Layout of the file: a fixed template (style and script are constants of this module), the
title (``html.escape``), then the data as ``<script type="application/json">`` blocks that
the browser does not execute: ``view-index`` (the index rows, parsed when the page opens)
and ``ep-<n>`` (one per index row, parsed only when that task is opened). The inline
script builds every element with ``textContent`` / ``setAttribute``, never ``innerHTML``, so
artifact text (an observation containing ``<script>``) is shown as text. The embedded JSON
has ``<``, ``>`` and ``&`` written as ``\\u003c``, ``\\u003e``, ``\\u0026`` (a string holding
``</script>`` cannot close its block) and U+2028 / U+2029 escaped.
"""

from __future__ import annotations

import html
import json
from typing import Any

from pipeline.view.model import View

_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def embed_json(obj: Any) -> str:
    """``obj`` as compact JSON that is safe inside a ``<script type="application/json">`` block."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return "".join(_JSON_ESCAPES.get(ch, ch) for ch in text) if any(c in text for c in _JSON_ESCAPES) else text


def _block(block_id: str, obj: Any) -> str:
    return f'<script type="application/json" id="{html.escape(block_id)}">{embed_json(obj)}</script>\n'


def render_html(view: View) -> str:
    """The page for ``view`` (deterministic: the same view gives the same text)."""
    title = html.escape(str(view.index.get("title") or "Episodes"))
    source = html.escape(str(view.index.get("source") or ""))
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
        f"<title>{title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        f"<header><h1>{title}</h1><p class=\"source\">{source}</p></header>\n",
        "<noscript><p>This report is drawn by an inline script (offline): enable JavaScript.</p></noscript>\n",
        "<main id=\"app\"><p>Loading…</p></main>\n",
        _block("view-index", view.index),
    ]
    parts += [_block(f"ep-{n}", d) for n, d in enumerate(view.details)]
    parts.append(f"<script>{SCRIPT}</script>\n</body>\n</html>\n")
    return "".join(parts)


STYLE = r"""
:root { --fg:#1d2330; --muted:#5f6b7a; --line:#d8dee6; --bg:#f6f8fa; --ok:#1a7f37; --bad:#c62828;
  --ground:#e6f4ea; --ground-b:#34a853; --mem:#efe7fb; --mem-b:#8e59d6; --chg:#fff3b0; --div:#fff0e0; --div-b:#f08c00; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); margin: 0; background: #fff; }
header { padding: 10px 20px 4px; border-bottom: 1px solid var(--line); background: var(--bg); }
h1 { font-size: 19px; margin: 0; } h2 { font-size: 17px; margin: 14px 0 4px; } h3 { font-size: 15px; margin: 18px 0 6px; }
.source, .muted { color: var(--muted); } .source { margin: 2px 0 6px; font-size: 12px; }
main { padding: 8px 20px 40px; }
table { border-collapse: collapse; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: var(--bg); font-weight: 600; position: sticky; top: 0; z-index: 1; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.summary td, .summary th { font-size: 13px; }
.filters { display: flex; flex-wrap: wrap; gap: 10px; align-items: center; margin: 12px 0 8px; }
.filters label { font-size: 13px; color: var(--muted); } .filters select, .filters input { font: inherit; padding: 2px 4px; }
#index tbody tr { cursor: pointer; } #index tbody tr:hover { background: #eef4ff; }
a { color: #0b57d0; text-decoration: none; } a:hover { text-decoration: underline; }
.badge { display: inline-block; padding: 0 6px; border-radius: 9px; font-size: 12px; font-weight: 600; line-height: 18px; white-space: nowrap; }
.won { background: #dcf5e3; color: var(--ok); } .lost { background: #fde2e1; color: var(--bad); } .partial { background: #fff1c2; color: #8a6100; }
.adm { background: #e3effd; color: #0b57d0; } .inadm { background: #fde2e1; color: var(--bad); } .rep { background: #eceff3; color: var(--muted); }
.st-Success { background: #dcf5e3; color: var(--ok); } .st-Failure { background: #fde2e1; color: var(--bad); } .st-WiP { background: #eceff3; color: var(--muted); }
.pager { margin: 8px 0; display: flex; gap: 8px; align-items: center; }
.runs-pick { display: flex; flex-wrap: wrap; gap: 12px; margin: 8px 0; font-size: 13px; }
.meta { font-size: 13px; color: var(--muted); margin: 2px 0; } .meta b { color: var(--fg); font-weight: 600; }
.banner { margin: 10px 0; padding: 6px 10px; border-left: 4px solid var(--div-b); background: var(--div); }
.banner.same { border-color: var(--line); background: var(--bg); }
table.turns { width: 100%; table-layout: fixed; } table.turns td { font-size: 13px; }
table.turns td.k { width: 46px; color: var(--muted); font-variant-numeric: tabular-nums; }
tr.diverge td { background: var(--div); } tr.diverge td.k { border-left: 4px solid var(--div-b); color: var(--fg); font-weight: 700; }
.cmd { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-weight: 600; }
.reason { color: #243b6b; font-style: italic; margin-top: 2px; }
.act { margin-top: 2px; } .env { margin-top: 2px; color: #3b4454; } .fb { margin-top: 3px; padding-left: 8px; border-left: 3px solid #f2c200; }
.fb div { white-space: pre-wrap; }
.ended { color: var(--muted); font-style: italic; }
details { margin-top: 3px; } summary { cursor: pointer; color: var(--muted); font-size: 12px; }
details.observation { margin-top: 0; }
pre, .pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; white-space: pre-wrap; word-break: break-word; margin: 2px 0; }
.prompts { display: grid; gap: 12px; }
.prompt { border: 1px solid var(--line); border-radius: 6px; min-width: 0; }
.prompt .head { padding: 4px 8px; background: var(--bg); border-bottom: 1px solid var(--line); font-size: 13px; }
.prompt .body { padding: 4px 0; max-height: 640px; overflow: auto; }
.pl { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; white-space: pre-wrap; word-break: break-word; padding: 0 8px 0 12px; min-height: 1em; border-left: 4px solid transparent; }
.pl.grounding { background: var(--ground); border-left-color: var(--ground-b); }
.pl.memory { background: var(--mem); border-left-color: var(--mem-b); }
.pl.chg { box-shadow: inset 0 0 0 999px rgba(255, 214, 0, .22), inset -6px 0 0 #f2c200; }
.legend span { display: inline-block; margin-right: 12px; font-size: 12px; } .legend i { display: inline-block; width: 12px; height: 12px; vertical-align: -2px; margin-right: 4px; border-radius: 2px; }
.tok td, .tok th { font-size: 13px; }
"""

SCRIPT = r"""
(function () {
"use strict";
const IDX = JSON.parse(document.getElementById("view-index").textContent);
const TF = {}; IDX.turn_fields.forEach(function (f, i) { TF[f] = i; });
const RUNS = IDX.runs.map(function (r) { return r.key; });
const app = document.getElementById("app");
const state = { outcome: "", scene: "", split: "", q: "", page: 0, sel: IDX.default_runs.slice() };
const cache = new Map();

function el(tag, attrs) {
  const e = document.createElement(tag);
  if (attrs) for (const k of Object.keys(attrs)) {
    const v = attrs[k];
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.slice(0, 2) === "on") e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (let i = 2; i < arguments.length; i++) {
    const kid = arguments[i];
    if (kid === null || kid === undefined || kid === false) continue;
    if (Array.isArray(kid)) kid.forEach(function (x) { if (x) e.append(x); }); else e.append(kid);
  }
  return e;
}
function fmt(x, d) { if (x === null || x === undefined) return "–"; if (typeof x !== "number") return String(x); return Number.isInteger(x) ? String(x) : x.toFixed(d === undefined ? 2 : d); }
function pct(x) { return x === null || x === undefined ? "–" : Math.round(x * 100) + "%"; }
function signed(x) { return x === null || x === undefined ? "–" : (x > 0 ? "+" : "") + fmt(x); }
function outcome(res) {
  if (!res) return el("span", { class: "muted", text: "—" });
  if (res.ok) return el("span", { class: "badge won", text: "won" });
  if (res.won) return el("span", { class: "badge partial", text: "won, pref ✗", title: "won, but a preference was broken" });
  return el("span", { class: "badge lost", text: "lost" });
}
function detail(i) {
  if (!cache.has(i)) cache.set(i, JSON.parse(document.getElementById("ep-" + i).textContent));
  return cache.get(i);
}

// ------------------------------------------------------------------ index
function matches(r) {
  if (state.scene && r.scene_id !== state.scene) return false;
  if (state.split && r.scene_split !== state.split) return false;
  if (state.q) {
    const q = state.q.toLowerCase();
    if ((r.task_id + " " + r.objective + " " + r.episode_id).toLowerCase().indexOf(q) < 0) return false;
  }
  if (state.outcome) {
    const p = state.outcome.split("|"), a = r.res[p[1]], b = r.res[p[2]];
    if (!a || !b) return false;
    if (p[0] === "tw") return a.ok && !b.ok;
    if (p[0] === "cw") return !a.ok && b.ok;
    if (p[0] === "differ") return a.ok !== b.ok;
    if (p[0] === "diverge") return r.div[p[1] + "|" + p[2]] !== null && r.div[p[1] + "|" + p[2]] !== undefined;
    if (p[0] === "same") return r.div[p[1] + "|" + p[2]] === null;
  }
  return true;
}
function select(id, label, options, value, onchange) {
  const s = el("select", { id: id, onchange: function () { onchange(s.value); } });
  options.forEach(function (o) { s.append(el("option", { value: o[0], text: o[1], selected: o[0] === value })); });
  return el("label", null, label + " ", s);
}
function renderIndex() {
  document.title = IDX.title;
  const summary = el("table", { class: "summary" },
    el("thead", null, el("tr", null, ["run", "episodes", "success", "won", "mean turns", "mean reward", "prompt tokens", "generated tokens"]
      .map(function (h, j) { return el("th", { class: j ? "num" : null, text: h }); }))),
    el("tbody", null, IDX.runs.map(function (r) {
      return el("tr", null, el("td", { text: r.key, title: r.source }), el("td", { class: "num", text: fmt(r.episodes) }),
        el("td", { class: "num", text: pct(r.success) }), el("td", { class: "num", text: pct(r.won) }),
        el("td", { class: "num", text: fmt(r.mean_turns, 1) }), el("td", { class: "num", text: fmt(r.mean_reward) }),
        el("td", { class: "num", text: fmt(r.prompt_tokens) }), el("td", { class: "num", text: fmt(r.generated_tokens) }));
    })));
  const outcomes = [["", "any"]];
  IDX.pairs.forEach(function (p) {
    const t = p[0], c = p[1], k = "|" + t + "|" + c;
    outcomes.push(["tw" + k, t + " won, " + c + " lost"], ["cw" + k, c + " won, " + t + " lost"],
      ["differ" + k, t + " and " + c + " differ in outcome"], ["diverge" + k, t + " and " + c + " take different actions"],
      ["same" + k, t + " and " + c + " play the same actions"]);
  });
  const filters = el("div", { class: "filters" },
    select("f-outcome", "Outcome", outcomes, state.outcome, function (v) { state.outcome = v; state.page = 0; drawRows(); }),
    select("f-scene", "Scene", [["", "all"]].concat(IDX.scenes.map(function (s) { return [s, s]; })), state.scene,
      function (v) { state.scene = v; state.page = 0; drawRows(); }),
    select("f-split", "Scenes", [["", "seen and held-out"]].concat(IDX.splits.map(function (s) { return [s, s === "heldout" ? "held-out only" : s + " only"]; })),
      state.split, function (v) { state.split = v; state.page = 0; drawRows(); }),
    el("label", null, "Search ", el("input", { id: "f-q", type: "search", value: state.q, placeholder: "task or objective",
      oninput: function (ev) { state.q = ev.target.value; state.page = 0; drawRows(); } })),
    el("span", { id: "f-count", class: "muted" }));
  const head = el("tr", null, el("th", { text: "task" }), el("th", { text: "scene" }), el("th", { text: "split" }),
    el("th", { text: "objective" }));
  RUNS.forEach(function (k) { head.append(el("th", { text: k, title: "outcome · turns · reward" })); });
  if (IDX.pairs.length) head.append(el("th", { text: "diverge (" + IDX.pairs[0][0] + " vs " + IDX.pairs[0][1] + ")" }));
  const table = el("table", { id: "index" }, el("thead", null, head), el("tbody", { id: "rows" }));
  const notes = IDX.notes.map(function (n) { return el("p", { class: "muted", text: n }); });
  app.replaceChildren(el("h2", { text: "Runs" }), summary, notes, el("h2", { text: "Tasks" }), filters,
    el("div", { class: "pager", id: "pager" }), table,
    el("p", { class: "muted", text: "won = success as the compare stage counts it (the game won and, when configured, the user's preferences held). Click a task to see the runs side by side." }));
  drawRows();
}
function drawRows() {
  const rows = IDX.rows.filter(matches);
  const size = IDX.page_size, pages = Math.max(1, Math.ceil(rows.length / size));
  if (state.page >= pages) state.page = pages - 1;
  const shown = rows.slice(state.page * size, (state.page + 1) * size);
  const pair = IDX.pairs[0];
  document.getElementById("rows").replaceChildren.apply(document.getElementById("rows"), shown.map(function (r) {
    const tr = el("tr", { "data-episode": r.i, onclick: function () { location.hash = "#ep=" + r.i; } },
      el("td", null, el("a", { href: "#ep=" + r.i, text: r.task_id })), el("td", { text: r.scene_id }),
      el("td", { text: r.scene_split === "heldout" ? "held-out" : r.scene_split }), el("td", { text: r.objective }));
    RUNS.forEach(function (k) {
      const res = r.res[k];
      tr.append(el("td", { "data-run": k }, outcome(res), res ? " " + fmt(res.turns) + " t · " + signed(res.reward) : null));
    });
    if (pair) { const d = r.div[pair[0] + "|" + pair[1]]; tr.append(el("td", { class: "num", text: d === undefined ? "–" : d === null ? "never" : "turn " + d })); }
    return tr;
  }));
  document.getElementById("f-count").textContent = rows.length + " of " + IDX.rows.length + " tasks";
  const pager = document.getElementById("pager");
  pager.replaceChildren();
  if (pages > 1) pager.append(
    el("button", { disabled: state.page === 0, onclick: function () { state.page--; drawRows(); }, text: "‹ previous" }),
    el("span", { text: "page " + (state.page + 1) + " of " + pages }),
    el("button", { disabled: state.page >= pages - 1, onclick: function () { state.page++; drawRows(); }, text: "next ›" }));
}

// ------------------------------------------------------------------ one task
function S(d, i) { return i === null || i === undefined || i < 0 ? null : d.s[i]; }
function divergence(d, keys) {
  let best = null, who = null;
  for (let a = 0; a < keys.length; a++) for (let b = a + 1; b < keys.length; b++) {
    const x = d.div[keys[a] + "|" + keys[b]];
    if (x !== null && x !== undefined && (best === null || x < best)) { best = x; who = [keys[a], keys[b]]; }
  }
  return { turn: best, runs: who };
}
function turnCell(d, k, t) {
  if (!t) return el("td", { class: "ended", "data-run": k, text: "(episode ended)" });
  const g = function (f) { return t[TF[f]]; };
  const cell = el("td", { "data-run": k });
  const oi = g("obs");
  if (oi !== null && oi >= 0) {
    const o = d.o[oi], ov = {};
    IDX.obs_fields.forEach(function (f, j) { ov[f] = d.s[o[j]]; });
    const where = [ov.location && "in " + ov.location, ov.inventory && "carrying " + ov.inventory].filter(Boolean).join(" · ");
    cell.append(el("details", { class: "observation" }, el("summary", { text: "saw: " + (where || "observation") }),
      ov.description ? el("div", { class: "pre", text: ov.description }) : null,
      ov.visible ? el("div", { class: "pre", text: "visible: " + ov.visible }) : null,
      ov.commands ? el("div", { class: "pre", text: "valid commands: " + ov.commands }) : null));
  }
  const reasoning = S(d, g("reasoning"));
  if (reasoning) cell.append(el("div", { class: "reason", text: reasoning }));
  const cmd = S(d, g("command")), act = S(d, g("action")), valid = g("valid");
  const flags = [];
  if (valid !== null) flags.push(el("span", { class: "badge " + (valid ? "adm" : "inadm"), text: valid ? "admissible" : "not admissible" }));
  if (g("repeated")) flags.push(el("span", { class: "badge rep", text: "repeated" }));
  if (g("won")) flags.push(el("span", { class: "badge won", text: "won" }));
  cell.append(el("div", { class: "act" }, el("span", { class: "cmd action", text: cmd || act || "(none)", title: act || "" }), " ", flags, " ",
    el("span", { class: "muted", text: "reward " + signed(g("reward")) })));
  const env = S(d, g("env"));
  if (env) cell.append(el("div", { class: "env", text: env }));
  const fb = S(d, g("feedback")), status = S(d, g("status"));
  if (fb || (status && status !== "WiP")) {
    const box = el("div", { class: "fb" });
    if (status) box.append(el("span", { class: "badge st-" + status, text: "user: " + status }));
    if (fb) fb.split("\n").forEach(function (line) { box.append(el("div", { class: "feedback", text: line })); });
    cell.append(box);
  }
  const text = S(d, g("text")), mem = S(d, g("memory"));
  const tok = [g("pt") !== null ? "prompt " + fmt(g("pt")) : null, g("gt") !== null ? "generated " + fmt(g("gt")) : null, S(d, g("stop"))].filter(Boolean);
  if (text || mem || tok.length) cell.append(el("details", null, el("summary", { text: "generated text" + (tok.length ? " · " + tok.join(" · ") : "") }),
    text ? el("pre", { class: "generated", text: text }) : null, mem ? el("pre", { text: "memory: " + mem }) : null));
  return cell;
}
function renderTask(i) {
  const r = IDX.rows[i];
  if (!r) { location.hash = ""; return; }
  const d = detail(i);
  const present = RUNS.filter(function (k) { return d.runs[k]; });
  let keys = state.sel.filter(function (k) { return d.runs[k]; });
  if (keys.length === 0) keys = present.slice(0, 2);
  document.title = r.task_id + " · " + IDX.title;
  const pick = el("div", { class: "runs-pick" }, el("span", { class: "muted", text: "Side by side:" }), present.map(function (k) {
    return el("label", null, el("input", { type: "checkbox", value: k, checked: keys.indexOf(k) >= 0, onchange: function (ev) {
      const s = new Set(state.sel); if (ev.target.checked) s.add(k); else s.delete(k);
      state.sel = RUNS.filter(function (x) { return s.has(x); }); renderTask(i); } }), " " + k);
  }));
  const tok = el("table", { class: "tok" }, el("thead", null, el("tr", null, ["run", "outcome", "turns", "reward", "invalid", "repeated",
    "prompt tokens", "generated tokens", "model turns", "stopped at JSON close", "early stop saved ≤"].map(function (h, j) {
      return el("th", { class: j > 1 ? "num" : null, text: h }); }))),
    el("tbody", null, keys.map(function (k) {
      const x = d.runs[k], t = x.tokens, res = r.res[k];
      return el("tr", { "data-run": k }, el("td", { text: k }), el("td", null, outcome(res)), el("td", { class: "num", text: fmt(res.turns) }),
        el("td", { class: "num", text: signed(res.reward) }), el("td", { class: "num", text: fmt(x.num_invalid) }),
        el("td", { class: "num", text: fmt(x.num_repeated) }), el("td", { class: "num", text: fmt(t.prompt_tokens) }),
        el("td", { class: "num", text: fmt(t.generated_tokens) }), el("td", { class: "num", text: fmt(t.model_turns) }),
        el("td", { class: "num", text: fmt(t.json_closed) }), el("td", { class: "num", text: t.saved_max === null ? "–" : fmt(t.saved_max) }));
    })));
  const dv = divergence(d, keys);
  let banner;
  if (keys.length < 2) banner = el("div", { class: "banner same", id: "divergence", text: "Pick two runs to compare them." });
  else if (dv.turn === null) banner = el("div", { class: "banner same", id: "divergence", text: keys.join(", ") + " take the same actions on every turn." });
  else {
    const a = d.runs[dv.runs[0]].turns[dv.turn], b = d.runs[dv.runs[1]].turns[dv.turn];
    const what = function (t) { return t ? (S(d, t[TF.command]) || S(d, t[TF.action]) || "(none)") : "(ended)"; };
    banner = el("div", { class: "banner", id: "divergence" }, "The runs part ways at ",
      el("a", { href: "#ep=" + i, onclick: function (ev) { ev.preventDefault(); const row = document.getElementById("turn-" + dv.turn); if (row) row.scrollIntoView({ block: "center" }); }, text: "turn " + dv.turn }),
      ": " + dv.runs[0] + " → " + what(a) + ", " + dv.runs[1] + " → " + what(b) + ".");
  }
  const n = Math.max.apply(null, keys.map(function (k) { return d.runs[k].turns.length; }).concat([0]));
  const head = el("tr", null, el("th", { text: "turn" }), keys.map(function (k) { return el("th", { text: k }); }));
  const body = el("tbody");
  for (let t = 0; t < n; t++) {
    body.append(el("tr", { id: "turn-" + t, "data-turn": t, class: t === dv.turn ? "diverge" : null },
      el("td", { class: "k", text: String(t) }), keys.map(function (k) { return turnCell(d, k, d.runs[k].turns[t]); })));
  }
  const prompts = el("div", { class: "prompts", style: "grid-template-columns: repeat(" + Math.max(1, keys.length) + ", minmax(0, 1fr))" },
    keys.map(function (k) {
      const p = d.prompts[k];
      if (!p) return el("div", { class: "prompt", "data-run": k }, el("div", { class: "head", text: k + ": no rendered prompt" }));
      const cmp = p.ref === null ? "reference" : p.identical ? "identical to " + p.ref : "+" + p.added + " / −" + p.removed + " lines vs " + p.ref;
      const gate = "memory " + (p.injected ? "injected" : "not injected") + (p.gate_reason ? " (gate: " + p.gate_reason + ")" : "");
      return el("div", { class: "prompt", "data-run": k },
        el("div", { class: "head" }, el("b", { text: k }), " · " + cmp + " · " + gate + " · " + fmt(p.chars) + " chars",
          p.grounding_files.length ? el("div", { class: "muted", text: "grounding: " + p.grounding_files.join(", ") }) : null),
        el("div", { class: "body" }, p.lines.map(function (l) {
          return el("div", { class: "pl " + IDX.kinds[l[1]] + (l[2] ? " chg" : ""), text: d.s[l[0]] });
        })));
    }));
  const legend = el("div", { class: "legend" }, el("span", null, el("i", { style: "background:var(--ground);border:1px solid var(--ground-b)" }), "grounding block"),
    el("span", null, el("i", { style: "background:var(--mem);border:1px solid var(--mem-b)" }), "memory block"),
    el("span", null, el("i", { style: "background:#ffe680" }), "line not in the reference run's prompt"));
  app.replaceChildren(
    el("p", null, el("a", { href: "#", id: "back", text: "← all tasks" })),
    el("h2", { id: "task-title", text: r.task_id + ": " + r.objective }),
    el("div", { class: "meta" }, "episode ", el("b", { text: r.episode_id }), " · scene ", el("b", { text: r.scene_id }),
      r.scene_split ? [" · ", el("b", { text: r.scene_split === "heldout" ? "held-out" : r.scene_split }), " scene"] : null,
      r.quest_length !== null ? [" · quest length ", el("b", { text: fmt(r.quest_length) })] : null),
    d.plan ? el("div", { class: "meta" }, "expert plan: ", el("span", { class: "cmd", text: d.plan })) : null,
    pick, tok, banner,
    el("table", { class: "turns", id: "turns" }, el("colgroup", null, el("col", { style: "width:46px" })), el("thead", null, head), body),
    el("h3", { text: "System prompts" }), legend, prompts);
  window.scrollTo(0, 0);
}

function route() {
  const m = /^#ep=(\d+)$/.exec(location.hash);
  if (m) renderTask(Number(m[1])); else renderIndex();
}
window.addEventListener("hashchange", route);
route();
})();
"""
