"""``fractune ablate``: an ablation spec run as a grid sweep, then per-level statistics, importance, verdicts
and the HTML report, all computed from the finished trials in MLflow (``orchestrator.api.ablate``); printed here."""

from __future__ import annotations

from engine.metrics import TRAIN_BITOPS
from results import objectives
from results.objectives import Direction
from results.output import emit_json, fmt, info, table


def cmd_ablate(args) -> int:
    from orchestrator._result_types import REPORT_KEYS
    from orchestrator.api import ablate
    from orchestrator.cli.commands_sweep import print_report

    res = ablate(args.spec, tracking_uri=args.tracking_uri, storage=args.storage, address=args.address,
                 resume=args.resume, out=args.out, dashboard=args.dashboard, progress=not args.quiet,
                 verbose=args.verbose)
    out, a = res.raw, res.analysis
    print(f"\nablation {out['sweep_id']} ({res.mode}): {res.points} points x {len(res.seeds)} seeds, "
          f"{out['trials']} trials, {out['errored']} errored, {a['trials']} finished with results")
    print_analysis(a)
    for e in out["errors"]:
        info(f"trial {e.get('label') or e['trial_id']} errored: {e['error']}")
    print_report(out)
    print(f"\nMLflow: experiment {out['sweep']!r} (id {out['experiment_id']}), parent run {out['parent_run_id']}")
    print(f"open the UI: {out['ui']}")
    if args.json:
        imp = a["importance"]
        emit_json({k: out[k] for k in ("sweep", "sweep_id", "experiment_id", "parent_run_id", "trials", "errored",
                                       "errors", "pareto", "tracking_uri", "storage", "wall_seconds")}
                  | {"mode": res.mode, "factors": res.factors, "baseline": res.baseline,
                     "objective": a["objective"], "direction": a["direction"],
                     "importance": imp[a["objective"]], "importance_train_bitops": imp[TRAIN_BITOPS],
                     "importance_evaluator": imp["evaluator"], "levels": a["levels"], "verdicts": a["verdicts"],
                     "verdict_rule": a["verdict_rule"], "pooled_seed_std": a["pooled_seed_std"]}
                  | {k: out[k] for k in REPORT_KEYS if k in out})
    return 1 if out["errored"] else 0


def print_analysis(a: dict) -> None:
    objective = objectives.of_key(a["objective"]) if "objective" in a else objectives.DEFAULT
    task = objective.key  # accuracy, or a language model's test perplexity (lower is better)
    rows = [{"factor": f, "level": lv, "n": s["n"], f"{task}_mean": s[f"{task}_mean"], f"{task}_std": s[f"{task}_std"],
             "gbitops_mean": s["train_bitops_mean"] / 1e9, "gbitops_std": _nan(s["train_bitops_std"]) / 1e9}
            for f, levels in a["levels"].items() for lv, s in levels.items()]
    lower = objective.direction is Direction.MIN
    print("\nper level (mean and std over seeds" + (f"; {objective.label}, lower is better):" if lower else "):"))
    table(rows)
    imp = a["importance"]
    print(f"\nparameter importance (Optuna, {imp['evaluator']} evaluator; {_what(objective)} and BitOPs separately):")
    if imp[task]:
        table([{"factor": f, f"for_{task}": imp[task].get(f), "for_bitops": imp[TRAIN_BITOPS].get(f)}
               for f in imp[task]])
    else:
        print(f"(none: {imp.get('note', '')})")
    print("\nsensitivity verdicts:")
    table([{"factor": f, task: v["verdict"], "range": v["range"], "ratio": fmt(v["ratio"], 3),
            "bitops": v["train_bitops_verdict"], "bitops_ratio": fmt(v["train_bitops_ratio"], 3)}
           for f, v in a["verdicts"].items()])
    print(f"rule: {a['verdict_rule']}")


def _what(objective: objectives.Objective) -> str:
    return objective.word + (f" ({objective.direction.optuna})" if objective.direction is Direction.MIN else "")


def _nan(v) -> float:
    return float("nan") if v is None else float(v)
