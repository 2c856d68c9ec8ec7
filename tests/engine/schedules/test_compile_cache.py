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
model, x, out = torch.nn.Linear(48, 3), torch.randn(32, 48), []
for _ in range(2):  # the second compile, in a fresh Dynamo, looks the graph up in the cache the first filled
    counters.clear()
    torch._dynamo.reset()
    with torch.no_grad():
        compiled(model, "default")(x)
    out.append({"hits": counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"],
                "misses": counters["inductor"]["fxgraph_cache_miss"],
                "simdlen": torch._inductor.config.cpp.simdlen})
print(json.dumps(out))
"""


def _compile_in_a_process(cache_dir, capability: str | None) -> list[dict]:
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
    first, again = _compile_in_a_process(tmp_path, narrower)
    assert first["misses"] > 0 and first["hits"] == 0
    assert again["hits"] > 0 and again["misses"] == 0  # the cache still serves its own width
    here, _ = _compile_in_a_process(tmp_path, None)  # crashed, or loaded the narrower graph, without the key
    assert here["hits"] == 0 and here["misses"] > 0, here
    assert first["simdlen"] < here["simdlen"] == width
