"""benchmarks/anchor_nanogpt.py and levers.py: nanoGPT gets the split its prepare.py makes, our crossings are
read from the training clock of stats/epochs.csv, and a lever leaves the shared preprocessing alone."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from benchmarks.anchor_nanogpt import NANOGPT_FILES, check_nanogpt, first_at_or_below, prepare_nanogpt
from benchmarks.levers import lever_settings


def test_nanogpt_trains_on_the_first_90_percent_and_validates_on_the_rest(shakespeare, tmp_path):
    checkout = tmp_path / "nanoGPT"
    for name in NANOGPT_FILES:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text(f"# {name}\n")
    work = prepare_nanogpt(checkout, shakespeare, tmp_path / "work")
    text = shakespeare.read_text(encoding="utf-8")
    meta = pickle.loads((work / "data" / "shakespeare_char" / "meta.pkl").read_bytes())
    decoded = {
        split: "".join(
            meta["itos"][int(i)]
            for i in np.fromfile(work / "data" / "shakespeare_char" / f"{split}.bin", dtype=np.uint16)
        )
        for split in ("train", "val")
    }
    cut = int(len(text) * 0.9)
    assert decoded == {"train": text[:cut], "val": text[cut:]}
    assert meta["vocab_size"] == len(set(text)) and sorted(meta["stoi"]) == list(meta["stoi"])
    assert all((work / name).read_text() == f"# {name}\n" for name in NANOGPT_FILES)


def test_a_crossing_is_the_first_evaluation_at_or_below_with_the_training_time_up_to_it():
    rows = [
        {"step": "25", "duration_ms": "10000", "val_nats_per_char": "2.1"},
        {"step": "50", "duration_ms": "5000", "val_nats_per_char": "1.88"},
        {"step": "75", "duration_ms": "5000", "val_nats_per_char": "1.95"},
        {"step": "100", "duration_ms": "5000", "val_nats_per_char": "1.60"},
    ]
    assert first_at_or_below(rows, 1.886) == (50, 15.0)
    assert first_at_or_below(rows, 1.60) == (100, 25.0)
    assert first_at_or_below(rows, 1.5) is None


def test_a_folder_that_is_not_a_nanogpt_checkout_is_named_with_what_it_lacks(tmp_path):
    (tmp_path / "train.py").write_text("")
    with pytest.raises(SystemExit, match=r"not a nanoGPT checkout: it lacks model.py, configurator.py, config/"):
        check_nanogpt(tmp_path)


def test_a_lever_changes_what_the_train_stage_reads_and_names_a_setting_of_the_preprocessing():
    assert lever_settings("") == []
    assert lever_settings(" train.learning_rate=0.006  model.dropout=0.1 ") == [
        "train.learning_rate=0.006",
        "model.dropout=0.1",
    ]
    with pytest.raises(SystemExit, match=r"data.block_size=64 changes the preprocessing every lever shares"):
        lever_settings("train.batch_size=16 data.block_size=64")
