"""``fractune report``: one self-contained HTML report of a sweep (plotly) plus matplotlib PNGs, written to a
folder and logged under ``report/`` on the sweep's parent run, so they open inside the MLflow UI.

Contents: accuracy vs the training cost (the sweep's cost model, or ``--objective``) with the Pareto front and
its hypervolume; for sweeps, parallel coordinates of the swept parameters against the objectives (accuracy and
every cost model) and each parameter's importance for each objective; for ablations the sensitivity curves
(mean ± std per level), the level table and the verdicts, and importance for accuracy and BitOPs; precision over
training of chosen runs (per-epoch FW/BW bits, target CP, ``events.json``); DFQ's bit allocation per block and
epoch. A staged sweep (pretrain -> retrain): the front, parallel coordinates and importance are over its last
stage, the trials table names each run's stage and the run it started from, and a "Stages" section gives the
earlier stages' accuracy and the last stage's methods with their savings against its own FP32 and FW8/BW8 rows.
Everything is read back from MLflow (``dashboards.data``), so a report can be rebuilt at any time.
"""

from __future__ import annotations

import html
import math
import time
from pathlib import Path

from dashboards import figures, pngs
from dashboards import html as H
from dashboards.data import SweepData, bit_allocation, histories, load_sweep
from dashboards.mlflow_view import publish_sweep, view_url
from engine.config.experiment import GATED_KINDS
from engine.errors import ConfigError
from engine.metrics import TRAIN_BITOPS
from results.objectives import Direction, Objective
from results.output import emit_json, info, json_text
from results.provenance import shown_uri
from results.runs import check_objective, compared_stages, cost_of, front_quality, log_quality
from results.store import artifact_json, without_credentials
from results.summary import (
    compared_what,
    delta_column,
    delta_key,
    staged_comparison,
    summarise,
    with_configs,
)

MAX_CHOSEN = 6  # runs in the precision figure when none are named
MAX_GATED = 4  # heatmaps
REPORT_FILES = ("report.html", "report.json", "pareto.png", "sensitivity.png", "importance.png", "precision.png",
                "bit_allocation.png")  # what build_report writes into its folder
PED_ANOVA_FROM = 200  # finished trials above which importance uses PED-ANOVA (fast at many trials) over fANOVA


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


def cost_models_of(rows: list[dict]) -> list[str]:
    """The cost models every finished row logged (in the order the engine reports them)."""
    names = list(dict.fromkeys(n for r in rows for n in r.get("costs", {})))
    return [n for n in names if all(math.isfinite(r.get("costs", {}).get(n, math.nan)) for r in rows)]


