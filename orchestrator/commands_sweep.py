"""Commands of the sweep service: ``sweep``, ``pareto``, ``validate`` (``ablate``: commands_ablate)."""

from __future__ import annotations

import sys

from engine.errors import ConfigError
from engine.metrics import ACCURACY, PERPLEXITY, TRAIN_BITOPS, TRAIN_TBITOPS
from orchestrator.lifecycle import SweepInterrupted
from orchestrator.output import emit_json, info, table


def _load_any(path: str):
    """An ablation spec (has ``ablation``), a sweep spec (``parameters``/``base``/``search``...) or an
    experiment config."""
    from engine.config.experiment import load_config, read_yaml
    from search_spaces.ablation import load_ablation
    from search_spaces.spec import load_spec

    tree = read_yaml(path)
    if "ablation" in tree:
        return "ablation", load_ablation(path)
    if any(k in tree for k in ("parameters", "base", "search", "seeds", "budget", "resources", "stages")):
        return "spec", load_spec(path)
    return "config", load_config(path)


def cmd_validate(args) -> int:
    from orchestrator import lineage

    kind, obj = _load_any(args.file)
    if kind in ("spec", "ablation"):
        lineage.resolve_runs(args.tracking_uri, lineage.spec_run_ids(obj))  # each init.run_id: a readable checkpoint
        out = {"file": args.file, "kind": "sweep" if kind == "spec" else "ablation", "name": obj.name,
               "trials": obj.num_trials(), "valid": True}
        if getattr(obj, "stages", None):  # a staged sweep: its stages in order, their trials and references
            out["stages"] = [{"name": s.stage.name, "trials": s.num_trials(), "init_from": s.stage.init_from,
                              "head": s.stage.head if s.stage.init_from else None} for s in obj.stages]
    else:
        from engine.data.datasets import check_available
        from engine.train import pick_device

        pick_device(obj.device)  # device: cuda where no GPU is visible would fail at the first step
        if obj.data.data_dir:  # a folder named in the config must hold the data
            check_available(obj.data)
        if obj.init is not None:  # the pretrained checkpoint (or init.run_id's) must exist, of this run's model
            from engine.checkpoint import load_init

            load_init(lineage.resolve_config(obj, args.tracking_uri).init, obj.model.name)
        out = {"file": args.file, "kind": "experiment", "name": obj.name, "valid": True}
    print(f"{args.file}: valid {out['kind']} {out['name']!r}" + (f", {out['trials']} trials" if "trials" in out else "")
          + ("; stages " + " -> ".join(f"{s['name']} ({s['trials']})" for s in out["stages"]) if "stages" in out else ""))
    if args.json:
        emit_json(out)
    return 0


def task_label(rows: list[dict]) -> str:
    """"accuracy max", or "perplexity min" for a language model's trials (``orchestrator.runs.task_objective``)."""
    from orchestrator import runs

    return " ".join(runs.task_objective(rows))


def pareto_table(front: list[dict]) -> None:
    key = PERPLEXITY if any(PERPLEXITY in r for r in front) else ACCURACY  # a language model's front
    rows = [{"run_id": (r.get("run_id") or "")[:12], key: r[key], TRAIN_TBITOPS: r[TRAIN_BITOPS] / 1e12,
             **({f"cost_{r['objective']}": r["cost"]} if r.get("objective", "bitops") != "bitops" else {}),
             "cp": r.get("cp"), **{k: _short(v) for k, v in r["params"].items()}} for r in front]
    table(rows)


def _short(v) -> str:
    text = str(v)
    return text if len(text) <= 40 else text[:37] + "..."


def load_for_cluster(path: str, address: str | None, dashboard: bool = False, loader=None,
                     tracking_uri: str | None = None, storage: str | None = None, resume: bool = False,
                     outputs: dict[str, str | None] | None = None):
    """Everything a sweep needs checked before anything is created or started, every problem reported
    together: the spec (no Ray), the tracking URI and store (nothing created), the storage folder (not
    created), the output folders, the Ray address, and the spec's resources (against a Ray already running in
    this process, else against this machine for a local Ray, which is not started for it); then Ray starts or
    attaches and the resources are checked against it. Returns the loaded spec and the normalised tracking URI."""
    from pydantic import ValidationError

    from orchestrator import store
    from orchestrator.output import check_output_folder
    from orchestrator.sweep import (
        check_local_resources,
        check_ray_address,
        check_resources,
        init_ray,
        storage_root,
    )
    from search_spaces.spec import Resources, load_spec

    problems, loaded = [], None

    def gather(check, *a, **kw):
        try:
            return check(*a, **kw)
        except ConfigError as err:
            problems.extend((f"{err.source}: {f}" if err.source else f, v, m) for f, v, m in err.problems)
            return None

    loaded = gather(loader or load_spec, path)
    if loaded is not None and hasattr(loaded, "base_trial"):  # the data every trial reads: damaged files exit 2 here
        from engine.data.datasets import check_available

        gather(check_available, trial_data(loaded))
    uri = store.normalise_uri(tracking_uri or store.default_tracking_uri())
    gather(store.preflight, uri, mode="check")
    root = gather(storage_root, storage, create=False)
    if resume and root is not None and loaded is not None:
        from orchestrator.sweep import latest_sweep_id

        gather(latest_sweep_id, root, loaded.name)
    for field, value in (outputs or {}).items():
        if value:
            gather(check_output_folder, field, value)
    gather(check_ray_address, address)
    res = None
    try:
        from engine.config.experiment import read_yaml

        res = Resources.model_validate(read_yaml(path).get("resources") or {})
    except (ValidationError, ConfigError, AttributeError):
        res = None
    ray_up = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    if res is not None and (ray_up or address is None):
        # reported with the spec's other errors: against the running Ray, or against what a local Ray would
        # get (this machine's CPUs and GPUs) without starting one
        gather(check_resources if ray_up else check_local_resources, res.cpu, res.gpu)
    if problems:
        raise ConfigError(problems)
    if res is not None and not ray_up:
        init_ray(address, dashboard)
        try:
            check_resources(res.cpu, res.gpu)
        except ConfigError as err:
            raise ConfigError(err.problems, path) from None
    return loaded, uri


