"""The Markdown tables of reports and generated docs."""


def markdown_table(header: list[str], rows: list[list[str]], bar: str = "|") -> str:
    """A Markdown table of `header` and `rows`; a `|` inside a cell is written as `bar`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", bar) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
