"""Cluster commands: ``submit`` (a sweep as a Ray Job), ``jobs`` (list), ``stop`` (one job)."""

from __future__ import annotations

import os
import sys

from results.output import emit_json, info, table


def cmd_submit(args) -> int:
    from orchestrator.cluster import jobs

    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    out, jc = jobs.submit(args.spec, args.address, uri, args.storage, upload=not args.installed, resume=args.resume,
                          submission_id=args.job_id)
    if not uri:
        info("note: no --tracking-uri or $MLFLOW_TRACKING_URI: the job logs to the cluster's $MLFLOW_TRACKING_URI, "
             "or to a sqlite file in the job's working folder")
    print(f"submitted {out['job_id']} (sweep {out['sweep']}, {out['trials']} trials) to {out['address']}")
    print(f"  logs: fractune jobs --address {out['address']}   stop: fractune stop {out['job_id']} "
          f"--address {out['address']}", file=sys.stderr)
    if not args.follow:
        if args.json:
            emit_json(out)
        return 0
    with jobs.answering(jc):
        status = jobs.follow(jc, out["job_id"], sys.stderr if args.json else sys.stdout)
        result = jobs.last_json_line(jc.get_job_logs(out["job_id"]))
    out["status"] = status
    if result is not None:
        out["result"] = result
    print(f"job {out['job_id']}: {status}")
    if args.json:
        emit_json(out)
    return 0 if status == "SUCCEEDED" else 1


def cmd_jobs(args) -> int:
    from orchestrator.cluster import jobs

    with jobs.answering(jobs.client(args.address)) as jc:
        rows = sorted((jobs.describe(j) for j in jc.list_jobs()), key=lambda r: r["start_time"] or 0)
    if rows:
        table([{k: r[k] for k in ("job_id", "status", "sweep", "message")} for r in rows])
    else:
        print(f"no jobs on {jc.get_address()}")
    if args.json:
        emit_json({"address": jc.get_address(), "jobs": rows})
    return 0


def cmd_stop(args) -> int:
    from engine.errors import ConfigError
    from orchestrator.cluster import jobs

    if problem := jobs.job_id_problem(args.job_id, "job_id"):
        raise ConfigError([problem])
    with jobs.answering(jobs.client(args.address)) as jc:
        known = {j.submission_id for j in jc.list_jobs()}
        if args.job_id not in known:
            raise ConfigError.single("job_id", args.job_id, f"no such job on {jc.get_address()}; "
                                     "`fractune jobs` lists them")
        stopped = bool(jc.stop_job(args.job_id))
        status = str(jc.get_job_status(args.job_id).value)
    print(f"job {args.job_id}: " + ("stop requested" if stopped else f"already {status.lower()}"))
    if args.json:
        emit_json({"job_id": args.job_id, "stop_requested": stopped, "status": status})
    return 0