def trial_data(loaded):
    """The data config of the spec's base trial (what its trials train on)."""
    from search_spaces import trial

    return trial.decode(loaded.base_trial()).data


def cmd_sweep(args) -> int:
    from orchestrator.runner import run_sweep
    from orchestrator.sweep import SweepOptions

    if args.objective:  # a bad name is refused before Ray starts
        from engine.cost.hardware import check_model_name

        check_model_name(args.objective, "--objective")
    # before Ray starts and before anything is created: the spec, the tracking store, the storage folder,
    # the report folder and the Ray address, every problem at once
    loaded, uri = load_for_cluster(args.spec, args.address, args.dashboard, tracking_uri=args.tracking_uri,
                                   storage=args.storage, resume=args.resume,
                                   outputs={"--report-dir": None if args.no_report else args.report_dir})
    if args.objective:
        loaded = loaded.with_objective(args.objective)
    opts = SweepOptions(address=args.address, tracking_uri=args.tracking_uri, storage=args.storage,
                        resume=args.resume, dashboard=args.dashboard, progress=not args.quiet,
                        verbose=args.verbose)
    try:
        out = run_sweep(loaded, opts)
    except SweepInterrupted as stop:
        from orchestrator import store
        from orchestrator.lifecycle import resume_command
        from orchestrator.sweep import storage_root

        command = resume_command(args.spec, str(storage_root(args.storage, create=False)), store.redact(uri))
        info(f"fractune sweep: {stop}; its runs are marked KILLED; resume with: {command}")
        if args.json:
            emit_json({"sweep": loaded.name, "sweep_id": stop.sweep_id, "interrupted": stop.signal_name,
                       "finished": stop.finished, "trials": stop.total, "resume": command})
        return stop.exit_code
    print(f"\nsweep {out['sweep_id']}: {out['trials']} trials, {out['errored']} errored, "
          f"{len(out['pareto'])} on the Pareto front ({task_label(out['pareto'])}, training cost min under "
          f"{out['objective']})")
    pareto_table(out["pareto"])
    for e in out["errors"]:
        info(f"trial {e['trial_id']} errored: {e['error']}")
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
        out.update(write_report(out, args.report_dir, uri=uri))
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


def write_report(out: dict, folder: str | None, data=None, uri: str | None = None) -> dict:
    """The sweep's HTML report (``dashboards.report``), logged on its parent run. A report that cannot be
    written is reported, not raised: the sweep's results are in MLflow either way (``fractune report``)."""
    from dashboards.report import build_report

    if out["parent_run_id"] is None:
        return {"report": None, "report_error": "the sweep has no parent run"}
    try:
        rep = build_report(uri or out["tracking_uri"], out["sweep"], out["sweep_id"], folder, data=data)
    except Exception as exc:  # noqa: BLE001  any failure here must not hide the sweep's own outcome
        info(f"report failed ({type(exc).__name__}: {exc}); retry with: fractune report {out['sweep']} "
             f"--sweep-id {out['sweep_id']} --tracking-uri {out['tracking_uri']}")
        return {"report": None, "report_error": f"{type(exc).__name__}: {exc}"}
    print(f"report: {rep['report']}" + (f" (MLflow artifact {rep['artifact']})" if rep["artifact"] else ""))
    return {"report": rep["report"], "report_pngs": rep["pngs"], "report_artifact": rep["artifact"]}


def cmd_pareto(args) -> int:
    from orchestrator import runs, store

    uri = store.normalise_uri(args.tracking_uri or store.default_tracking_uri())
    store.check_uri(uri)
    data = runs.load(uri, args.sweep, args.sweep_id)
    objective = runs.check_objective(args.objective or data.objective, data.rows)
    front = runs.front(data.rows, objective)
    done = len(data.finished(objective))
    print(f"sweep {data.sweep_id}: {len(data.rows)} trials, {done} finished their planned epochs, "
          f"{len(front)} on the Pareto front ({task_label(data.rows)}, training cost min under {objective})")
    entries = [runs.front_entry(r, objective) for r in front]
    progress = data.progress()
    if progress:  # a sweep still running (or interrupted): the front of the trials done so far
        info(progress)
    diverged = [r for r in data.rows if r.get("diverged")]
    for r in diverged:
        info(f"trial {r['name']} diverged (its training loss passed the engine's bound at {r['diverged']})")
    pareto_table(entries)
    if args.json:
        emit_json({"sweep": args.sweep, "sweep_id": data.sweep_id, "experiment_id": data.experiment_id,
                   "parent_run_id": data.parent_run_id, "trials": len(data.rows), "finished": done,
                   "status": data.status, "planned": data.planned, "partial": progress is not None,
                   "diverged": [r["run_id"] for r in diverged], "objective": objective, "pareto": entries})
    return 0
