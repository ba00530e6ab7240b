"""The simulator's numba kernels load from numba's on-disk cache without numba refreshing its whole CPU target
(simulator/compiled.py, KernelCache: ≈ 0.45 s of CPU per process). That loader leans on numba internals read in
one release line, so it must step aside wherever those may differ, and a kernel it loads must run as one
numba loads: both checked here, the second in fresh processes against a real cache."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

numba = pytest.importorskip("numba")

from simulator import compiled  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

KERNEL = textwrap.dedent('''
    import sys
    import numpy as np
    from simulator import compiled

    def fill(n):
        out = np.empty(n)  # allocates through numba's runtime (NRT): needs it set up before the call
        s = 0.0
        for i in range(n):
            s += (i % 7) * 0.5
            out[i] = s
        return out

    k = compiled._jit(fill)
    print(type(k._cache).__name__, repr(float(k(1000).sum())))
    print("loaded" if k.stats.cache_hits else "compiled", file=sys.stderr)
''')


def test_another_numba_release_line_loads_the_usual_way(monkeypatch):
    """A release whose runtime set-up left rtsys.initialize would crash the process on a loaded kernel: only the
    line the loader was read against (compiled.TESTED_NUMBA) gets it."""
    assert compiled._kernel_cache_class() is not None or compiled.numba.__version__[:4] != "0.68"
    monkeypatch.setattr(compiled.numba, "__version__", "0.69.0")
    assert compiled._kernel_cache_class() is None
    monkeypatch.setattr(compiled.numba, "__version__", "0.59.1")
    assert compiled._kernel_cache_class() is None


def test_a_moved_private_signature_falls_back_to_numbas_own_loading(monkeypatch, tmp_path):
    cls = compiled._kernel_cache_class()
    if cls is None:
        pytest.skip(f"numba {numba.__version__} loads kernels the usual way here")
    from numba.core.caching import FunctionCache
    from numba.core.runtime import rtsys

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    cache = cls(test_a_moved_private_signature_falls_back_to_numbas_own_loading)

    def moved(*args, **kwargs):
        raise TypeError("initialize() takes 1 positional argument but 2 were given")

    monkeypatch.setattr(rtsys, "initialize", moved)
    monkeypatch.setattr(FunctionCache, "load_overload", lambda self, sig, ctx: ("numba's own", sig))
    assert cache.load_overload("sig", object()) == ("numba's own", "sig")


def test_a_kernel_loaded_from_the_cache_in_a_fresh_process_gives_what_it_gave_when_compiled(tmp_path):
    (tmp_path / "kernel_probe.py").write_text(KERNEL)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    env.pop(compiled.DISABLE_ENV, None)
    runs = [subprocess.run([sys.executable, "-c", "import kernel_probe"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    assert [r.stderr.split()[-1] for r in runs] == ["compiled", "loaded"]
    assert runs[0].stdout == runs[1].stdout
    if compiled._kernel_cache_class() is not None:  # the release line the project's loader serves
        assert runs[1].stdout.startswith("KernelCache ")
    assert runs[1].stdout.split()[1] == repr(float(sum(sum((j % 7) * 0.5 for j in range(i + 1)) for i in range(1000))))
