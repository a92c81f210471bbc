"""The SSVAE summary: accuracy by fraction and alpha beside the baseline, and Kingma et al."""

from __future__ import annotations

import argparse

import pandas as pd

from gpuflow.job import markdown_table, telemetry_section, write_text

# Kingma, Rezende, Mohamed, Welling (2014), Table 1: M2 test error (%) on MNIST, trained on the
# 50,000 digits of the standard train / validation / test split (their code's mnist.pkl.gz).
KINGMA_M2_ERROR = {100: (11.97, 1.71), 600: (4.94, 0.13), 1000: (3.60, 0.56), 3000: (3.92, 0.63)}
KINGMA_N_TRAIN = 50000


def _cell(mean: float, std: float, digits: int = 3) -> str:
    """Mean ± std over seeds; the mean alone where there is no std (one seed)."""
    return f"{mean:.{digits}f}" if pd.isna(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def accuracy_table(summary: pd.DataFrame, rate: float) -> str:
    """Markdown: rows = label fraction, columns = M2 per alpha and the baseline."""
    at = summary[summary["corrupt"] == rate]
    alphas = sorted(at.loc[at["model"] == "m2", "alpha"].unique())
    header = [
        "fraction",
        "labels",
        *[f"M2 α={a:g}" for a in alphas],
        "baseline",
        "best M2 − baseline",
    ]
    body = []
    for frac, rows in at.groupby("frac"):
        m2 = rows[rows["model"] == "m2"].set_index("alpha")
        base = rows[rows["model"] == "baseline"]
        cells = [f"{frac:g}", str(int(rows["n_labelled"].iloc[0]))]
        cells += [
            _cell(m2.at[a, "accuracy_mean"], m2.at[a, "accuracy_std"]) if a in m2.index else ""
            for a in alphas
        ]
        base_mean = base["accuracy_mean"].iloc[0] if len(base) else float("nan")
        cells.append(_cell(base_mean, base["accuracy_std"].iloc[0]) if len(base) else "")
        cells.append(f"{m2['accuracy_mean'].max() - base_mean:+.3f}" if len(base) else "")
        body.append(cells)
    return markdown_table(header, body)


def gain_table(summary: pd.DataFrame) -> str:
    """Markdown: per label count, corruption and alpha, M2's paired gain with its 95% CI."""
    m2 = summary[summary["model"] == "m2"].sort_values(["n_labelled", "corrupt", "alpha"])
    lines = [
        "| labels | corruption | alpha | M2 − baseline (points) | 95% CI over seeds | seeds |",
        "|---|---|---|---|---|---|",
    ]
    for _, row in m2.iterrows():
        mean, half = 100 * row["gain_mean"], 100 * row["gain_ci95"]
        interval = (
            "n/a (one seed)" if pd.isna(half) else f"[{mean - half:+.2f}, {mean + half:+.2f}]"
        )
        lines.append(
            f"| {int(row['n_labelled'])} | {row['corrupt']:g} | {row['alpha']:g} | "
            f"{mean:+.2f} | {interval} | {int(row['n_seeds'])} |"
        )
    return "\n".join(lines)


def kingma_table(summary: pd.DataFrame, n_train: int) -> str:
    """M2 test error beside Kingma et al.'s Table 1 for the label counts both have."""
    clean = summary[(summary["model"] == "m2") & (summary["corrupt"] == 0)]
    shared = sorted(set(clean["n_labelled"]) & set(KINGMA_M2_ERROR))
    if not shared:
        return (
            f"No label count of this grid matches Kingma et al.'s Table 1 (100, 600, 1000, 3000 "
            f"labels of {KINGMA_N_TRAIN} training digits)."
        )
    lines = []
    if n_train != KINGMA_N_TRAIN:
        lines += [
            f"Kingma et al. trained on {KINGMA_N_TRAIN} digits, this grid on {n_train}: the same "
            "label count comes with fewer unlabelled digits here, so read the paper's column as "
            "a reference point, not a target.",
            "",
        ]
    if "selected_error_mean" in clean:
        return "\n".join(lines + selected_table(summary, shared))
    lines += [
        "| labels | alpha | M2 error % here (mean ± std) | Kingma et al. M2 error % |",
        "|---|---|---|---|",
    ]
    for n in shared:
        paper = "{:.2f} ± {:.2f}".format(*KINGMA_M2_ERROR[n])
        for _, row in clean[clean["n_labelled"] == n].sort_values("error_mean").iterrows():
            lines.append(f"| {n} | {row['alpha']:g} | {_percent(row, 'error')} | {paper} |")
    return "\n".join(lines)


def _percent(row: pd.Series, prefix: str) -> str:
    """Mean ± std of a share over seeds, in percent; the mean alone for one seed."""
    return _cell(100 * row[f"{prefix}_mean"], 100 * row[f"{prefix}_std"], digits=2)


def _span(low: float, high: float) -> str:
    return f"{int(low)}" if low == high else f"{int(low)}-{int(high)}"


def selected_table(summary: pd.DataFrame, shared: list[int]) -> list[str]:
    """Markdown lines: test error at each run's best validation epoch and at the last."""
    clean = summary[summary["corrupt"] == 0]
    lines = [
        "Test error at each run's epoch of best validation accuracy (and at the last epoch), "
        "mean ± std over seeds.",
        "",
        "| labels | model | alpha | seeds | error % at best validation epoch | best epochs "
        "| error % at last epoch | Kingma et al. M2 error % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in shared:
        paper = "{:.2f} ± {:.2f}".format(*KINGMA_M2_ERROR[n])
        rows = clean[clean["n_labelled"] == n].sort_values(
            ["model", "alpha"], ascending=[False, True]
        )
        for _, row in rows.iterrows():
            m2 = row["model"] == "m2"
            alpha = f"{row['alpha']:g}" if m2 else "—"
            lines.append(
                f"| {n} | {row['model']} | {alpha} | {int(row['n_seeds'])} | "
                f"{_percent(row, 'selected_error')} | "
                f"{_span(row['best_val_epoch_min'], row['best_val_epoch_max'])} | "
                f"{_percent(row, 'error')} | {paper if m2 else ''} |"
            )
    return lines


def validation_curves(curves: pd.DataFrame) -> str:
    """Markdown: mean validation accuracy (%) per evaluated epoch, one table per label count."""
    clean = curves[curves["corrupt"] == 0].copy()
    clean["run"] = [
        "baseline" if model == "baseline" else f"M2 α={alpha:g}"
        for model, alpha in zip(clean["model"], clean["alpha"], strict=True)
    ]
    parts = []
    for n, rows in clean.groupby("n_labelled"):
        table = 100 * rows.pivot_table(index="epoch", columns="run", values="val_accuracy")
        order = sorted(table.columns, key=lambda name: (name != "baseline", name))
        body = [
            [f"{epoch}", *(f"{v:.2f}" for v in vals)] for epoch, vals in table[order].iterrows()
        ]
        parts += [f"{n} labels, mean over seeds:", "", markdown_table(["epoch", *order], body), ""]
    return "\n".join(parts).rstrip()


def summary_markdown(
    runs: pd.DataFrame, summary: pd.DataFrame, curves: pd.DataFrame | None = None
) -> str:
    """The whole summary.md."""
    m2 = runs[runs["model"] == "m2"]
    n_train, epochs = int(runs["n_train"].iloc[0]), int(runs["epochs"].iloc[0])
    wins = (m2["gain_over_baseline"] > 0).sum()
    parts = [
        "# SSVAE grid: M2 against a labelled-only classifier",
        "",
        f"{len(m2)} M2 runs and {(runs['model'] == 'baseline').sum()} baseline runs, "
        f"{n_train} training digits, {epochs} epochs. Test accuracy, mean ± std over "
        f"{int(summary['n_seeds'].max())} seeds. The baseline is the M2 classifier's architecture "
        "trained on the same labelled subset (same corrupted labels, same seed) alone.",
        "",
        f"M2 beats its paired baseline in {wins} of {len(m2)} runs "
        f"(mean gain {m2['gain_over_baseline'].mean():+.3f}).",
        "",
        "## Paired gain of M2 over the baseline",
        "",
        "Each M2 run minus the baseline of the same seed (same labelled subset, same corrupted "
        "labels), in accuracy points; mean and 95% t-interval over seeds.",
        "",
        gain_table(summary),
    ]
    for rate in sorted(summary["corrupt"].unique()):
        parts += ["", f"## Label corruption {rate:g}", "", accuracy_table(summary, rate)]
    recorded = runs["devices"].dropna().astype(str) if "devices" in runs else []
    devices = ", ".join(sorted(set(" ".join(recorded).split())))
    parts += [
        "",
        "## Beside Kingma et al. (2014), Table 1",
        "",
        f"{epochs} epochs; device: {devices or 'not recorded'}.",
        "",
        kingma_table(summary, n_train),
    ]
    if curves is not None and "val_accuracy" in curves:
        parts += ["", "## Validation accuracy by epoch", "", validation_curves(curves)]
    rate = m2["samples_per_s"].median()
    parts += ["", f"Median training throughput: {rate:,.0f} examples/s per M2 run.", ""]
    return "\n".join(parts)


def main(args: argparse.Namespace) -> None:
    """`gpuflow ssvae-report`."""
    runs, summary = pd.read_csv(args.runs), pd.read_csv(args.summary)
    curves = pd.read_csv(args.curves) if args.curves else None
    write_text(args.out, summary_markdown(runs, summary, curves) + telemetry_section(args.out))
    print(f"wrote {args.out}")
