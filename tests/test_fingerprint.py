"""``python -m pipeline.policy.fingerprint``: a numerics fingerprint, op by op, to find where two
CPUs part ways (``docs/reproducibility.md``). Every probe must be deterministic on one machine,
or a difference between two machines would mean nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_data_parallel import AMBIENT, OLD_TRAIN_SHA256, ROOT, _has_avx2


def _cli(*args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in AMBIENT}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra or {})
    return subprocess.run([sys.executable, "-m", "pipeline.policy.fingerprint", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, Path]:
    if not _has_avx2():
        pytest.skip("the pinned numerics (numerics.cpu_capability=avx2) need an AVX2 CPU")
    d = tmp_path_factory.mktemp("fingerprint")
    # the second run stands in for another machine's ambient settings, which the pin overrides
    for name, extra in (("a.json", {}), ("b.json", {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "2"})):
        p = _cli("--out", str(d / name), extra=extra)
        assert p.returncode == 0, p.stdout + p.stderr
    return d / "a.json", d / "b.json"


def test_a_fingerprint_is_the_same_on_a_rerun_and_covers_the_stack(two_runs):
    a, b = (json.loads(p.read_text()) for p in two_runs)
    assert a["probes"] == b["probes"]
    names = list(a["probes"])
    for prefix in ("libm.", "numpy.", "op.mm.", "op.sdpa.backward", "tokenizer", "model.init", "model.forward.",
                   "model.grad.", "model.train.step01", "model.train.final"):
        assert any(n.startswith(prefix) for n in names), prefix
    # bottom of the stack first: where two machines part ways is the first differing probe
    assert names.index("libm.exp") < names.index("op.mm.24x32x32") < names.index("model.init")
    assert a["numerics"]["cpu_capability"] == "AVX2" and a["numerics"]["mkl_cbwr"] == "COMPATIBLE"


def test_the_model_probes_train_what_the_data_parallel_test_pins(two_runs):
    a = json.loads(two_runs[0].read_text())
    # one of the machines' recorded hashes (not one per x86-64 level: test_data_parallel.py)
    assert a["probes"]["model.train.final"] in OLD_TRAIN_SHA256, (a["cpu_level"], a["probes"]["model.train.final"])


def test_compare_lists_the_differing_probes_in_order(two_runs, tmp_path):
    a = two_runs[0]
    p = _cli("--compare", str(a), str(two_runs[1]))
    assert p.returncode == 0 and "probes agree" in p.stdout, p.stdout + p.stderr
    doc = json.loads(a.read_text())
    doc["probes"]["model.loss"] = "0" * 16
    doc["probes"]["op.softmax"] = "1" * 16
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    p = _cli("--compare", str(a), str(other))
    assert p.returncode == 1, p.stdout + p.stderr
    listed = [ln.split(":")[0].strip() for ln in p.stdout.splitlines() if ln.startswith("  ")]
    assert listed == ["op.softmax", "model.loss"]
    assert "2 of" in p.stdout and "the first is where the machines part ways" in p.stdout

    doc["version"] = 0
    other.write_text(json.dumps(doc))
    p = _cli("--compare", str(a), str(other))
    assert p.returncode == 2 and "fingerprint versions differ" in p.stderr
    p = _cli("--compare", str(a), str(tmp_path / "missing.json"))
    assert p.returncode == 2 and "missing.json" in p.stderr
