"""``python -m pipeline.tools.diff``: the artifact diff between two experiments (the command's
docstring, flags and examples are in :mod:`pipeline.tools.diff.__main__`).

Modules, lowest first (each imports only those above it):

- :mod:`~pipeline.tools.diff.revisions`: read access to the project's files at one revision
  (``Rev``, ``open_rev``; a git revision, a DVC experiment or the working tree), the errors
  (``DiffError``, ``MissingData``), and a revision's ``params.yaml`` and ``paths``;
- :mod:`~pipeline.tools.diff.values`: flattened keys and how one value is compared and shown;
- :mod:`~pipeline.tools.diff.tables`: the row-level diff of two Parquet tables;
- :mod:`~pipeline.tools.diff.files`: one file at both revisions (table, JSON or text);
- :mod:`~pipeline.tools.diff.core`: the whole diff of two revisions as a JSON-ready dict
  (params, metrics, artifacts, missing data): ``diff_revisions``;
- :mod:`~pipeline.tools.diff.format`: that dict as the text the command prints;
- :mod:`~pipeline.tools.diff.__main__`: the command line.

The transcript viewer's ``--diff`` (:mod:`pipeline.view.revisions`) reads its revisions
through :mod:`~pipeline.tools.diff.revisions`.
"""
