"""The transcript viewer: eval episodes of several conditions (or two experiments) side by side.

    python -m pipeline.view                    # reports/episodes.html from the working tree
    python -m pipeline.view --diff exp-a exp-b # the same tasks at two revisions / experiments

Modules (this file imports none of them, so a stage that needs one pays for that one only):

- :mod:`pipeline.view.model`: artifact rows -> the JSON-ready view (index rows, per-episode
  turn tables, divergence, marked prompts, token figures); no I/O.
- :mod:`pipeline.view.html`: the view -> one self-contained HTML page (data embedded as JSON,
  rendered on demand by an inline script; no network).
- :mod:`pipeline.view.load`: reading runs from a folder (the working tree) and
  :func:`~pipeline.view.load.write_episodes_html`, what the ``compare`` stage calls.
- :mod:`pipeline.view.revisions`: runs read at two revisions through
  :mod:`pipeline.tools.diff` (``--diff``).
- :mod:`pipeline.view.synthetic`: synthetic runs (tests, the size benchmark, the screenshot).
- :mod:`pipeline.view.stream`: the streams' page (``reports/stream.html``): every step of the
  streaming protocol, what each condition's memory held when its prompt was rendered.

See ``docs/viewer.md``.
"""
