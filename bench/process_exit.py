"""Ending a process: the CPU seconds of `fractune train` on a tiny run through the command's process entry
(``orchestrator.cli.main.run``, which freezes the objects still tracked before the interpreter's last garbage
collections) against the same command through ``main`` alone, and of an interpreter that imports torch, Ray Tune
and MLflow and ends, with and without ``gc.freeze()`` (what a trial's process does, trainables/tune_trainable.py).
Rounds alternate the variants, so the machine's drift hits all alike; each figure is the median of its rounds'
CPU seconds (user + system, the child's own rusage). Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import emit, machine  # noqa: E402

CONFIG = "model: {name: tiny}\ndata: {dataset: digits, batch_size: 64}\noptim: {epochs: 1}\n"
IMPORTS = "import torch, ray.tune, mlflow, engine.train"


def child_cpu(argv: list[str]) -> float:
    """CPU seconds (user + system) of one child process run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "tiny.yaml"
        cfg.write_text(CONFIG)
        train = ["train", str(cfg), "--json"]
        variants = {
            "cli_run": [sys.executable, "-m", "orchestrator.cli", *train],
            "cli_main_only": [sys.executable, "-c", "import sys; from orchestrator.cli.main import main; "
                              "sys.exit(main())", *train],
            "imports_frozen": [sys.executable, "-c", f"{IMPORTS}, gc; gc.freeze()"],
            "imports_plain": [sys.executable, "-c", IMPORTS],
        }
        child_cpu(variants["imports_plain"])  # bytecode and page cache warm before the first measured round
        samples: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            for name, argv in variants.items():
                samples[name].append(child_cpu(argv))
    cpu = {k: round(statistics.median(v), 3) for k, v in samples.items()}
    out = {"bench": "process_exit", "rounds": args.rounds, "cpu_s": cpu,
           "cli_saved_s": round(cpu["cli_main_only"] - cpu["cli_run"], 3),
           "imports_saved_s": round(cpu["imports_plain"] - cpu["imports_frozen"], 3), **machine()}
    print(f"fractune train, tiny run: {cpu['cli_run']} CPU-s through run(), {cpu['cli_main_only']} through main() "
          f"alone; torch + Ray Tune + MLflow imported: {cpu['imports_frozen']} frozen, {cpu['imports_plain']} not")
    emit(out)


if __name__ == "__main__":
    main()