def build_report(uri: str, sweep: str, sweep_id: str | None = None, out: str | Path | None = None,
                 runs: list[str] | None = None, log: bool = True, data: SweepData | None = None,
                 objective: str | None = None) -> dict:
    from results.ablation_analysis import analyse, importances_by_objective

    started = time.perf_counter()
    whole = data or load_sweep(uri, sweep, sweep_id)
    data, stage_refs = staged_comparison(whole)  # a staged sweep: the front, figures and importance are its compared stages'
    objective, task = check_objective(objective or data.objective, data.rows), data.task
    c = data.client
    done = data.finished(objective)
    front = data.front(objective)
    quality = front_quality(done, front, task, objective)
    models = cost_models_of(done) or [objective]
    analysis = analyse(done, data.meta, task) if data.meta else None
    evaluator = "ped_anova" if len(done) > PED_ANOVA_FROM else "fanova"
    importance = analysis["importance"] if analysis else importances_by_objective(
        done, data.factors, {m: (lambda r, m=m: cost_of(r, m)) for m in models}, task, evaluator)
    chosen = choose_runs(whole, front, runs)
    hist = {r["run_id"]: histories(c, r["run_id"], figures.PRECISION_KEYS) for r in chosen}
    events = {r["run_id"]: artifact_json(c, r["run_id"], "events.json") or [] for r in chosen}
    gated = [r for r in chosen if r["schedule"] in GATED_KINDS]
    gated += [r for r in data.finished() if r["schedule"] in GATED_KINDS and r not in gated]
    allocs = {r["run_id"]: a for r in gated[:MAX_GATED] if (a := bit_allocation(c, r))}
    names = {r["run_id"]: r["name"] for r in whole.rows}

    folder = Path(out or Path("fractune_reports") / data.sweep_id).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    sections, made = [], []
    if progress := whole.progress():
        sections.append(("Partial", H.note(html.escape(progress[0].upper() + progress[1:]) + ".")))
    sections.append(("Trials", _trials_table(whole)))
    if stage_refs:
        sections.append(("Stages", _stages_html(whole, data, stage_refs)))
    word = task.label[5:].capitalize()
    title = (f"{word} vs training BitOPs" if objective == "bitops" else f"{word} vs training cost ({objective})")
    sections.append((title, H.figure(figures.pareto_figure(done, front, task, objective))
                     + H.note(f"Hypervolume of the front: {H.fmt(quality['hypervolume'])} ({quality['rule']}).")
                     + H.table(_front_rows(front, task, objective))))
    made.append(pngs.pareto_png(done, front, folder / "pareto.png", task, objective))
    if len(done) >= 2 and data.factors and not analysis:
        sections.append(("Parameters and objectives", H.figure(figures.parallel_figure(done, data.factors, models, task))
                         + H.note(f"Parallel coordinates: one line per finished trial, coloured by {task.key}; "
                                  "categorical parameters as numbered levels; drag along an axis to filter.")))
    if analysis:
        sections.append(("Sensitivity", _sensitivity_html(analysis, task)))
        made.append(pngs.sensitivity_png(analysis["levels"], analysis["verdicts"], folder / "sensitivity.png", task))
    if importance.get(importance["objective"]):
        what = "BitOPs" if analysis else "the training cost under each cost model in turn"
        studied = f"{task.word} {importance['direction']}"
        sections.append(("Parameter importance", H.figure(figures.importance_figure(importance)) + H.note(
            f"Optuna get_param_importances, {importance['evaluator']} evaluator, over {importance['trials']} "
            f"finished trials of in-memory two-objective studies ({studied}, {what} minimize), one "
            "objective at a time as the target." + (f" Every trial costs the same under {', '.join(importance['constant'])}"
                                                    ": no importance there." if importance.get("constant") else ""))))
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
                f"{len(whole.rows)} trials" + (f" ({len(data.rows)} in the last stage)" if stage_refs else "")
                + f", {len(done)} finished · tracking {html.escape(shown_uri(data.uri))} · "
                f"generated {time.strftime('%Y-%m-%d %H:%M:%S')}<br>{_view_links(data)}")
    html_path = folder / "report.html"
    html_path.write_text(H.page(f"fractune report: {data.name}", sections, subtitle))
    summary = {"sweep": data.name, "sweep_id": data.sweep_id, "experiment_id": data.experiment_id,
               "parent_run_id": data.parent_run_id, "trials": len(whole.rows), "finished": len(done),
               "status": whole.status, "partial": progress is not None, "progress": progress,
               "objective": objective, "pareto": _front_rows(front, task, objective), "front_quality": quality,
               "importance": importance, "analysis": analysis,
               "chosen_runs": [r["run_id"] for r in chosen], "bit_allocation_runs": list(allocs),
               "stages": stage_refs}
    (folder / "report.json").write_text(json_text(summary, default=str, indent=1))
    artifact = None
    if log:
        log_quality(c, data.parent_run_id, quality)
        c.log_artifacts(data.parent_run_id, str(folder), artifact_path="report")
        artifact = c.get_run(data.parent_run_id).info.artifact_uri.rstrip("/") + "/report/report.html"
        publish_sweep(whole)  # the parent's note now links to the report
    return {**summary, "report": str(html_path), "pngs": [str(p) for p in made], "folder": str(folder),
            "artifact": artifact, "wall_seconds": time.perf_counter() - started}


def _view_links(data: SweepData) -> str:
    """Links to the sweep's views in the MLflow UI when the server's address is known (a tracking server). On a
    sqlite store only `fractune ui` knows it (and MLflow's artifact viewer shows this page in a sandboxed frame
    whose links cannot leave it): the page names the command, and the parent run's description links the views."""
    if not data.uri.startswith(("http://", "https://")):
        return (f"the trials and their charts in the MLflow UI: <code>fractune ui --sweep {html.escape(data.name)}"
                "</code> prints their URLs (the sweep's parent run links them too)")
    base = without_credentials(data.uri)  # never credentials in a page
    links = [(view_url(base, data.experiment_id, data.sweep_id), "the trials in the MLflow UI"),
             (view_url(base, data.experiment_id, data.sweep_id, charts=True), "their charts")]
    return " · ".join(f'<a href="{html.escape(u)}" target="_blank">{t}</a>' for u, t in links)


def _front_rows(front: list[dict], task: Objective, objective: str = "bitops") -> list[dict]:

    key = task.key  # a language model's front: perplexity
    return [{"run": r["name"], "run_id": r["run_id"], key: r[key], "train_gbitops": r[TRAIN_BITOPS] / 1e9,
             **({f"cost_{objective}": cost_of(r, objective)} if objective != "bitops" else {}),
             "cp": r["cp"], "point": figures._short(r["point"]), "seed": r["seed"]} for r in front]


def _trials_table(data: SweepData) -> str:
    key = data.task.key  # a language model's sweep: perplexity
    staged = any(r.get("stage") for r in data.rows)
    names = {r["run_id"]: r["name"] for r in data.rows}
    rows = [{"run": r["name"], **({"stage": r.get("stage") or "", "from": names.get(r.get("init_run"),
                                                                                     r.get("init_run") or "")}
                                  if staged else {}),
             "status": r["status"] + ("" if r["complete"] or r["status"] != "FINISHED" else " (stopped early)"),
             "schedule": r["schedule"] or "", key: r[key], "train_gbitops": r[TRAIN_BITOPS] / 1e9,
             "cp %": r["cp"], "seed": r["seed"], "point": figures._short(r["point"])} for r in data.rows]
    return H.table(rows)


