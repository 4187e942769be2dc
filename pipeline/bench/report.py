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


def plot(report: Report, path: Path) -> None:
    """Recall@10 per configuration with a bootstrap 95 % interval of its mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report.rows)
    means, lows, highs = [], [], []
    for i, name in enumerate(names):
        values = [v["R@10"] for v in report.per_query[name].values()]
        rng = np.random.default_rng(i)
        samples = rng.choice(values, size=(2000, len(values))).mean(axis=1)
        low, high = np.percentile(samples, [2.5, 97.5])
        m = float(np.mean(values))
        means.append(m)
        lows.append(m - low)
        highs.append(high - m)
    fig, ax = plt.subplots(figsize=(max(6, len(names) * 0.9), 4))
    ax.bar(names, means, yerr=[lows, highs], capsize=4, color="#4878a8")
    ax.set_ylabel("Recall@10")
    ax.set_title(f"{report.dataset} ({report.engine}, {report.split})")
    ax.set_ylim(0, 1)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(report: Report, runs: dict[str, Run], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{report.dataset}.json", "md": out_dir / f"{report.dataset}.md",
             "png": out_dir / f"{report.dataset}.png"}
    payload = {**report.__dict__, "runs": {n: {q: hits[:10] for q, hits in r.items()}
                                           for n, r in runs.items()}}
    paths["json"].write_text(json.dumps(payload, indent=1))
    paths["md"].write_text(markdown(report) + "\n")
    plot(report, paths["png"])
    return paths

