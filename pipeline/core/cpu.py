"""The CPU's x86-64 level: what a golden hash is recorded per (``docs/reproducibility.md``).

Not in :mod:`pipeline.core.numerics`, which every model stage imports: the level names no
stage's behaviour, only which record of a golden file a machine is compared with.
"""

from __future__ import annotations

# The x86-64 micro-architecture levels (psABI), by the /proc/cpuinfo flags that separate them.
_LEVELS = (("x86-64-v4", ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")),
           ("x86-64-v3", ("avx2", "fma", "bmi1", "bmi2", "f16c", "movbe")),
           ("x86-64-v2", ("sse4_2", "popcnt", "ssse3")))


def cpu_level(flags: str | None = None) -> str:
    """This CPU's x86-64 level (``x86-64-v4`` has AVX-512, ``-v3`` AVX2 and FMA), or the architecture.

    The pinned numerics give the same bytes on CPUs of one level, but not across levels: an
    AVX-512 AMD EPYC and an AVX2-only one train different weights under the same pin (the
    cause is not found: ``docs/reproducibility.md``), so golden hashes are recorded per level.
    ``flags``: a ``/proc/cpuinfo`` flags line (tests); read from this machine when omitted.
    """
    import platform

    if flags is None:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            return platform.machine() or "unknown"
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                flags = next((ln.split(":", 1)[1] for ln in f if ln.startswith("flags")), "")
        except OSError:
            return "x86-64"
    have = set(flags.split())
    return next((name for name, need in _LEVELS if have.issuperset(need)), "x86-64")
