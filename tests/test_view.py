"""The transcript viewer (``python -m pipeline.view``): content, escaping, divergence, the
compare stage's page, two revisions side by side, the size budget, and a real headless
Chromium clicking through the page (skipped only when no Chromium is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.core.io import write_parquet
from pipeline.session.episodes import write_episodes
from pipeline.view import model as M
from pipeline.view.html import embed_json, render_html
from pipeline.view.load import write_view
from pipeline.view.synthetic import synthetic_runs

EVIL = '<script>window.__pwned = 1</script></script><img src=x onerror="window.__pwned = 2">&amp;'
CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and Path(p).exists()), None)


def _blocks(page: str) -> dict[str, object]:
    """Every embedded JSON block of a page, parsed (what the inline script reads)."""
    return {m.group(1): json.loads(m.group(2)) for m in
            re.finditer(r'<script type="application/json" id="([^"]+)">(.*?)</script>', page, re.S)}


def _outcomes(runs, wins: dict[str, list[int]]) -> None:
    """Set each run's success per task (index i of ``wins[run key]``)."""
    for run in runs:
        for e, w in zip(run.episodes, wins[run.key]):
            e["is_correct"] = e["won"] = bool(w)


def _turn(action: str, command: str | None = None, **extra) -> dict:
    return {"action": json.dumps({"action": action, "target": None}), "command": command or action, **extra}


# --------------------------------------------------------------------------- the model


def test_first_divergence_is_the_first_different_action_or_an_end():
    a = [_turn("look"), _turn("go_to", "go west"), _turn("open", "open Fridge_0")]
    assert M.first_divergence(a, [dict(t) for t in a]) is None
    assert M.first_divergence(a, a[:1] + [_turn("go_to", "go east")] + a[2:]) == 1
    assert M.first_divergence(a, a[:2]) == 2  # one run ended
    # The same action written with keys in another order is the same action; a different command is not.
    same = [{**t, "action": json.dumps(json.loads(t["action"]), sort_keys=False, indent=1)} for t in a]
    assert M.first_divergence(a, same) is None
    assert M.first_divergence(a, [a[0], {**a[1], "command": "go north"}, a[2]]) == 1
    assert M.first_divergence([], []) is None


def test_prompt_blocks_are_marked_and_differences_flagged():
    memory = '## Episodic Memory (advisories)\n{"advice": "open the fridge first"}\n\n'
    base = "Intro line.\n\n## Objective\nPut Apple_2 in Fridge_0.\n\n## Grounding (taught)\n#### Spatial\n- Apple_2 is " \
           "in the Kitchen.\n\n{mem}## Memory (State Continuity)\n- Plan: $memory[plan]\n"
    c1, c2 = base.format(mem=""), base.format(mem=memory)
    kinds = M.prompt_kinds(c2, memory)
    by_text = {t: k for t, k in kinds}
    assert by_text["## Grounding (taught)"] == M.GROUNDING and by_text["- Apple_2 is in the Kitchen."] == M.GROUNDING
    assert by_text["#### Spatial"] == M.GROUNDING  # a deeper heading stays inside the block
    assert by_text['{"advice": "open the fridge first"}'] == M.MEMORY
    assert by_text["## Episodic Memory (advisories)"] == M.MEMORY
    assert by_text["## Memory (State Continuity)"] == M.PLAIN and by_text["Intro line."] == M.PLAIN
    strings = M.Strings()
    lines, added, removed = M.prompt_lines(c2, memory, c1, strings)
    changed = [strings.table[s] for s, _, c in lines if c]
    assert changed == ["## Episodic Memory (advisories)", '{"advice": "open the fridge first"}', ""]
    assert (added, removed) == (3, 0)
    lines, added, removed = M.prompt_lines(c1, "", c1, strings)
    assert not any(c for _, _, c in lines) and (added, removed) == (0, 0)
    assert M.reference_runs(["C1", "C2", "C2_silent", "C2_placebo"], [("C2", "C1"), ("C2_silent", "C1")]) == {
        "C1": None, "C2": "C1", "C2_silent": "C1", "C2_placebo": "C1"}


