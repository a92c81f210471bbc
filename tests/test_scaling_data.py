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
