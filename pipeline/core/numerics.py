"""CPU numerics pinned from config, so a model trained or run here gives the same bytes elsewhere.

The same weights and prompts can give different floats on two x86-64 machines, and a
different float early in training changes every byte downstream. Measured on this
project's policy model (``docs/reproducibility.md``), each of these changes the result
of a 20-step AdamW run:

- **ATen's kernels** (``ATEN_CPU_CAPABILITY``): torch picks the widest vector code the CPU
  has (AVX-512 on one machine, AVX2 on another), and the reduction order and fused
  multiply-adds differ between them. Pinned to ``numerics.cpu_capability``.
- **MKL's code branch** (``MKL_CBWR``): MKL's sgemm takes a different path per CPU family
  (an Intel Xeon with AVX-512 and an AMD EPYC give different products). MKL documents
  only ``COMPATIBLE`` (SSE2 without the approximate ``rcpps``/``rsqrtps``) as identical on
  Intel and AMD processors; ``AVX2`` is honoured on Intel CPUs only. Pinned to
  ``numerics.mkl_cbwr``.
- **The thread count**: MKL and ATen split reductions per thread, so 1, 2 and 4 threads
  give three different results. Pinned to ``numerics.threads`` whatever the core count
  (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``torch.set_num_threads``), with MKL's and
  OpenMP's dynamic thread adjustment off.
- **oneDNN** is capped at the same instruction set (``ONEDNN_MAX_CPU_ISA``) with strict
  float math; the policy model does not reach it today (no oneDNN primitive runs), a
  user's model might.

ATen and MKL read these variables once, when torch loads and MKL first runs, so
:func:`pin` must run before anything imports torch: every stage that trains or runs a
model calls it first thing in ``main`` (library modules import torch lazily). Called
after torch is loaded (a test calling a stage in-process), it can only set the thread
count and says so in a warning.

``native`` leaves a knob to the machine: the fastest setting, reproducible on that CPU
only (``conf/numerics/native.yaml``). GPUs and other architectures (arm64) are outside
the guarantee.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Mapping

from pipeline.core.conf_schema import CpuCapability

log = logging.getLogger(__name__)

NATIVE = "native"  # CpuCapability.native and MklBranch.native: the knob left to the machine
# oneDNN's instruction-set cap matching each ATEN_CPU_CAPABILITY torch 2.x understands on x86-64.
ONEDNN_ISA = {CpuCapability.default: "SSE41", CpuCapability.avx2: "AVX2", CpuCapability.avx512: "AVX512_CORE"}
# Read once by torch / MKL / OpenMP / oneDNN: setting them after torch loaded changes nothing.
READ_ONCE = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "ONEDNN_DEFAULT_FPMATH_MODE",
             "MKL_DYNAMIC", "OMP_DYNAMIC")


class NumericsError(RuntimeError):
    """The CPU cannot run the pinned numerics (the message names the key to change)."""


def _get(n: Any, key: str) -> Any:
    return n[key] if isinstance(n, Mapping) else getattr(n, key)


def environment(numerics: Any) -> dict[str, str]:
    """The environment variables that pin ``numerics`` (a ``NumericsConfig`` or mapping)."""
    threads = str(int(_get(numerics, "threads")))
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           "MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE", "ONEDNN_DEFAULT_FPMATH_MODE": "STRICT"}
    cap = str(_get(numerics, "cpu_capability"))
    if cap != NATIVE:
        env["ATEN_CPU_CAPABILITY"] = cap
        env["ONEDNN_MAX_CPU_ISA"] = ONEDNN_ISA[cap]
    cbwr = str(_get(numerics, "mkl_cbwr"))
    if cbwr != NATIVE:
        env["MKL_CBWR"] = cbwr
    return env


def pin(numerics: Any, *, load_torch: bool = True) -> dict[str, Any]:
    """Pin the process's numerics (before torch loads: see the module doc); returns what runs.

    ``load_torch=False`` (a stage that runs no model this time) only sets the environment:
    torch is not imported (about 1.5 s), and if something loads it later it loads pinned.

    Raises :class:`NumericsError` when this CPU cannot run ``numerics.cpu_capability``
    (torch would silently fall back to another kernel set, and another result).
    """
    env = environment(numerics)
    late = "torch" in sys.modules
    if not load_torch and not late:
        os.environ.update(env)
        return {"threads": int(_get(numerics, "threads")), "torch": "not loaded"}
    if late:
        unmet = sorted(k for k in READ_ONCE if k in env and os.environ.get(k) != env[k])
        if unmet:
            log.warning("numerics: torch was loaded before the pin, so %s stay as they are (outputs may "
                        "differ from a stage run); call pipeline.core.numerics.pin before torch loads",
                        ", ".join(unmet))
    else:
        os.environ.update(env)
    import torch  # deferred: heavy optional dependency (torch); loads with the pinned variables

    threads = int(_get(numerics, "threads"))
    torch.set_num_threads(threads)
    if bool(_get(numerics, "deterministic")):
        torch.use_deterministic_algorithms(True)
    running = torch.backends.cpu.get_cpu_capability()
    wanted = str(_get(numerics, "cpu_capability"))
    if wanted != NATIVE and not late and running.lower() != wanted:
        raise NumericsError(
            f"numerics.cpu_capability={wanted}: this CPU runs torch's kernels at {running} only. "
            "Set numerics.cpu_capability=default (runs on any x86-64 CPU; outputs then differ from a "
            f"lock built with {wanted}) or numerics=native (this machine only).")
    return {"cpu_capability": running, "mkl_cbwr": os.environ.get("MKL_CBWR", NATIVE), "threads": threads,
            "deterministic": bool(_get(numerics, "deterministic")), "torch": torch.__version__}


def cpu_model() -> str:
    """The CPU's model name (for metrics and benchmark tables), or the platform's."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
