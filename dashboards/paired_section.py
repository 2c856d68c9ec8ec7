"""A spec's paired test on the results page: the rule stated first, each pair's per-seed runs side by side, the
differences with their mean and 95 % t-interval, the verdict (decided in results/paired.py), and its plot."""

from __future__ import annotations

import statistics
from pathlib import Path

from dashboards.markdown import fmt
from results.objectives import Objective
from results.paired import rule_text
from search_spaces.schema import Paired


def section(pairs: list[dict], verdict: dict, paired: Paired, task: Objective, plot: str | None) -> list[str]:
    """The page's paired section: the rule, then per pair and seed the runs side by side, the differences and
    the verdict."""
    y, unit = task.scale, f"{task.short} {task.unit}" if task.unit else task.short.rstrip(".")
    lines = ["## Paired test", "", rule_text(paired, task), "",
             "Per seed: each side's final test figure and training BitOPs (the run's, exact; a gated arm's cp is on "
             "the whole model with its gate, the static twin's over every layer), and the difference.", "",
             f"| pair | seed | arm {unit} | twin {unit} | difference | arm TBitOPs | twin TBitOPs | arm cp % | "
             "twin cp % |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in pairs:
        name = f"{p['arm_method']} vs {p['twin_method']}" + (" (control)" if p["control"] else "")
        for s in p["seeds"]:
            lines.append(f"| {name} | {s['seed']} | {y * s['arm']:.2f} | {y * s['twin']:.2f} | "
                         f"{s['difference']:+.2f} | {s['arm_bitops'] / 1e12:.3f} | {s['twin_bitops'] / 1e12:.3f} | "
                         f"{fmt(s['arm_cp'], '.3f')} | {fmt(s['twin_cp'], '.3f')} |")
    lines += ["", "| pair | seeds | mean difference | 95 % interval | every difference >= 0 |",
              "| --- | --- | --- | --- | --- |"]
    for p in pairs:
        name = f"{p['arm_method']} vs {p['twin_method']}" + (" (control)" if p["control"] else "")
        diffs = [s["difference"] for s in p["seeds"]]
        lines.append(f"| {name} | {len(diffs)} | {fmt(p['mean'], '+.2f')} | {fmt(p['low'], '+.2f')} .. "
                     f"{fmt(p['high'], '+.2f')} | {'yes' if diffs and all(d >= 0 for d in diffs) else 'no'} |")
    lines += ["", f"**Verdict: {verdict['verdict']}.** Over the {verdict['n']} deciding differences the mean is "
              f"{fmt(verdict['mean'], '+.2f')} (95 % interval {fmt(verdict['low'], '+.2f')} .. "
              f"{fmt(verdict['high'], '+.2f')}): {verdict['why']}.", ""]
    if plot:
        lines += [f"![each pair per seed]({plot})", ""]
    return lines


def pairs_png(pairs: list[dict], task: Objective, path: Path) -> Path | None:
    """The test as the verdict reads it: per pair, each seed's twin and arm at their own BitOPs joined by a line
    (no front, no interpolation), the means bold; one panel per pair."""
    from dashboards.pngs import _save, plt

    shown = [p for p in pairs if p["seeds"]]
    if not shown:
        return None
    y = task.scale
    fig, axes = plt.subplots(1, len(shown), figsize=(4.6 * len(shown), 4.4), squeeze=False)
    for ax, p in zip(axes[0], shown):
        for s in p["seeds"]:
            ax.plot([s["twin_bitops"] / 1e12, s["arm_bitops"] / 1e12], [y * s["twin"], y * s["arm"]], "-",
                    color="0.75", lw=1)
            ax.plot(s["twin_bitops"] / 1e12, y * s["twin"], "s", color="tab:blue", ms=5)
            ax.plot(s["arm_bitops"] / 1e12, y * s["arm"], "v", color="tab:red", ms=5)
            ax.annotate(str(s["seed"]), (s["arm_bitops"] / 1e12, y * s["arm"]), fontsize=6, xytext=(3, 2),
                        textcoords="offset points")
        mean = {k: statistics.fmean(s[k] for s in p["seeds"]) for k in ("twin_bitops", "arm_bitops", "twin", "arm")}
        ax.plot([mean["twin_bitops"] / 1e12, mean["arm_bitops"] / 1e12], [y * mean["twin"], y * mean["arm"]], "-",
                color="k", lw=2)
        ax.plot(mean["twin_bitops"] / 1e12, y * mean["twin"], "s", color="tab:blue", ms=9,
                label=f"twin: {p['twin_method']}")
        ax.plot(mean["arm_bitops"] / 1e12, y * mean["arm"], "v", color="tab:red", ms=9, label=f"arm: {p['arm_method']}")
        ax.set_title(("control: " if p["control"] else "") + f"mean difference {fmt(p['mean'], '+.2f')}", fontsize=9)
        ax.set_xlabel("training TBitOPs")
        ax.legend(fontsize=6, loc="lower right")
    axes[0][0].set_ylabel(f"{task.label}{', ' + task.unit if task.unit else ''}")
    return _save(fig, path)