def test_view_content_outcomes_tokens_and_divergence():
    runs, manifest = synthetic_runs(6, ("C1", "C2"), seed=1)
    _outcomes(runs, {"C1": [0, 1, 0, 0, 1, 0], "C2": [1, 1, 1, 0, 0, 0]})
    view = M.build_view(runs, pairs=[("C2", "C1"), ("C2", "C9")], manifest=manifest, max_new_tokens=96)
    idx = view.index
    assert idx["pairs"] == [["C2", "C1"]] and idx["default_runs"] == ["C1", "C2"]  # C9 is not a run
    assert [r["task_id"] for r in idx["rows"]] == [f"{m['scene_id']}/{m['quest_id']}" for m in manifest]
    assert [r["res"]["C2"]["ok"] and not r["res"]["C1"]["ok"] for r in idx["rows"]] == [1, 0, 1, 0, 0, 0]
    assert {r["scene_split"] for r in idx["rows"]} == {"seen"} and idx["scenes"] == ["scene_00", "scene_01"]
    assert idx["runs"][0]["success"] == pytest.approx(2 / 6, abs=1e-4)
    for row, detail in zip(idx["rows"], view.details):
        t1 = [t for t in runs[0].turns if t["episode_id"] == row["episode_id"]]
        t2 = [t for t in runs[1].turns if t["episode_id"] == row["episode_id"]]
        assert row["div"]["C2|C1"] == detail["div"]["C1|C2"] == M.first_divergence(t1, t2)
        # Turns come back from the string table as they were written.
        (k, arr) = next((i, a) for i, a in enumerate(detail["runs"]["C1"]["turns"]))
        F = {f: i for i, f in enumerate(M.TURN_FIELDS)}
        assert detail["s"][arr[F["command"]]] == t1[k]["command"] and detail["s"][arr[F["reasoning"]]] == t1[k]["reasoning"]
        obs = detail["o"][arr[F["obs"]]]
        assert detail["s"][obs[M.OBS_FIELDS.index("description")]] == json.loads(t1[k]["observation"])["description"]
        tok = detail["runs"]["C1"]["tokens"]
        closed = [t for t in t1 if t["stop_reason"] == "json_closed"]
        assert tok["json_closed"] == len(closed) and tok["model_turns"] == len(t1)
        assert tok["saved_max"] == sum(96 - t["generated_tokens"] for t in closed)
        p1, p2 = detail["prompts"]["C1"], detail["prompts"]["C2"]
        assert p1["ref"] is None and p2["ref"] == "C1" and p2["identical"] is False and p2["added"] > 0
        assert {k for _, k, _ in p2["lines"]} == {M.PLAIN, M.GROUNDING, M.MEMORY}
        assert all(c for _, k, c in p2["lines"] if k == M.MEMORY)  # C1 has no memory block


def test_sparse_rows_from_the_compare_tests_render():
    """Rows with only the columns tests/test_compare.py fakes (no observation, no prompt text)."""
    from test_compare import _condition, _manifest

    man = _manifest(1, 3)
    runs = [M.Run(c, c, d.episodes, d.turns, d.prompts) for c, d in
            (("C1", _condition("C1", man, [0, 1, 0])), ("C2", _condition("C2", man, [1, 1, 0])))]
    view = M.build_view(runs)
    assert len(view.index["rows"]) == 3 and view.index["pairs"] == [["C2", "C1"]]
    assert view.details[0]["div"]["C1|C2"] == 4  # the same (null) actions; C2 won in 4 turns, C1 played 7
    assert view.details[0]["runs"]["C1"]["tokens"]["saved_max"] is None
    assert "<!DOCTYPE html>" in render_html(view)


# --------------------------------------------------------------------------- the page


def test_rendering_is_escaped_and_the_data_round_trips(tmp_path):
    runs, manifest = synthetic_runs(3, ("C1", "C2"), seed=2)
    t0 = runs[0].turns[0]
    obs = json.loads(t0["observation"])
    t0["observation"] = json.dumps({**obs, "description": EVIL})
    t0["reasoning"] = EVIL
    runs[0].episodes[0]["objective"] = EVIL
    view = M.build_view(runs, manifest=[], title="<b>title</b>", source="</script><i>source</i>")
    page = render_html(view)
    assert "<script>window.__pwned" not in page and "<img" not in page and "<i>source" not in page
    assert "<title>&lt;b&gt;title&lt;/b&gt;</title>" in page
    # Only our own script tags: the template's, the JSON blocks and the inline script.
    assert page.count("<script") == page.count("</script>") == 2 + len(view.details)
    blocks = _blocks(page)
    assert blocks["view-index"]["rows"][0]["objective"] == EVIL
    d0 = blocks["ep-0"]
    assert EVIL in d0["s"] and d0 == json.loads(json.dumps(view.details[0]))
    assert embed_json({"x": "</script>\u2028&"}) == '{"x":"\\u003c/script\\u003e\\u2028\\u0026"}'
    # Self-contained: no external resource of any kind; deterministic.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page) and "<link" not in page
    assert "http://" not in page and "https://" not in page
    assert render_html(M.build_view(runs, manifest=[], title="<b>title</b>", source="</script><i>source</i>")) == page
    out = write_view(view, tmp_path / "v.html")
    assert out.read_text(encoding="utf-8") == page


