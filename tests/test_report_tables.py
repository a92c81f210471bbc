"""`gpuflow report-tables`: a family's summary CSVs as one HTML page for Snakemake's report."""

from __future__ import annotations

import pandas as pd


def test_every_table_becomes_an_html_table_with_its_rows(tmp_path, run_gpuflow):
    summary = tmp_path / "summary.csv"
    cost = tmp_path / "cost_table.csv"
    pd.DataFrame({"method": ["m2", "baseline"], "accuracy": [0.91234567, 0.8]}).to_csv(
        summary, index=False
    )
    pd.DataFrame({"world_size": [1, 2, 4], "gpu_hours": [0.5, 0.75, None]}).to_csv(
        cost, index=False
    )
    out = tmp_path / "tables.html"
    run_gpuflow(
        "report-tables", "--csv", str(summary), str(cost), "--title", "T", "--out", str(out)
    )
    page = out.read_text(encoding="utf-8")
    assert "<h1>T</h1>" in page
    assert page.index("summary.csv (2 rows)") < page.index("cost_table.csv (3 rows)")
    assert page.count("<table") == 2 and "<td>0.9123</td>" in page and "<td>baseline</td>" in page


def test_a_missing_or_broken_table_is_one_line_and_no_page(tmp_path, run_gpuflow):
    out = tmp_path / "tables.html"
    missing = run_gpuflow(
        "report-tables", "--csv", str(tmp_path / "no.csv"), "--title", "T", "--out", str(out),
        check=False,
    )  # fmt: skip
    assert missing.returncode == 2 and not out.exists()
    assert missing.stderr.strip().count("\n") == 0 and "no.csv: no such file" in missing.stderr
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    broken = run_gpuflow(
        "report-tables", "--csv", str(empty), "--title", "T", "--out", str(out), check=False
    )
    assert broken.returncode == 2 and "empty.csv: not a CSV table" in broken.stderr
    assert not out.exists()
