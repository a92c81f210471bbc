"""User data for the scaling family: aclImdb folders, IMDB CSVs and AG News CSVs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflow.errors import ConfigError, DataError
from gpuflow.scaling.data import build_splits


def data_settings(**values: object) -> dict:
    base = {
        "source": "imdb", "corpus": "imdb", "path": None, "val_path": None, "n_train": None,
        "n_val": None, "val_fraction": 0.25, "seed": 0,
    }  # fmt: skip
    return {**base, **values}


def write_acl_imdb(root: Path) -> Path:
    for split, n in (("train", 3), ("test", 2)):
        for label in ("pos", "neg"):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(n):
                (folder / f"{i}_7.txt").write_text(f"{split} {label} review {i}<br />fine")
    return root


def test_an_acl_imdb_folder_trains_on_train_and_validates_on_test(tmp_path: Path):
    root = write_acl_imdb(tmp_path / "aclImdb")
    train, val, names = build_splits(data_settings(path=str(root)))
    assert len(train) == 6 and len(val) == 4
    assert train["text"].str.startswith("train").all() and val["text"].str.startswith("test").all()
    assert set(train["label"]) == {0, 1} and names == ["negative", "positive"]
    assert (train["text"].str.contains(" pos ") == (train["label"] == 1)).all()


def test_an_imdb_csv_with_review_and_sentiment_columns_is_split_by_the_seed(tmp_path: Path):
    path = tmp_path / "imdb.csv"
    rows = [f'"review {i}, with a comma",{"positive" if i % 2 else "negative"}' for i in range(8)]
    path.write_text("review,sentiment\n" + "\n".join(rows) + "\n")
    train, val, _ = build_splits(data_settings(path=str(path)))
    again, _, _ = build_splits(data_settings(path=str(path)))
    assert len(train) == 6 and len(val) == 2
    assert train["text"].tolist() == again["text"].tolist()
    assert set(train["label"]) | set(val["label"]) == {0, 1}


def test_an_imdb_csv_with_an_unknown_label_names_the_row(tmp_path: Path):
    path = tmp_path / "imdb.csv"
    path.write_text("text,label\ngood,pos\nbad,neg\nodd,maybe\n")
    with pytest.raises(DataError, match=r"row 4: label 'maybe'"):
        build_splits(data_settings(path=str(path)))


@pytest.mark.parametrize("header", ["", "Class Index,Title,Description\n"])
def test_ag_news_csvs_with_or_without_header_give_four_classes(tmp_path: Path, header: str):
    lines = [f'{c},"Title {c}-{i}","Body, of story {i}"' for c in (1, 2, 3, 4) for i in range(3)]
    (tmp_path / "train.csv").write_text(header + "\n".join(lines) + "\n")
    (tmp_path / "test.csv").write_text(header + "\n".join(lines[::3]) + "\n")
    train, val, names = build_splits(
        data_settings(
            source="agnews", path=str(tmp_path / "train.csv"), val_path=str(tmp_path / "test.csv")
        )
    )
    assert len(train) == 12 and len(val) == 4
    assert sorted(set(train["label"])) == [0, 1, 2, 3]
    assert names == ["World", "Sports", "Business", "Sci/Tech"]
    row = train[train["text"].str.startswith("Title 3-1")].iloc[0]
    assert row["text"] == "Title 3-1. Body, of story 1" and row["label"] == 2


def test_an_ag_news_row_with_a_bad_class_names_file_and_row(tmp_path: Path):
    path = tmp_path / "train.csv"
    path.write_text('1,"a","b"\n2,"c","d"\n9,"e","f"\n')
    with pytest.raises(DataError, match=r"train.csv, row 3: class '9'"):
        build_splits(data_settings(source="agnews", path=str(path)))


def test_missing_user_files_and_oversized_samples_are_reported_with_their_key(tmp_path: Path):
    with pytest.raises(DataError, match="no such file"):
        build_splits(data_settings(source="agnews", path=str(tmp_path / "none.csv")))
    with pytest.raises(ConfigError, match=r"data\.n_train"):
        build_splits(data_settings(source="embedded", corpus="rotten_tomatoes", n_train=10**6,
                                   n_val=10))  # fmt: skip


def agnews(path: Path, val_path: Path | None = None) -> dict:
    return data_settings(source="agnews", path=str(path), val_path=val_path and str(val_path))


AG_ROWS = '1,"World title","World body"\n2,"Sports title","Sports body"\n'


@pytest.mark.parametrize(
    "header",
    ["Class Index,Title,Description", "class,title,description", "label,title,description"],
)
def test_an_ag_news_header_is_a_first_line_whose_first_field_names_the_class_column(
    tmp_path: Path, header: str
):
    path = tmp_path / "train.csv"
    path.write_text(f"{header}\n{AG_ROWS}")
    train, _, _ = build_splits(agnews(path, val_path=path))
    assert sorted(train["text"]) == ["Sports title. Sports body", "World title. World body"]


@pytest.mark.parametrize("first", ['World,"A title","A body"', 'x,"Title","Description"'])
def test_an_ag_news_first_line_with_a_bad_class_is_an_error_not_a_header(
    tmp_path: Path, first: str
):
    path = tmp_path / "train.csv"
    path.write_text(f"{first}\n{AG_ROWS}")
    with pytest.raises(DataError, match=r"train\.csv, row 1: class '(World|x)'"):
        build_splits(agnews(path))


@pytest.mark.parametrize(
    ("source", "content", "message"),
    [
        ("agnews", b'1,"a","b"\n2,"c"\n', r"train\.csv, row 2: 2 columns"),
        ("agnews", b'1,"a","b"\n2,"c","d","e"\n', r"train\.csv, row 2: 4 columns"),
        ("agnews", b"Class Index,Title,Description\n1,a\n", r"train\.csv, row 2: 2 columns"),
        (
            "agnews",
            b'1,"a","b"\n2,"caf\xe9","d"\n',
            r"train\.csv: not UTF-8 text on line 2 \(byte 16 is 0xe9\)",
        ),
        ("agnews", b'1,"a","b"\n2,"c"x,"d"\n', r"train\.csv, row 2: malformed CSV"),
        ("agnews", b'1,"a","b"\n2,"c,"d\n3,"e","f"\n', r"train\.csv, row 2: malformed CSV"),
        ("agnews", b"", r"train\.csv: empty file"),
        ("agnews", b"\n\n", r"train\.csv: empty file"),
        ("agnews", b"Class Index,Title,Description\n", r"train\.csv: no data rows"),
        ("imdb", b"text,label\na,1\nb,0,extra\n", r"train\.csv, row 3: 3 columns"),
        ("imdb", b"text,label\na,1\nb\n", r"train\.csv, row 3: 1 column"),
        ("imdb", b'text,label\na,1\n"b,0\n', r"train\.csv, row 3: malformed CSV"),
        ("imdb", b"text,label\na,1\n\xff\xfeb,0\n", r"train\.csv: not UTF-8 text on line 3"),
        ("imdb", b"", r"train\.csv: empty file"),
        ("imdb", b"text,label\n", r"train\.csv: no data rows"),
    ],
)
def test_a_malformed_csv_names_the_file_the_row_and_the_problem(
    tmp_path: Path, source: str, content: bytes, message: str
):
    path = tmp_path / "train.csv"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message):
        build_splits(data_settings(source=source, path=str(path)))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("text,label\na,1\nb,0\nc,\nd,1\n", r"imdb\.csv, row 4: empty label"),
        ("text,label\na,1\nb,0\nc,2\n", r"imdb\.csv, row 4: label '2'"),
        ("text,label\na,1\n\nb,0\nc,maybe\n", r"imdb\.csv, row 5: label 'maybe'"),
        ('text,label\n"two\nlines",1\nc,maybe\n', r"imdb\.csv, row 4: label 'maybe'"),
        ("text,label\na,1\n,0\n", r"imdb\.csv, row 3: empty text"),
    ],
)
def test_an_imdb_csv_names_the_row_of_a_blank_or_unknown_label_counting_file_lines(
    tmp_path: Path, content: str, message: str
):
    path = tmp_path / "imdb.csv"
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        build_splits(data_settings(path=str(path)))


@pytest.mark.parametrize(
    "labels",
    [["0", "1", "1", "0"], ["neg", "POS", " positive ", "negative"], ["0", "pos", "1", "neg"]],
)
def test_an_imdb_csv_accepts_every_label_spelling_it_always_did(tmp_path: Path, labels: list):
    path = tmp_path / "imdb.csv"
    path.write_text("text,label\n" + "".join(f"review {i},{v}\n" for i, v in enumerate(labels)))
    train, _, _ = build_splits(data_settings(path=str(path), val_path=str(path)))
    assert dict(zip(train["text"], train["label"], strict=True)) == {
        "review 0": 0, "review 1": 1, "review 2": 1, "review 3": 0,
    }  # fmt: skip


@pytest.mark.parametrize("source", ["imdb", "agnews"])
@pytest.mark.parametrize("split", ["path", "val_path"])
def test_a_training_or_validation_file_without_data_rows_is_an_error(
    tmp_path: Path, source: str, split: str
):
    header = "text,label\n" if source == "imdb" else "Class Index,Title,Description\n"
    rows = "a,1\nb,0\n" if source == "imdb" else AG_ROWS
    full, empty = tmp_path / "full.csv", tmp_path / "empty.csv"
    full.write_text(header + rows)
    empty.write_text(header)
    paths = {"path": str(full), "val_path": str(full), split: str(empty)}
    with pytest.raises(DataError, match=r"empty\.csv: no data rows"):
        build_splits(data_settings(source=source, **paths))
