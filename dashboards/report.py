"""``fractune report``: one self-contained HTML report of a sweep (plotly) plus matplotlib PNGs, written to a
folder and logged under ``report/`` on the sweep's parent run, so they open inside the MLflow UI.

Contents: accuracy vs training BitOPs with the Pareto front; for ablations the sensitivity curves (mean ± std
per level), the level table and the verdicts; parameter importance for accuracy and for BitOPs; precision over
training of chosen runs (per-epoch FW/BW bits, target CP, ``events.json``); DFQ's bit allocation per block and
epoch. Everything is read back from MLflow (``dashboards.data``), so a report can be rebuilt at any time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from dashboards import figures, pngs
from dashboards import html as H
from dashboards.data import SweepData, bit_allocation, histories, load_sweep
from engine.config import GATED_KINDS
from engine.errors import ConfigError
from orchestrator.output import emit_json, info
from orchestrator.store import artifact_json

MAX_CHOSEN = 6  # runs in the precision figure when none are named
MAX_GATED = 4  # heatmaps


def choose_runs(data: SweepData, front: list[dict], wanted: list[str] | None) -> list[dict]:
    """Named runs (run id, trial id or run name), else the Pareto front, else the first finished runs."""
    if wanted:
        by_key = {k: r for r in data.rows for k in (r["run_id"], r["trial_id"], r["name"]) if k}
        unknown = [w for w in wanted if w not in by_key]
        if unknown:
            names = ", ".join(sorted(r["name"] for r in data.rows))[:300]
            raise ConfigError([("--run", w, f"allowed: a run id, trial id or run name of sweep "
                                f"{data.sweep_id}: {names}") for w in unknown])
        return [by_key[w] for w in dict.fromkeys(wanted)]
    return (front or data.finished() or data.rows)[:MAX_CHOSEN]


def build_report(uri: str, sweep: str, sweep_id: str | None = None, out: str | Path | None = None,
                 runs: list[str] | None = None, log: bool = True, data: SweepData | None = None) -> dict:
    from orchestrator.ablation_analysis import analyse, importances
    from orchestrator.runs import front as pareto_front

    started = time.perf_counter()
    data = data or load_sweep(uri, sweep, sweep_id)
    c = data.client
    done = data.finished()
    front = pareto_front(data.rows)
    analysis = analyse(done, data.meta) if data.meta else None
    importance = analysis["importance"] if analysis else importances(done, data.factors, "fanova")
    chosen = choose_runs(data, front, runs)
    hist = {r["run_id"]: histories(c, r["run_id"], figures.PRECISION_KEYS) for r in chosen}
    events = {r["run_id"]: artifact_json(c, r["run_id"], "events.json") or [] for r in chosen}
    gated = [r for r in chosen if r["schedule"] in GATED_KINDS]
    gated += [r for r in data.finished() if r["schedule"] in GATED_KINDS and r not in gated]
    allocs = {r["run_id"]: a for r in gated[:MAX_GATED] if (a := bit_allocation(c, r))}
    names = {r["run_id"]: r["name"] for r in data.rows}

    folder = Path(out or Path("fractune_reports") / data.sweep_id).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    sections, made = [], []
    sections.append(("Trials", _trials_table(data)))
    sections.append(("Accuracy vs training BitOPs", H.figure(figures.pareto_figure(done, front))
                     + H.table(_front_rows(front))))
    made.append(pngs.pareto_png(done, front, folder / "pareto.png"))
    if analysis:
        sections.append(("Sensitivity", _sensitivity_html(analysis)))
        made.append(pngs.sensitivity_png(analysis["levels"], analysis["verdicts"], folder / "sensitivity.png"))
    if importance.get("accuracy"):
        sections.append(("Parameter importance", H.figure(figures.importance_figure(importance)) + H.note(
            f"Optuna get_param_importances, {importance['evaluator']} evaluator, over {importance['trials']} "
            "finished trials of an in-memory two-objective study (accuracy maximize, BitOPs minimize), one "
            "objective at a time as the target.")))
        made.append(pngs.importance_png(importance, folder / "importance.png"))
    else:
        sections.append(("Parameter importance", H.note(importance.get("note", "no swept parameter varies"))))
    if chosen:
        sections.append(("Precision over training", H.figure(figures.precision_figure(chosen, hist, events))
                         + H.note("Per-epoch means of the forward/backward bits; triangles: precision events "
                                  "(turning points, stage switches) in that epoch; hover for details.")))
        made.append(pngs.precision_png(chosen, hist, folder / "precision.png"))
    if allocs:
        sections.append(("DFQ bit allocation", H.figure(figures.allocation_figure(allocs, names))))
        made.append(pngs.allocation_png(allocs, names, folder / "bit_allocation.png"))
    subtitle = (f"sweep {data.sweep_id} · experiment {data.experiment_id} · parent run {data.parent_run_id} · "
                f"{len(data.rows)} trials, {len(done)} finished · tracking {data.uri} · "
                f"generated {time.strftime('%Y-%m-%d %H:%M:%S')}")
    html_path = folder / "report.html"
    html_path.write_text(H.page(f"fractune report: {data.name}", sections, subtitle))
    summary = {"sweep": data.name, "sweep_id": data.sweep_id, "experiment_id": data.experiment_id,
               "parent_run_id": data.parent_run_id, "trials": len(data.rows), "finished": len(done),
               "pareto": _front_rows(front), "importance": importance, "analysis": analysis,
               "chosen_runs": [r["run_id"] for r in chosen], "bit_allocation_runs": list(allocs)}
    (folder / "report.json").write_text(json.dumps(summary, default=str, indent=1))
    artifact = None
    if log:
        c.log_artifacts(data.parent_run_id, str(folder), artifact_path="report")
        artifact = c.get_run(data.parent_run_id).info.artifact_uri.rstrip("/") + "/report/report.html"
    return {**summary, "report": str(html_path), "pngs": [str(p) for p in made], "folder": str(folder),
            "artifact": artifact, "wall_seconds": time.perf_counter() - started}


def _front_rows(front: list[dict]) -> list[dict]:
    return [{"run": r["name"], "run_id": r["run_id"], "accuracy": r["accuracy"], "train_gbitops": r["train_bitops"] / 1e9,
             "cp": r["cp"], "point": figures._short(r["point"]), "seed": r["seed"]} for r in front]


def _trials_table(data: SweepData) -> str:
    rows = [{"run": r["name"], "status": r["status"] + ("" if r["complete"] or r["status"] != "FINISHED" else
                                                       " (stopped early)"),
             "schedule": r["schedule"] or "", "accuracy": r["accuracy"], "train_gbitops": r["train_bitops"] / 1e9,
             "cp %": r["cp"], "seed": r["seed"], "point": figures._short(r["point"])} for r in data.rows]
    return H.table(rows)


def _sensitivity_html(a: dict) -> str:
    levels = [{"factor": f, "level": lv, **{k: v for k, v in s.items()}}
              for f, by_level in a["levels"].items() for lv, s in by_level.items()]
    verdicts = [{"factor": f, "accuracy verdict": v["verdict"], "accuracy range": v["range"], "ratio": v["ratio"],
                 "BitOPs verdict": v["train_bitops_verdict"], "BitOPs ratio": v["train_bitops_ratio"]}
                for f, v in a["verdicts"].items()]
    how = ("one factor at a time around the baseline (the baseline point is in every curve)" if a["mode"] == "ofat"
           else "marginal over every combination of the other factors")
    return (H.figure(figures.sensitivity_figure(a["levels"], a["verdicts"])) + H.note(f"Levels: {how}; "
            f"std over seeds (ddof 1). Pooled seed std: accuracy {H.fmt(a['pooled_seed_std']['accuracy'])}, "
            f"BitOPs {H.fmt(a['pooled_seed_std']['train_bitops'])}.") + H.table(levels) + H.table(verdicts)
            + H.note("Verdict rule: " + a["verdict_rule"] + "."))


def cmd_report(args) -> int:
    from orchestrator import store
    from orchestrator.output import check_output_folder

    uri = store.normalise_uri(args.tracking_uri or store.default_tracking_uri())
    problems = []
    for check in (lambda: store.check_names(args.sweep, args.sweep_id), lambda: store.check_uri(uri),
                  lambda: check_output_folder("--out", args.out) if args.out else None):
        try:
            check()
        except ConfigError as err:
            problems += err.problems
    if problems:
        raise ConfigError(problems)
    out = build_report(uri, args.sweep, args.sweep_id, args.out, args.runs, log=not args.no_log)
    print(f"report of sweep {out['sweep_id']}: {out['trials']} trials ({out['finished']} finished), "
          f"{len(out['pareto'])} on the Pareto front")
    print(f"HTML: {out['report']}")
    for p in out["pngs"]:
        print(f"PNG:  {p}")
    if out["artifact"]:
        info(f"logged to the parent run {out['parent_run_id']}: {out['artifact']}")
    if args.json:
        emit_json({k: out[k] for k in ("sweep", "sweep_id", "experiment_id", "parent_run_id", "trials", "finished",
                                       "report", "pngs", "artifact", "importance", "pareto")}
                  | {"levels": (out["analysis"] or {}).get("levels"),
                     "verdicts": (out["analysis"] or {}).get("verdicts")})
    return 0
