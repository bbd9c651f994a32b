"""The suite's schedule (tests/conftest.py): the files it starts first still exist, and collection
puts them first in their order."""

from __future__ import annotations

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
