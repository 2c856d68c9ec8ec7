"""Commands of the sweep service: ``sweep``, ``sweeps``, ``pareto``, ``validate`` (``ablate``: commands_ablate):
each calls its function of ``orchestrator.api`` and prints the outcome."""

from __future__ import annotations

from engine.metrics import TRAIN_BITOPS, TRAIN_TBITOPS
from orchestrator.sweep.lifecycle import SweepInterrupted
from results.output import emit_json, info, table


def cmd_validate(args) -> int:
    from orchestrator.api import validate

    v = validate(args.file, tracking_uri=args.tracking_uri)
    out = {"file": args.file, "kind": v.kind, "name": v.name, **({"trials": v.trials} if v.kind != "experiment"
                                                                   else {}), "valid": True}
    if v.stages:  # a staged sweep: its stages in order, their trials and references
        out["stages"] = v.stages
    print(f"{args.file}: valid {out['kind']} {out['name']!r}" + (f", {out['trials']} trials" if "trials" in out else "")
          + ("; stages " + " -> ".join(f"{s['name']} ({s['trials']})" for s in out["stages"]) if "stages" in out else ""))
    if args.json:
        emit_json(out)
    return 0


def pareto_table(front: list[dict], task: str) -> None:
    """The front for a person: each member's method label and run name (which holds its swept values and seed),
    its task objective (``task``: "accuracy max", "perplexity min"), training TBitOPs, its cost under another
    cost model where the front is under one, and cp."""
    key = task.split()[0]
    rows = [{"method": r.get("method") or "", "run": r.get("name") or (r.get("run_id") or "")[:12], key: r[key],
             TRAIN_TBITOPS: r[TRAIN_BITOPS] / 1e12,
             **({f"cost_{r['objective']}": r["cost"]} if r.get("objective", "bitops") != "bitops" else {}),
             "cp": r.get("cp")} for r in front]
    table(rows)


def cmd_sweep(args) -> int:
    from orchestrator.api import sweep

    try:
        res = sweep(args.spec, tracking_uri=args.tracking_uri, storage=args.storage, address=args.address,
                    resume=args.resume, objective=args.objective, report=not args.no_report,
                    report_dir=args.report_dir, dashboard=args.dashboard, progress=not args.quiet,
                    verbose=args.verbose)
    except SweepInterrupted as stop:
        from orchestrator.sweep.lifecycle import resume_command
        from orchestrator.sweep.storage import storage_root
        from results import store

        command = resume_command(args.spec, str(storage_root(args.storage, create=False)),
                                 store.redact(stop.tracking_uri))
        info(f"fractune sweep: {stop}; its runs are marked KILLED; resume with: {command}")
        if args.json:
            emit_json({"sweep": stop.sweep, "sweep_id": stop.sweep_id, "interrupted": stop.signal_name,
                       "finished": stop.finished, "trials": stop.total, "resume": command})
        return stop.exit_code
    out = res.raw
    print(f"\nsweep {out['sweep_id']}: {out['trials']} trials, {out['errored']} errored, "
          f"{len(out['pareto'])} on the Pareto front{of_stages(out.get('compared_stages'))} ({res.task}, training "
          f"cost min under {out['objective']})")
    pareto_table(out["pareto"], res.task)
    if out.get("stopped"):
        info(stopped_line(out["stopped"]))
    for e in out["errors"]:
        info(f"trial {e.get('label') or e['trial_id']} errored: {e['error']}")
    if out.get("log") and (out["errors"] or out["tracking"].get("failed_calls")):
        info(f"Ray Tune's and MLflow's full log lines: {out['log']} (--verbose puts them on stderr)")
    storage_msgs = [t for t in (out["tracking"].get("storage_error"), out["tracking"].get("report_error")) if t]
    if out.get("storage_problem"):  # full or read-only now: one line, the sweep resumes once it is fixed
        info(f"fractune sweep: error: {out['storage_problem']}")
    elif storage_msgs or any(m in e["error"] for e in out["errors"] for m in ("No space left", "Read-only")):
        cause = "; ".join(storage_msgs) or next(m for e in out["errors"] for m in (
            "No space left on device", "Read-only file system") if m in e["error"])
        info(f"fractune sweep: error: --storage {out['storage']}: the storage ran out of space or became "
             f"unwritable ({cause}); free space or write access and rerun with --resume")
    if not args.no_report:
        print_report(out)
    print(f"\nMLflow: experiment {out['sweep']!r} (id {out['experiment_id']}), parent run {out['parent_run_id']}")
    print(f"open the UI: {out['ui']}")
    t = out["tracking"]
    if t.get("failed_calls"):
        gap = t.get("gap") or {}
        info(f"tracking store unreachable for part of the sweep ({t['failed_calls']} failed calls, "
             f"{gap.get('error', '')}); {t.get('backfilled', 0)} operations backfilled, {t.get('pending', 0)} pending")
    if t.get("pending"):
        info(f"warning: {t['pending']} tracking operations could not be written; the backlog and the Pareto "
             f"summary are in {out['storage']}; run `fractune sweep {args.spec} --resume` to retry")
    if args.json:
        emit_json(out)
    return 1 if out["errored"] or t.get("pending") or out.get("storage_problem") else 0


