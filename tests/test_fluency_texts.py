"""The texts step: embedded reviews with shuffled twins, users' files checked row by row."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest

from gpuflow.errors import ConfigError, DataError
from gpuflow.fluency.texts import deal_into_shards, embedded_texts, file_texts
from tests.conftest import files_left


def test_embedded_texts_pair_every_review_with_a_word_shuffled_twin():
    texts = embedded_texts(20, ["imdb", "rotten_tomatoes"], 50, seed=1, shuffled_twins=True)
    assert list(texts.columns[:4]) == ["text_id", "text", "source", "condition"]
    assert texts["text_id"].is_unique
    originals = texts[texts["condition"] == "original"].set_index("pair_id")
    twins = texts[texts["condition"] == "shuffled"].set_index("pair_id")
    assert len(originals) == len(twins) == 20
    for pair_id, original in originals.iterrows():
        twin = twins.loc[pair_id, "text"]
        assert sorted(twin.split()) == sorted(original["text"].split())
        assert twin != original["text"]
        assert 8 <= len(original["text"].split()) <= 50
    assert set(texts["source"]) == {"imdb", "rotten_tomatoes"}


def test_embedded_texts_are_the_same_for_the_same_seed_and_differ_for_another():
    first = embedded_texts(10, ["imdb"], 30, seed=3, shuffled_twins=True)
    again = embedded_texts(10, ["imdb"], 30, seed=3, shuffled_twins=True)
    other = embedded_texts(10, ["imdb"], 30, seed=4, shuffled_twins=True)
    pd.testing.assert_frame_equal(first, again)
    assert set(first["text_id"]) != set(other["text_id"])


def test_shards_deal_every_text_exactly_once():
    texts = embedded_texts(11, ["rotten_tomatoes"], 30, seed=0, shuffled_twins=True)
    shards = deal_into_shards(texts, 3)
    dealt = pd.concat(shards)
    assert sorted(dealt["text_id"]) == sorted(texts["text_id"])
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1


def test_user_files_of_every_format_give_one_table_with_group_columns(tmp_path: Path):
    (tmp_path / "a.csv").write_text('id,text,method\n1,"Hello, world",base\n2,Fine text,detox\n')
    (tmp_path / "b.tsv").write_text("id\ttext\tmethod\n3\tTab text\tbase\n")
    (tmp_path / "c.jsonl").write_text('{"id": 4, "text": "Json text", "method": "detox"}\n')
    paths = [str(tmp_path / n) for n in ("a.csv", "b.tsv", "c.jsonl")]
    texts = file_texts(paths, "text", "id", ["method"])
    assert texts["text_id"].tolist() == ["1", "2", "3", "4"]
    assert texts["text"].tolist() == ["Hello, world", "Fine text", "Tab text", "Json text"]
    assert texts["method"].tolist() == ["base", "detox", "base", "detox"]
    assert texts["source"].tolist() == ["a", "a", "b", "c"]


def test_a_text_longer_than_the_csv_modules_field_limit_is_read_whole(tmp_path: Path):
    long_text = " ".join(["word"] * 40_000)  # 199,999 characters; csv's default limit: 131,072
    (tmp_path / "long.csv").write_text(f'id,text\n1,"{long_text}"\n2,short\n')
    (tmp_path / "long.tsv").write_text(f"id\ttext\n3\t{long_text}\n")
    paths = [str(tmp_path / "long.csv"), str(tmp_path / "long.tsv")]
    texts = file_texts(paths, "text", "id", [])
    assert texts["text"].tolist() == [long_text, "short", long_text]


def test_reading_leaves_the_csv_modules_field_limit_as_it_was_even_on_a_bad_row(tmp_path: Path):
    """The limit is one for the process: a reader that left it at its own file's size made
    later CSV reads of longer fields fail."""
    before = csv.field_size_limit()
    (tmp_path / "bad.csv").write_text("id,text\n1,a,extra\n")
    with pytest.raises(DataError) as raised:  # kept: the error's traceback holds the reader
        file_texts([str(tmp_path / "bad.csv")], "text", "id", [])
    assert csv.field_size_limit() == before
    assert "3 fields where the header has 2" in str(raised.value)


def test_without_an_id_column_rows_are_numbered_per_file(tmp_path: Path):
    (tmp_path / "gen.csv").write_text("text\nfirst\nsecond\n")
    texts = file_texts([str(tmp_path / "gen.csv")], "text", None, [])
    assert texts["text_id"].tolist() == ["gen-1", "gen-2"]


BAD_FILES = {
    "missing text column": ("x.csv", b"id,body\n1,hello\n", "missing column(s) ['text']", None),
    "empty text": ("x.csv", b"id,text\n1,hello\n2,   \n", "empty text", 2),
    "undecodable bytes": (
        "x.csv",
        b"\xef\xbb\xbfid,text\n1,hello\n2,caf\xe9\n",
        "not UTF-8 text on line 3 (byte 24 is 0xe9)",
        None,
    ),
    "duplicate ids": ("x.csv", b"id,text\n7,a\n7,b\n", "duplicate text id '7'", 2),
    "ragged row": ("x.csv", b"id,text\n1,a,extra\n", "3 fields where the header has 2", 1),
    "broken json line": ("x.jsonl", b'{"id": 1, "text": "a"}\n{"id": 2,\n', "not valid JSON", 2),
    "text that is not a string": ("x.jsonl", b'{"id": 1, "text": 5}\n', "not a string", 1),
    "unknown file type": ("x.xlsx", b"whatever", "unknown file type", None),
    "empty file": ("x.csv", b"", "the file is empty", None),
    "stray quote merging rows": (
        "x.csv",
        b'id,text\n1,"Great movie\n2,ok film\n3,"bad" one\n4,fine\n',
        "malformed CSV on lines 2-4",
        1,
    ),
    "quote never closed": ("x.csv", b'id,text\n1,ok\n2,"Great movie\n3,ok\n', "lines 3-4", 2),
    "repeated header column": (
        "x.csv",
        b"id,text,text\n1,a,b\n",
        "names column 'text' twice",
        None,
    ),
    "unnamed header column": ("x.tsv", b"id\t\ttext\n1\tx\ta\n", "no name for column 2", None),
    "missing column, expected listed": (
        "x.csv",
        b"text,model\n1,a\n",
        "missing column(s) ['id']; the file has ['text', 'model']"
        " (expected columns ['text', 'id'])",
        None,
    ),
    "blank csv id": ("x.csv", b"id,text\n1,a\n ,b\n", "blank text id", 2),
    "json null id": ("x.jsonl", b'{"id": null, "text": "a"}\n', "no text id", 1),
    "json record without an id": (
        "x.jsonl",
        b'{"id": 1, "text": "a"}\n{"text": "b"}\n',
        "no text id",
        2,
    ),
    "json float id": ("x.jsonl", b'{"id": 1.5, "text": "a"}\n', "text id 1.5 is float", 1),
    "json record without a text": ("x.jsonl", b'{"id": 1, "text": "a"}\n{"id": 2}\n', "no text", 2),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_text_file_names_the_file_row_and_problem(tmp_path: Path, case: str):
    name, content, problem, row = BAD_FILES[case]
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError) as raised:
        file_texts([str(path)], "text", "id", [])
    message = str(raised.value)
    assert str(path) in message
    assert problem in message
    if row is None:
        assert ", row" not in message
    else:
        assert f"row {row}" in message


def test_the_cli_reports_bad_input_in_one_line_and_leaves_no_output(tmp_path: Path, run_gpuflow):
    bad = tmp_path / "texts.csv"
    bad.write_bytes(b"id,text\n1,ok\n2,\n")
    out = tmp_path / "out" / "texts.csv"
    result = run_gpuflow(
        "fluency-texts",
        "--settings",
        json.dumps({"texts": {"source": "files", "files": [str(bad)], "id_column": "id"}}),
        "--out",
        str(out),
        check=False,
    )
    assert result.returncode == 2
    expected = f"gpuflow fluency-texts: error: {bad}, row 2: empty text (expected non-empty text)"
    assert result.stderr.strip() == expected
    assert not out.exists()
    assert files_left(out.parent) == []


def test_group_labels_are_read_as_written_and_a_json_null_is_empty(tmp_path: Path):
    (tmp_path / "a.csv").write_text("text,method\nOne,NA\nTwo,None\nThree,null\nFour,\n")
    (tmp_path / "b.jsonl").write_text(
        '{"text": "Five", "method": null}\n{"text": "Six", "method": "None"}\n'
    )
    texts = file_texts(
        [str(tmp_path / "a.csv"), str(tmp_path / "b.jsonl")], "text", None, ["method"]
    )
    assert texts["method"].tolist() == ["NA", "None", "null", "", "", "None"]


def test_a_json_record_without_the_group_key_is_grouped_like_a_json_null(tmp_path: Path):
    (tmp_path / "a.jsonl").write_text(
        '{"text": "One", "method": null}\n{"text": "Two"}\n{"text": "Three", "method": "x"}\n'
    )
    texts = file_texts([str(tmp_path / "a.jsonl")], "text", None, ["method"])
    assert texts["method"].tolist() == ["", "", "x"]


READ_AS_WRITTEN = {
    "csv field quoted over two lines with a doubled quote": (
        "a.csv",
        b'id,text\n1,"Two\nlines, ""quoted"""\n2,plain\n',
        ['Two\nlines, "quoted"', "plain"],
    ),
    "tsv quotes are ordinary characters": (
        "a.tsv",
        b'id\ttext\n1\t"Hello," she said.\n2\tA 5" screen\n',
        ['"Hello," she said.', 'A 5" screen'],
    ),
    "csv with a byte-order mark": (
        "a.csv",
        b"\xef\xbb\xbfid,text\n1,Fine\n2,Good\n",
        ["Fine", "Good"],
    ),
    "tsv with a byte-order mark": (
        "a.tsv",
        b"\xef\xbb\xbfid\ttext\n1\tFine\n2\tGood\n",
        ["Fine", "Good"],
    ),
    "jsonl with a byte-order mark": (
        "a.jsonl",
        b'\xef\xbb\xbf{"id": 1, "text": "Fine"}\n{"id": 2, "text": "Good"}\n',
        ["Fine", "Good"],
    ),
}


