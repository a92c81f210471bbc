"""The Markdown tables of reports and generated docs."""


def markdown_table(header: list[str], rows: list[list[str]], bar: str = "|") -> str:
    """A Markdown table: a header row, its rule, then `rows`; a `|` inside a cell is written
    as `bar` (the job records' table writes `/`)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", bar) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
