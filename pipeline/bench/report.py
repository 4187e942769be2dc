"""The report: the table, the JSON and Markdown files, the picture."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.bench.measures import Run


@dataclass
class Report:
    dataset: str
    engine: str
    split: str
    dev: str
    settings: dict
    chosen: dict = field(default_factory=dict)  # parameter -> {value, chosen_on, dev nDCG@10}
    rows: dict = field(default_factory=dict)  # config -> summary figures
    per_query: dict = field(default_factory=dict)  # config -> query id -> measures
    skipped: dict = field(default_factory=dict)  # config -> why it did not run
    notes: list[str] = field(default_factory=list)  # inputs left out, and why
    profile: dict = field(default_factory=dict)  # what search should run (--save-profile)



def markdown(report: Report) -> str:
    head = ["config", "R@10", "R@100", "nDCG@10", "MRR@10", "noise@10", "ΔR@10 [95% CI]",
            "ΔnDCG@10 [95% CI]", "up/down", "settings"]
    budget = report.settings.get("max_sketch_terms")
    lines = [f"**{report.dataset}** ({report.engine}, {report.split}: "
             f"{report.settings['queries']} queries; dev: {report.dev}"
             + (f"; at most {budget} sketch terms per search" if budget else "") + ")", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    def delta(row: dict, m: str) -> str:
        if f"d{m}" not in row:
            return "—"
        low, high = row[f"d{m} CI"]
        return f"{row[f'd{m}']:+.3f} [{low:+.3f}, {high:+.3f}]"

    for name, row in report.rows.items():

        extra = ", ".join(f"{k} {row[k]}" for k in ("policy", "cap", "w", "max_n") if k in row)
        updown = f"{row['up']}/{row['down']}" if "up" in row else "—"
        lines.append(f"| {name} | {row['R@10']:.3f} | {row['R@100']:.3f} | "
                     f"{row['nDCG@10']:.3f} | {row['MRR@10']:.3f} | {row['noise@10']:.3f} | "
                     f"{delta(row, 'R@10')} | {delta(row, 'nDCG@10')} | {updown} | {extra} |")
    if report.chosen:
        chosen = "; ".join(f"{k} = {v['value']}" for k, v in report.chosen.items())
        lines += ["", f"Chosen on dev ({report.dev}): {chosen}."]
    if report.notes:
        lines += ["", "Inputs: " + "; ".join(report.notes) + "."]
    if report.skipped:
        lines += ["", "Not run: " + "; ".join(f"{k} ({v})" for k, v in report.skipped.items())
                  + "."]
    return "\n".join(lines)


PLOTTED = ("nDCG@10", "R@10")


def _pyplot():  # matplotlib.pyplot, with the file-only backend
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def best_config(report: Report) -> str | None:
    """The configuration with the highest mean nDCG@10 other than BM25."""
    others = [n for n in report.rows if n != "bm25" and "dnDCG@10" in report.rows[n]]
    return max(others, key=lambda n: report.rows[n]["nDCG@10"], default=None)


def plot(report: Report, path: Path) -> None:
    """Each configuration's difference from BM25 in nDCG@10 and R@10, with its paired
    bootstrap 95 % interval, on axes scaled to the differences (the absolute values differ
    too little for a 0-1 axis to show them)."""
    plt = _pyplot()
    names = [n for n in report.rows if f"d{PLOTTED[0]}" in report.rows[n]]
    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(11, 1.2 + 0.45 * max(len(names), 1)),
                             sharey=True)
    y = np.arange(len(names))
    for ax, measure in zip(axes, PLOTTED, strict=True):
        deltas = np.array([report.rows[n][f"d{measure}"] for n in names])
        lows = np.array([report.rows[n][f"d{measure} CI"][0] for n in names])
        highs = np.array([report.rows[n][f"d{measure} CI"][1] for n in names])
        colours = ["#3a7d44" if lo > 0 else "#b03a2e" if hi < 0 else "#7f7f7f"
                   for lo, hi in zip(lows, highs, strict=True)]
        for i, colour in enumerate(colours):
            ax.errorbar(deltas[i], y[i], xerr=[[deltas[i] - lows[i]], [highs[i] - deltas[i]]],
                        fmt="o", color=colour, capsize=3)
        ax.axvline(0, color="black", linewidth=0.8)
        base = report.rows.get("bm25", {}).get(measure)
        ax.set_xlabel(f"{measure} − BM25" + (f" (BM25 {base:.3f})" if base is not None else ""))
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, names)
    axes[0].invert_yaxis()
    fig.suptitle(f"{report.dataset} ({report.engine}, {report.split}, "
                 f"{report.settings.get('queries', '?')} queries): difference from BM25, "
                 "95 % paired bootstrap interval (green: above 0, red: below)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_queries(report: Report, path: Path) -> str | None:
    """Per query, nDCG@10 of the best configuration minus BM25's, sorted: the promoted and
    demoted queries. Returns the configuration drawn (None: nothing to compare)."""
    best = best_config(report)
    if best is None or "bm25" not in report.per_query:
        return None
    plt = _pyplot()
    base, mine = report.per_query["bm25"], report.per_query[best]
    diffs = np.sort(np.array([mine[q]["nDCG@10"] - base[q]["nDCG@10"] for q in base]))[::-1]
    up, down = int((diffs > 0).sum()), int((diffs < 0).sum())
    fig, ax = plt.subplots(figsize=(10, 3.6))
    colours = np.where(diffs > 0, "#3a7d44", np.where(diffs < 0, "#b03a2e", "#7f7f7f"))
    ax.bar(np.arange(len(diffs)), diffs, width=1.0, color=colours)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xlabel(f"queries, sorted ({up} up, {down} down, {len(diffs) - up - down} unchanged)")
    ax.set_ylabel(f"nDCG@10: {best} − BM25")
    ax.set_title(f"{report.dataset} ({report.engine}, {report.split}): per query, {best} "
                 "against BM25", fontsize=10)
    ax.set_xlim(-0.5, len(diffs) - 0.5)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return best


def write(report: Report, runs: dict[str, Run], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{report.dataset}.json", "md": out_dir / f"{report.dataset}.md",
             "png": out_dir / f"{report.dataset}.png",
             "png_queries": out_dir / f"{report.dataset}-per-query.png"}
    payload = {**report.__dict__, "runs": {n: {q: hits[:10] for q, hits in r.items()}
                                           for n, r in runs.items()}}
    paths["json"].write_text(json.dumps(payload, indent=1))
    paths["md"].write_text(markdown(report) + "\n")
    plot(report, paths["png"])
    if plot_queries(report, paths["png_queries"]) is None:
        del paths["png_queries"]
    return paths