def print_report(out: dict) -> None:
    """The report's line (``orchestrator._reports.write_report``): its file, or why it failed and how to retry."""
    if out.get("report"):
        print(f"report: {out['report']}" + (f" (MLflow artifact {out['report_artifact']})"
                                            if out.get("report_artifact") else ""))
    elif out.get("report_error") and out["parent_run_id"] is not None:
        info(f"report failed ({out['report_error']}); retry with: fractune report {out['sweep']} "
             f"--sweep-id {out['sweep_id']} --tracking-uri {out['tracking_uri']}")


def stopped_line(stopped: list[dict]) -> str:
    """The trials stopped before their planned epochs, in one line: how many, which, where; off the front."""
    return (f"{len(stopped)} trial(s) stopped early by the scheduler or the time limit, left off the front: "
            + ", ".join(f"{r['name']} ({r['at']})" for r in stopped))


def of_stages(stages: list[str] | None) -> str:
    """" of stage retrain" where a staged sweep's front leaves out the stages its trials started from."""
    return f" of stage{'s' if len(stages) > 1 else ''} {', '.join(stages)}" if stages else ""


def cmd_sweeps(args) -> int:
    from orchestrator.api import sweeps
    from results.listing import MAX_SWEEPS

    listed = sweeps(args.sweep, tracking_uri=args.tracking_uri)
    rows = [{"sweep id": s["sweep_id"], "kind": s["kind"], "status": s["status"],
             "trials": f"{s['trials'] if s['trials'] is not None else '-'}/{s['planned'] or '-'}",
             "errored": s["errored"] if s["errored"] is not None else "-",
             "front": s["front_size"] if s["front_size"] is not None else "-",
             "best": ", ".join(f"{k} {v:.4f}" for k, v in s["best"].items()) or "-",
             "started (UTC)": (s["started"] or "-").replace("T", " ").rstrip("Z")} for s in listed.sweeps]
    print(f"{len(rows)} sweep(s) in {listed.tracking_uri}" + (f" named {args.sweep}" if args.sweep else ""))
    if len(rows) >= MAX_SWEEPS:
        info(f"the newest {MAX_SWEEPS} shown; there may be more (name one sweep to list only its runs)")
    if rows:
        table(rows)
    if args.json:
        emit_json(listed.model_dump())
    return 0


def cmd_pareto(args) -> int:
    from orchestrator.api import pareto_front

    f = pareto_front(args.sweep, sweep_id=args.sweep_id, tracking_uri=args.tracking_uri, objective=args.objective)
    print(f"sweep {f.sweep_id}: {f.trials} trials, {f.finished} finished their planned epochs, "
          f"{len(f.pareto)} on the Pareto front{of_stages(f.compared_stages)} ({f.task}, training cost min under "
          f"{f.objective})")
    if f.progress:  # a sweep still running (or interrupted): the front of the trials done so far
        info(f.progress)
    for r in f.diverged_trials:
        info(f"trial {r['name']} diverged (its training loss passed the engine's bound at {r['epoch']})")
    if f.stopped_trials:
        info(stopped_line(f.stopped_trials))
    pareto_table(f.pareto, f.task)
    if args.json:
        emit_json({"sweep": args.sweep, "sweep_id": f.sweep_id, "experiment_id": f.experiment_id,
                   "parent_run_id": f.parent_run_id, "trials": f.trials, "finished": f.finished,
                   "status": f.status, "planned": f.planned, "partial": f.partial, "diverged": f.diverged,
                   "stopped": f.stopped, "compared_stages": f.compared_stages, "objective": f.objective,
                   "pareto": f.pareto})
    return 0