def test_size_budget_1000_episodes(tmp_path):
    """250 tasks x 4 conditions, 30-turn lost episodes as in the default run: under 20 MB."""
    runs, manifest = synthetic_runs(250, ("C1", "C2", "C2_silent", "C2_placebo"), seed=0)
    assert sum(len(r.episodes) for r in runs) == 1000
    t0 = time.perf_counter()
    view = M.build_view(runs, pairs=[("C2", "C1")], manifest=manifest, max_new_tokens=96)
    path = write_view(view, tmp_path / "big.html")
    seconds = time.perf_counter() - t0
    size = path.stat().st_size
    print(f"1,000 episodes ({sum(len(r.turns) for r in runs)} turns): {size / 1e6:.1f} MB in {seconds:.1f} s")
    assert size < 20e6
    assert len(_blocks(path.read_text(encoding="utf-8"))["view-index"]["rows"]) == 250


# --------------------------------------------------------------------------- the stage and the CLI


def test_compare_stage_writes_the_viewer_and_the_report_links_it(tmp_path, monkeypatch, capsys):
    from test_compare import CONDITIONS, _project

    from pipeline.stages import compare as compare_stage
    from pipeline.view.__main__ import main as view_main

    root = _project(tmp_path)  # every condition of the real conf/, with eval outputs
    monkeypatch.chdir(root)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert compare_stage.main() == 0
    assert "reports/episodes.html" in capsys.readouterr().out
    page = (root / "reports/episodes.html").read_text(encoding="utf-8")
    index = _blocks(page)["view-index"]
    assert sorted(r["key"] for r in index["runs"]) == sorted(CONDITIONS)
    assert ["C2", "C1"] in index["pairs"] and len(index["rows"]) == 6  # experiment.comparisons
    assert {r["scene_split"] for r in index["rows"]} == {"seen", "heldout"}  # from the manifest
    assert "[episodes.html](episodes.html)" in (root / "reports/report.md").read_text()
    # The CLI writes the same bytes (same inputs), or a page of some conditions elsewhere.
    assert view_main([]) == 0 and (root / "reports/episodes.html").read_text(encoding="utf-8") == page
    assert view_main(["--condition", "C1", "--condition", "C2", "--out", str(tmp_path / "two.html")]) == 0
    assert [r["key"] for r in _blocks((tmp_path / "two.html").read_text())["view-index"]["runs"]] == ["C1", "C2"]
    assert view_main(["--condition", "C9"]) == 1
    assert "no eval episodes" in capsys.readouterr().err


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def _write_runs(root: Path, runs) -> None:
    for r in runs:
        write_episodes(root / "data/eval" / r.key, r.episodes, r.turns)
        write_parquet(pa.Table.from_pylist(r.prompts), root / "data/prompts" / f"{r.key}.parquet")


def test_diff_puts_revision_a_beside_b(tmp_path, capsys):
    from pipeline.view.__main__ import main as view_main
    from pipeline.view.revisions import view_of_revisions

    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    _git(root, "config", "user.email", "test@example.com")
    _git(root, "config", "user.name", "test")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=root, check=True, capture_output=True)
    (root / "params.yaml").write_text("condition:\n  C1: {}\n  C2: {}\nsampling:\n  max_new_tokens: 64\n")
    before, _ = synthetic_runs(3, ("C1", "C2"), seed=4)
    _write_runs(root, before)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "v1")
    after, _ = synthetic_runs(3, ("C1", "C2"), seed=4)
    c2 = after[1]
    first = c2.episodes[0]["episode_id"]
    c2.turns = [t for t in c2.turns if t["episode_id"] != first or t["turn_index"] < 1]  # B's C2 stops after turn 0
    c2.episodes[0]["num_turns"] = 1
    _write_runs(root, after)
    _git(root, "commit", "-q", "-am", "v2")

    view = view_of_revisions(root, "HEAD~1", "HEAD")
    idx = view.index
    assert [r["key"] for r in idx["runs"]] == ["A:C1", "B:C1", "A:C2", "B:C2"]
    assert idx["pairs"] == [["B:C1", "A:C1"], ["B:C2", "A:C2"]] and idx["default_runs"] == ["A:C1", "B:C1"]
    assert "A = HEAD~1 (" in idx["source"] and "B = HEAD (" in idx["source"]
    row = idx["rows"][0]
    assert row["div"]["B:C1|A:C1"] is None  # C1 did not change between the revisions
    assert row["div"]["B:C2|A:C2"] == (1 if len([t for t in before[1].turns if t["episode_id"] == first]) > 1 else None)
    assert view.details[0]["runs"]["A:C2"]["tokens"]["saved_max"] is not None  # max_new_tokens read at each revision
    assert view.details[0]["prompts"]["B:C2"]["ref"] == "A:C2" and view.details[0]["prompts"]["B:C2"]["identical"]
    out = tmp_path / "diff.html"
    assert view_main(["--diff", "HEAD~1", "HEAD", "--repo", str(root), "--condition", "C2", "--out", str(out)]) == 0
    assert [r["key"] for r in _blocks(out.read_text())["view-index"]["runs"]] == ["A:C2", "B:C2"]
    assert view_main(["--diff", "HEAD~1", "no-such-rev", "--repo", str(root)]) == 1
    assert "unknown revision 'no-such-rev'" in capsys.readouterr().err