@pytest.mark.parametrize("case", sorted(READ_AS_WRITTEN))
def test_valid_files_are_read_exactly_as_written(tmp_path: Path, case: str):
    name, content, expected = READ_AS_WRITTEN[case]
    (tmp_path / name).write_bytes(content)
    texts = file_texts([str(tmp_path / name)], "text", "id", [])
    assert texts["text_id"].tolist() == ["1", "2"]
    assert texts["text"].tolist() == expected


@pytest.mark.parametrize(
    ("group_columns", "problem"),
    [
        (["text_id"], "'text_id' clashes with a column the workflow writes"),
        (["text"], "'text' clashes with a column the workflow writes"),
        (["model", "source"], "'source' clashes with a column the workflow writes"),
        (["condition"], "'condition' clashes with a column the workflow writes"),
        (["toxicity"], "'toxicity' clashes with a column the workflow writes"),
        (["model", "model"], "'model' is listed twice"),
    ],
)
def test_a_group_column_that_would_overwrite_another_is_refused(
    tmp_path: Path, group_columns: list[str], problem: str
):
    path = tmp_path / "a.csv"
    path.write_text(
        "id,text,model,text_id,source,condition,toxicity\n1,a,m,7,s,c,0\n2,b,m,7,s,c,1\n"
    )
    with pytest.raises(ConfigError) as raised:
        file_texts([str(path)], "text", "id", group_columns)
    assert raised.value.key == "fluency.texts.group_columns"
    assert problem in str(raised.value)
