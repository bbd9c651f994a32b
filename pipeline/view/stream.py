"""The streams' page: what each condition's memory held at every step of the streaming protocol.

    text = stream_html(rows)          # rows of data/stream/steps.parquet (the stream stage's)

One self-contained HTML file (``reports/stream.html``, written by ``compare`` when the run
streamed; no script, no network): per agent and condition, one table per house in stream
order, a row per step with its outcome, the store's size and hash and the grounding's episodes
when the prompt was rendered, the entries retrieved and injected, and the block the prompt
showed (folded). Every artifact text goes through ``html.escape``: a block quoting ``<script>``
is shown as text. Deterministic: the same rows give the same bytes.
"""

from __future__ import annotations

import html
from typing import Any, Iterable, Mapping

_STYLE = ("body{font-family:system-ui,sans-serif;margin:1.5em;max-width:80em}"
          "table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.2em .5em;"
          "vertical-align:top;font-size:90%}th{background:#f3f3f3}.won{color:#075}.lost{color:#a00}"
          "pre{white-space:pre-wrap;max-width:60em;margin:.3em 0}code{font-size:90%}")


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def stream_html(rows: Iterable[Mapping[str, Any]], title: str = "Streams") -> str:
    """The page for the steps ``rows`` (module docstring)."""
    rows = sorted(rows, key=lambda r: (str(r["agent"]), str(r["condition"]), str(r["scene_id"]), int(r["position"])))
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{_e(title)}</title>",
             f"<style>{_STYLE}</style></head><body>", f"<h1>{_e(title)}</h1>",
             "<p>Each house's eval tasks in one seeded order; every episode entered its condition's own grounding "
             "and memory before the house's next task. A row is one step: what the prompt was rendered from, what "
             "it showed, and how the episode went.</p>"]
    groups: dict[tuple[str, str], dict[str, list[Mapping[str, Any]]]] = {}
    for r in rows:
        groups.setdefault((str(r["agent"]), str(r["condition"])), {}).setdefault(str(r["scene_id"]), []).append(r)
    parts.append("<ul>" + "".join(f'<li><a href="#{_e(a)}-{_e(c)}">{_e(a)}: {_e(c)}</a> '
                                  f"({sum(bool(r['success']) for h in houses.values() for r in h)} of "
                                  f"{sum(len(h) for h in houses.values())} won)</li>"
                                  for (a, c), houses in groups.items()) + "</ul>")
    for (agent, cond), houses in groups.items():
        parts.append(f'<h2 id="{_e(agent)}-{_e(cond)}">{_e(agent)}: {_e(cond)}</h2>')
        for scene, steps in houses.items():
            parts.append(f"<h3>{_e(scene)}</h3><table><tr><th>position</th><th>quest</th><th>outcome</th>"
                         "<th>store entries (hash)</th><th>grounding episodes</th><th>retrieved</th>"
                         "<th>injected</th><th>block shown</th></tr>")
            for r in steps:
                won = bool(r["success"])
                block = str(r.get("memory_block") or "")
                shown = (f"<details><summary>{len(block)} characters</summary><pre>{_e(block)}</pre></details>"
                         if block else "–")
                parts.append(
                    f"<tr><td>{int(r['position'])}</td><td>{_e(r['quest_id'])}</td>"
                    f"<td class=\"{'won' if won else 'lost'}\">{'won' if won else 'lost'} in {int(r['turns'])}</td>"
                    f"<td>{int(r['store_entries'])} (<code>{_e(str(r.get('store_hash') or '–')[:12])}</code>)</td>"
                    f"<td>{int(r['grounding_episodes'])}</td>"
                    f"<td>{_e(', '.join(r.get('retrieved_entry_ids') or []) or '–')}</td>"
                    f"<td>{_e(', '.join(r.get('injected_entry_ids') or []) or '–')}</td><td>{shown}</td></tr>")
            parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