# --------------------------------------------------------------------------- a real browser


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("no Chromium: apt-get install chromium (or bash .ci/install_browser.sh)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def test_browser_clicks_into_a_task_and_filters(browser, tmp_path):
    runs, manifest = synthetic_runs(12, ("C1", "C2"), seed=3)
    c1_wins, c2_wins = [0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1], [1, 1, 1, 0, 0, 1, 0, 0, 1, 1, 0, 0]
    _outcomes(runs, {"C1": c1_wins, "C2": c2_wins})
    t0 = runs[0].turns[0]
    t0["observation"] = json.dumps({**json.loads(t0["observation"]), "description": EVIL})
    t0["reasoning"] = EVIL
    view = M.build_view(runs, pairs=[("C2", "C1")], manifest=manifest, max_new_tokens=96, title="viewer test")
    path = write_view(view, tmp_path / "episodes.html")

    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(path.as_uri())
    rows = page.locator("#index tbody tr")
    rows.first.wait_for()
    assert rows.count() == 12 and page.locator("#f-count").inner_text() == "12 of 12 tasks"

    # Filters: "C2 won, C1 lost", then a scene, then held-out scenes only.
    page.select_option("#f-outcome", "tw|C2|C1")
    won_lost = [r["i"] for r in view.index["rows"] if r["res"]["C2"]["ok"] and not r["res"]["C1"]["ok"]]
    assert rows.count() == len(won_lost) == 4
    assert [int(x) for x in rows.evaluate_all("rs => rs.map(r => r.dataset.episode)")] == won_lost
    page.select_option("#f-outcome", "")
    page.select_option("#f-scene", "scene_01")
    assert rows.count() == 3
    page.select_option("#f-scene", "")
    page.select_option("#f-split", "heldout")
    assert rows.count() == sum(r["scene_split"] == "heldout" for r in view.index["rows"]) == 3
    page.select_option("#f-split", "")
    assert rows.count() == 12

    # Into a task whose runs part ways: both conditions' actions at that turn, the turn highlighted.
    i = next(r["i"] for r in view.index["rows"] if r["div"]["C2|C1"] not in (None, 0))
    k = view.index["rows"][i]["div"]["C2|C1"]
    eid = view.index["rows"][i]["episode_id"]
    page.click(f"#index tbody tr[data-episode='{i}'] td:nth-child(4)")
    page.locator("#turns").wait_for()
    assert page.url.endswith(f"#ep={i}") and view.index["rows"][i]["objective"] in page.inner_text("#task-title")
    for run in runs:
        turn = next(t for t in run.turns if t["episode_id"] == eid and t["turn_index"] == k)
        cell = page.locator(f"#turn-{k} td[data-run='{run.key}'] .action")
        assert cell.inner_text() == turn["command"]
    assert page.locator("tr.diverge").get_attribute("data-turn") == str(k)
    assert f"turn {k}" in page.inner_text("#divergence")
    assert page.locator(".prompt[data-run='C2'] .pl.memory").count() > 0
    assert page.locator(".prompt[data-run='C2'] .pl.chg").count() > 0
    assert page.locator(".prompt[data-run='C1'] .pl.grounding").count() > 0

    # Back to the index, then the task whose observation and reasoning hold markup: shown as text.
    page.click("#back")
    rows.first.wait_for()
    page.goto(path.as_uri() + "#ep=0")
    page.locator("#turns").wait_for()
    cell = page.locator("#turn-0 td[data-run='C1']")
    assert EVIL in cell.locator(".reason").inner_text()
    assert EVIL in cell.locator("details.observation").evaluate("d => d.textContent")
    assert page.evaluate("window.__pwned") is None and page.locator("img").count() == 0
    assert not errors, errors
    page.close()
