"""The suite's schedule (tests/conftest.py): the files it starts first still exist, and collection
puts them first in their order; and its split: `make test` leaves out the `e2e` tests, which
`make test-e2e` runs, and CI runs both."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import LONGEST_FIRST

ROOT = Path(__file__).resolve().parents[1]


def test_every_file_the_schedule_names_exists_once():
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    missing = [name for name in LONGEST_FIRST if not (ROOT / name).is_file()]
    assert not missing, f"tests/conftest.py LONGEST_FIRST names files that are gone: {missing}"


def test_collection_starts_with_the_longest_files_in_their_order():
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "tests/test_stats.py", *reversed(LONGEST_FIRST[:3])],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    files = [line.split("::")[0] for line in p.stdout.splitlines() if "::" in line]
    order = list(dict.fromkeys(files))
    assert order == [*LONGEST_FIRST[:3], "tests/test_stats.py"]  # asked for in the opposite order


def _recipe(makefile: str, target: str) -> str:
    """The command lines of ``target``'s rule in ``makefile`` (its tab-indented lines)."""
    m = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.M)
    assert m, f"Makefile: no rule for {target!r}"
    return m[1]


def test_ci_runs_the_e2e_tests_that_make_test_leaves_out():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert '$(PYTEST) -m "not e2e"' in _recipe(makefile, "test")
    assert "$(PYTEST) -m e2e" in _recipe(makefile, "test-e2e")
    ci = [line.split("#")[0].strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert "make test" in ci and "make test-e2e" in ci, ".ci/run must run `make test` and `make test-e2e`"
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "e2e",
                        "tests/test_e2e.py", "tests/test_stats.py"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    files = {line.split("::")[0] for line in p.stdout.splitlines() if "::" in line}
    assert files == {"tests/test_e2e.py"}, p.stdout + p.stderr  # the marker selects, and only the marked
