"""The study's methods under every cost model, without training (docs/costs.md is made from this output).

Part 1: every schedule of ``search_spaces/study_fmnist.yaml`` that can be previewed (FP32, static, PFQ, CPT;
auto PFQ with uniform stages) priced by ``engine.preview.price_schedule`` on the study's own network, layer map
and batch size: savings against FW8/BW8 under each model, and the methods' ranking per model. Part 2: DFQ's
options (the paper's set, 4-bit weights) priced per MAC under each per-MAC model against FW8/BW8, the
quantities a gate trades off. Prints markdown; the last stdout line is one JSON object with the figures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config.experiment import parse_config  # noqa: E402
from engine.config.gated_schedule import OPTION_PRESETS, parse_option  # noqa: E402
from engine.cost.cost_models import build_models  # noqa: E402
from engine.numerics.precision import Precision  # noqa: E402
from engine.preview import precision_series, price_schedule  # noqa: E402
from search_spaces.spec import load_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def label(s: dict) -> str:
    if s["kind"] == "fp32":
        return "FP32"
    if s["kind"] == "static":
        return f"FW{s['fw']}/BW{s['bw']}"
    if s["kind"] == "pfq":
        return f"PFQ {s['mode']} FW{'-'.join(map(str, s['fw']))}/BW{'-'.join(map(str, s['bw']))}"
    return f"CPT FW{s['fw_min']}->{s['fw_max']}/BW{s['bw_min']}"


def main() -> None:
    loaded = load_spec(ROOT / "search_spaces" / "study_fmnist.yaml")
    out: dict = {"methods": {}, "dfq_options": {}}
    for point in loaded.spec.parameters["schedule"].grid:
        if point["kind"] in ("dfq", "fractrain"):
            continue
        tree = json.loads(json.dumps(loaded.base_tree))
        tree["schedule"] = point
        cfg = parse_config(tree)
        series, _ = precision_series(cfg)
        costs = price_schedule(cfg, series)
        out["methods"][label(point)] = {m: c["savings_vs_fw8bw8"] for m, c in costs.items()}
    models = list(next(iter(out["methods"].values())))
    print(f"Savings against FW8/BW8 on {loaded.base_tree['model']['name']} ({loaded.base_tree['data']['dataset']}, batch "
          f"{loaded.base_tree['data']['batch_size']}), every schedule priced without training:\n")
    print("| method | " + " | ".join(models) + " |")
    print("| --- |" + " --- |" * len(models))
    for name, sav in out["methods"].items():
        print(f"| {name} | " + " | ".join(f"{100 * sav[m]:+.1f}%" for m in models) + " |")
    print("\nCheapest first:\n")
    out["rankings"] = {}
    for m in models:
        order = sorted(out["methods"], key=lambda n: -out["methods"][n][m])
        out["rankings"][m] = order
        print(f"- {m}: " + ", ".join(order))
    per_mac = [m for m in build_models() if m.per_mac is not None]
    fw8 = Precision.fwbw(8, 8)
    print("\nDFQ's paper options (4-bit weights), cost per MAC over the three passes against FW8/BW8:\n")
    print("| option | " + " | ".join(m.name for m in per_mac) + " |")
    print("| --- |" + " --- |" * len(per_mac))
    for name in OPTION_PRESETS["paper"]:
        prec = parse_option(name, 4)
        row = {m.name: sum(m.pass_costs(prec)) / sum(m.pass_costs(fw8)) for m in per_mac}
        out["dfq_options"][name] = row
        print(f"| {name} | " + " | ".join(f"{row[m.name]:.3f}" for m in per_mac) + " |")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
