"""A compiled step (``engine.compile``) keeps Inductor's cached CPU kernels apart by vector width: kernels generated
for one width are never loaded under another (docs/usage.md's instruction-set pins change the width), and a
second run at the same width still reuses the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

_RUN = """
import json, torch
from torch._dynamo.utils import counters
from engine.schedules.static_runner import compiled
torch.manual_seed(0)
model = compiled(torch.nn.Linear(48, 3), "default")
with torch.no_grad():
    model(torch.randn(32, 48))
print(json.dumps({"hits": counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"],
                  "misses": counters["inductor"]["fxgraph_cache_miss"],
                  "simdlen": torch._inductor.config.cpp.simdlen}))
"""


def _compile_in_a_process(cache_dir, capability: str | None) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    r = subprocess.run([sys.executable, "-c", _RUN], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_compiled_step_never_loads_kernels_cached_for_another_vector_width(tmp_path):
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    width = pick_vec_isa().bit_width()
    if width == 0:
        pytest.skip("Inductor vectorizes nothing on this CPU: one width only")
    narrower = "avx2" if width > 256 else "default"  # "default": ATen's and Inductor's scalar code
    first = _compile_in_a_process(tmp_path, narrower)
    assert first["misses"] > 0 and first["hits"] == 0 and first["simdlen"] < width
    here = _compile_in_a_process(tmp_path, None)
    assert here["simdlen"] == width
    assert here["hits"] == 0 and here["misses"] > 0, here  # the narrower width's graphs are not this one's
    again = _compile_in_a_process(tmp_path, narrower)
    assert again["hits"] > 0 and again["misses"] == 0, again
