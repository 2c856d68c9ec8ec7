"""`fractune compare`: two or more sweeps side by side, from MLflow alone.

A researcher runs a study, changes a default or a seed, runs it again, and reads the two together: one figure
with each sweep's finished trials and its Pareto front (the task objective against training TBitOPs), and one
table with each method's (its label: FW4/BW8, PFQ auto ...) task objective and training TBitOPs in every sweep,
means over its finished trials (``results.runs.finished``: trials stopped early or failed are left out, as
everywhere; a staged sweep's compared stages, ``results.runs.compared_rows``), with the differences from the
first sweep named. A sweep is named by its name (its latest run) or
by a sweep id (``NAME-YYYYMMDD-HHMMSS``, as ``fractune sweeps`` lists them). Sweeps of different task
objectives (a classifier's accuracy, a language model's perplexity) are refused: their numbers do not compare.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from pathlib import Path

from engine.errors import ConfigError
from engine.metrics import TERA, TRAIN_BITOPS
from results import runs

# a sweep id as lifecycle.claim_sweep_id makes it: the sweep's name, the second it started, a counter in that second
SWEEP_ID = re.compile(r"(?P<name>.+)-\d{8}-\d{6}(-\d{2})?")


def sweep_ref(text: str) -> tuple[str, str | None]:
    """(name, sweep id or None for the latest) of a command-line reference to a sweep."""
    m = SWEEP_ID.fullmatch(text)
    return (m["name"], text) if m else (text, None)


def check_inputs(uri: str, refs: list[str], out_field: str, out: str) -> None:
    """Every sweep name, the output file and the URI checked before anything is read or written."""
    from results import store, store_checks
    from results.output import check_output_file

    ConfigError.check_all(*(lambda ref=ref: store.check_names(*sweep_ref(ref)) for ref in refs),
                          lambda: check_output_file(out_field, out, (".md", ".markdown", ".txt"), ("_fronts.png",)),
                          lambda: store_checks.check_uri(uri))


def load_all(uri: str, refs: list[str]) -> list[runs.SweepRuns]:
    """Every sweep read back (each unknown one named, in one check), all of one task objective."""
    if len(refs) < 2:
        raise ConfigError.single("sweeps", " ".join(refs), "allowed: two or more sweeps")
    if len(set(refs)) < len(refs):
        twice = next(r for r in refs if refs.count(r) > 1)
        raise ConfigError.single("sweeps", twice, "given twice; allowed: different sweeps")
    from results import store, store_checks

    store_checks.preflight(store.normalise_uri(uri), mode="read")  # an unreachable store: one line, not one per sweep
    loaded: list[runs.SweepRuns] = []
    problems: list[tuple[str, object, str]] = []
    for ref in refs:
        try:
            loaded.append(runs.load(uri, *sweep_ref(ref)))
        except ConfigError as err:
            problems += err.problems
            if any(field == "--tracking-uri" for field, _, _ in err.problems):
                break  # the store failed after its check: the other sweeps would only say so again
    if problems:
        raise ConfigError(problems)
    ids = [d.sweep_id for d in loaded]
    if len(set(ids)) < len(ids):  # a name and the id of its latest run
        twice = next(i for i in ids if ids.count(i) > 1)
        raise ConfigError.single("sweeps", twice, "named twice; allowed: different sweeps")
    tasks = {str(d.task) for d in loaded}
    if len(tasks) > 1:
        got = ", ".join(f"{d.sweep_id} ({d.task})" for d in loaded)
        raise ConfigError.single("sweeps", got, "allowed: sweeps of one task objective")
    return loaded


def method_means(data: runs.SweepRuns) -> dict[str, dict]:
    """Per method label: the task objective's and training TBitOPs' means over its finished trials, and n."""
    by: dict[str, list[dict]] = {}
    for r in data.finished():
        by.setdefault(r.get("method") or r.get("schedule") or "?", []).append(r)
    key = data.task.key
    return {m: {key: statistics.fmean(r[key] for r in rs), "tbitops": statistics.fmean(r[TRAIN_BITOPS] for r in rs)
                / TERA, "n": len(rs)} for m, rs in by.items()}


def comparison(sweeps: list[runs.SweepRuns]) -> list[dict]:
    """One entry per method of any sweep (cheapest in the first sweep first, then the others' own): its means in
    each sweep (None where it did not run or finish there) and each later sweep's differences from the first."""
    key = sweeps[0].task.key
    means = [method_means(d) for d in sweeps]
    order = sorted(means[0], key=lambda m: means[0][m]["tbitops"])
    for other in means[1:]:
        order += sorted((m for m in other if m not in order), key=lambda m: other[m]["tbitops"])
    out = []
    for method in order:
        per = {d.sweep_id: means[i].get(method) for i, d in enumerate(sweeps)}
        base = per[sweeps[0].sweep_id]
        diffs = {}
        for d in sweeps[1:]:
            here = per[d.sweep_id]
            if base is not None and here is not None:
                diffs[d.sweep_id] = {key: here[key] - base[key],
                                     "tbitops_pct": 100.0 * (here["tbitops"] / base["tbitops"] - 1.0)
                                     if base["tbitops"] else math.nan}
        out.append({"method": method, "sweeps": per, "diff": diffs})
    return out


def compare_png(sweeps: list[runs.SweepRuns], path: Path) -> Path:
    """Each sweep's finished trials and its Pareto front (a step line) on one figure; log cost axis when wide."""
    from dashboards import pngs

    task = sweeps[0].task
    fig, ax = pngs.plt.subplots(figsize=(8, 5.2))
    costs = []
    for i, d in enumerate(sweeps):
        color = f"C{i}"
        done, front = d.finished(), d.front()
        costs += [r[TRAIN_BITOPS] for r in done]
        ax.scatter([r[TRAIN_BITOPS] / TERA for r in done], [r[task.key] for r in done], color=color, alpha=0.6,
                   label=f"{d.sweep_id} ({len(done)} finished)")
        if front:
            xs = [r[TRAIN_BITOPS] / TERA for r in front]
            ax.step(xs, [r[task.key] for r in front], where="post", color=color, lw=1.2)
            ax.scatter(xs, [r[task.key] for r in front], marker="*", s=150, color=color, edgecolors="k", zorder=3)
    pngs.log_x_if_wide(ax, costs)
    if ax.get_xscale() == "log":  # plain numbers (18, 40, 700), not 2x10^1 labels that run into each other
        from matplotlib.ticker import FuncFormatter, LogLocator

        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(LogLocator(subs=(2, 5)))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("training TBitOPs")
    ax.set_ylabel(task.label)
    ax.set_title("Sweeps compared: finished trials and Pareto fronts (stars)")
    pngs.legend(ax, fontsize=8)
    return pngs._save(fig, path)


def markdown(sweeps: list[runs.SweepRuns], methods: list[dict], plot: Path, command: str) -> str:
    from dashboards.markdown import fmt, table

    task = sweeps[0].task
    key, first = task.key, sweeps[0].sweep_id
    lines = [f"# Sweeps compared: {', '.join(d.sweep_id for d in sweeps)}", "",
             f"Generated by `{command}` on {time.strftime('%Y-%m-%d')} from the MLflow runs of the sweeps below. "
             f"Per method, the mean {task.label} and training TBitOPs over its trials that finished their planned "
             f"epochs (n); the differences are each sweep's minus the first's (`{first}`). Do not edit by hand: "
             "rerun the command.", ""]
    lines += table(["sweep", "trials", "finished", "on the front", "status"],
                   [[f"`{d.sweep_id}`", str(len(d.rows)), str(len(runs.finished(d.rows, d.task))), str(len(d.front())),
                     d.status]
                    for d in sweeps])
    head = ["method"]
    for i in range(len(sweeps)):
        tag = f"#{i + 1}"
        head += [f"{key} {tag}", f"TBitOPs {tag}", f"n {tag}"]
    for i in range(1, len(sweeps)):
        head += [f"Δ {key} #{i + 1}", f"Δ TBitOPs % #{i + 1}"]
    rows = []
    for entry in methods:
        cells = [entry["method"]]
        for d in sweeps:
            m = entry["sweeps"][d.sweep_id]
            cells += [fmt(m and m[key]), fmt(m and m["tbitops"], ".4g"), str(m["n"]) if m else "n/a"]
        for d in sweeps[1:]:
            diff = entry["diff"].get(d.sweep_id)
            cells += [fmt(diff and diff[key], "+.4f"), fmt(diff and diff["tbitops_pct"], "+.1f")]
        rows.append(cells)
    lines += ["", "Sweeps: " + ", ".join(f"#{i + 1} `{d.sweep_id}`" for i, d in enumerate(sweeps)), ""]
    lines += table(head, rows) + ["", f"![fronts]({plot.name})", ""]
    return "\n".join(lines)


def build(uri: str, refs: list[str], out: str, command: str) -> dict:
    """Read the sweeps, write the page and its figure (``out`` and ``<out stem>_fronts.png``); the JSON object
    of ``fractune compare --json``."""
    sweeps = load_all(uri, refs)
    methods = comparison(sweeps)
    page = Path(out)
    plot = compare_png(sweeps, page.with_name(page.stem + "_fronts.png"))
    page.write_text(markdown(sweeps, methods, plot, command))
    key = sweeps[0].task.key
    return {"sweeps": [{"sweep": d.name, "sweep_id": d.sweep_id, "trials": len(d.rows),
                        "finished": len(runs.finished(d.rows, d.task)),
                        "status": d.status, "pareto": [runs.front_entry(r, d.task) for r in d.front()]}
                       for d in sweeps],
            "task": str(sweeps[0].task), "objective": key, "methods": methods, "markdown": str(page.resolve()),
            "plot": str(plot.resolve())}


def cmd_compare(args) -> int:
    from results import store
    from results.output import emit_json
    from results.provenance import shown_path, shown_uri

    uri = store.normalise_uri(args.tracking_uri or store.default_tracking_uri())
    check_inputs(uri, list(args.sweeps), "--out", args.out)
    command = "fractune compare " + " ".join(
        list(args.sweeps) + (["--tracking-uri", shown_uri(args.tracking_uri)] if args.tracking_uri else [])
        + ["--out", shown_path(args.out)])
    out = build(uri, list(args.sweeps), args.out, command)
    print(Path(out["markdown"]).read_text())
    print(f"written {out['markdown']} and {out['plot']}")
    if args.json:
        emit_json(out)
    return 0