def _stages_html(whole: SweepData, last: SweepData, refs: list[dict]) -> str:
    """A staged sweep: the earlier stages' task objective (accuracy, or a language model's perplexity) for
    reference, and the compared stages' methods (the rows every figure below compares) with their savings against
    those stages' own FP32 and FW8/BW8 rows."""
    objective = last.task
    task, scale, unit = objective.key, objective.scale, f" {objective.unit}" if objective.unit else ""
    delta = delta_key(objective, "fw8bw8"), delta_column(objective, "FW8/BW8")
    names = compared_stages(last.rows, last.stages) or ["last"]
    methods_of, own = ((f"The {names[0]} stage's methods", "this stage's own") if len(names) == 1
                       else (f"The methods of the stages {', '.join(names)}", "their own"))
    ref_rows = [{"stage": r["stage"], "runs": r["n"], f"{task}{unit}": scale * r[f"{task}_mean"],
                 "std": scale * r[f"{task}_std"]} for r in refs]
    methods = [{"method": g["method"], "seeds": g["n"], f"{task}{unit}": scale * g[f"{task}_mean"],
                "std": scale * g[f"{task}_std"], "train_gbitops": g["train_bitops_mean"] / 1e9,
                "savings vs FP32 %": 100 * g["savings_vs_fp32"], "savings vs FW8/BW8 %": 100 * g["savings_vs_fw8bw8"],
                delta[1]: g.get(delta[0])} for g in summarise(with_configs(last), objective)]
    return (H.note(f"A staged sweep: {len(whole.rows)} trials over its stages. The front, the parallel coordinates "
                   f"and the importance below are over {compared_what(last)}; each of its runs started from "
                   "the earlier stage's run of the same seed (column \"from\" in the trials table).")
            + H.table(ref_rows) + H.note(f"{methods_of} (mean over seeds); savings against {own} FP32 "
                                          "and FW8/BW8 rows (nan: the sweep has no such row).")
            + H.table(methods))


def _sensitivity_html(a: dict, objective: Objective) -> str:
    task = objective.key  # accuracy, or a language model's test perplexity
    levels = [{"factor": f, "level": lv, **{k: v for k, v in s.items()}}
              for f, by_level in a["levels"].items() for lv, s in by_level.items()]
    verdicts = [{"factor": f, f"{task} verdict": v["verdict"], f"{task} range": v["range"], "ratio": v["ratio"],
                 "BitOPs verdict": v["train_bitops_verdict"], "BitOPs ratio": v["train_bitops_ratio"]}
                for f, v in a["verdicts"].items()]
    how = ("one factor at a time around the baseline (the baseline point is in every curve)" if a["mode"] == "ofat"
           else "marginal over every combination of the other factors")
    what = f" ({objective.label}, lower is better)" if objective.direction is Direction.MIN else ""
    return (H.figure(figures.sensitivity_figure(a["levels"], a["verdicts"], objective)) + H.note(f"Levels{what}: {how}; "
            f"std over seeds (ddof 1). Pooled seed std: {task} {H.fmt(a['pooled_seed_std'][task])}, "
            f"BitOPs {H.fmt(a['pooled_seed_std'][TRAIN_BITOPS])}.") + H.table(levels) + H.table(verdicts)
            + H.note("Verdict rule: " + a["verdict_rule"] + "."))


def check_inputs(uri: str, sweep: str, sweep_id: str | None, out: str | None, log: bool,
                 no_log: str = "--no-log") -> None:
    """Every input of a report checked, all problems at once, before the store is read or a file written:
    ``fractune report`` and ``api.report`` alike (``no_log``: how the caller turns logging off)."""
    from results import store, store_checks
    from results.output import check_output_folder

    ConfigError.check_all(lambda: store.check_names(sweep, sweep_id), lambda: store_checks.check_uri(uri),
                          lambda: store_checks.check_writable(uri, f"or {no_log}") if log else None,
                          lambda: check_output_folder("--out", out, REPORT_FILES) if out else None)


def cmd_report(args) -> int:
    from results import store

    uri = store.normalise_uri(args.tracking_uri or store.default_tracking_uri())
    check_inputs(uri, args.sweep, args.sweep_id, args.out, log=not args.no_log)
    out = build_report(uri, args.sweep, args.sweep_id, args.out, args.runs, log=not args.no_log,
                       objective=args.objective)
    print(f"report of sweep {out['sweep_id']}: {out['trials']} trials ({out['finished']} finished), "
          f"{len(out['pareto'])} on the Pareto front")
    if out["progress"]:
        info(out["progress"])
    print(f"HTML: {out['report']}")
    for p in out["pngs"]:
        print(f"PNG:  {p}")
    if out["artifact"]:
        info(f"logged to the parent run {out['parent_run_id']}: {out['artifact']}")
    if args.json:
        emit_json({k: out[k] for k in ("sweep", "sweep_id", "experiment_id", "parent_run_id", "trials", "finished",
                                       "status", "partial", "report", "pngs", "artifact", "importance", "pareto")}
                  | {"levels": (out["analysis"] or {}).get("levels"),
                     "verdicts": (out["analysis"] or {}).get("verdicts")})
    return 0
