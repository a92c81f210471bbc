"""The texts step: embedded reviews with shuffled twins, users' files checked row by row."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from gpuflow.errors import DataError
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


def test_without_an_id_column_rows_are_numbered_per_file(tmp_path: Path):
    (tmp_path / "gen.csv").write_text("text\nfirst\nsecond\n")
    texts = file_texts([str(tmp_path / "gen.csv")], "text", None, [])
    assert texts["text_id"].tolist() == ["gen-1", "gen-2"]


BAD_FILES = {
    "missing text column": ("x.csv", b"id,body\n1,hello\n", "missing column(s) ['text']", None),
    "empty text": ("x.csv", b"id,text\n1,hello\n2,   \n", "empty text", 2),
    "undecodable bytes": ("x.csv", b"id,text\n1,hello\n2,caf\xe9\n", "not UTF-8", 3),
    "duplicate ids": ("x.csv", b"id,text\n7,a\n7,b\n", "duplicate text id '7'", 2),
    "ragged row": ("x.csv", b"id,text\n1,a,extra\n", "3 fields where the header has 2", 1),
    "broken json line": ("x.jsonl", b'{"id": 1, "text": "a"}\n{"id": 2,\n', "not valid JSON", 2),
    "text that is not a string": ("x.jsonl", b'{"id": 1, "text": 5}\n', "not a string", 1),
    "unknown file type": ("x.xlsx", b"whatever", "unknown file type", None),
    "empty file": ("x.csv", b"", "the file is empty", None),
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
    if row is not None:
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
