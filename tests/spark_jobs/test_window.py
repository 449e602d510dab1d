"""Windowing, the train/val split and corpus pieces: pure functions, no Spark."""

from __future__ import annotations

import bz2
import gzip
from itertools import pairwise

import numpy as np
import pytest

from pipeline import corpus_files
from pipeline.errors import PipelineError
from spark_jobs.text import bpe, corpus, sliding_windows
from spark_jobs.text.sliding_windows import (
    Piece,
    check_windows,
    covered_tokens,
    cut_windows,
    plan_windows,
    window_count,
    window_starts,
)
from spark_jobs.tokenize_corpus import encode_task, encode_tasks


def formula(n: int, block_size: int, stride: int) -> int:
    return (n - block_size - 1) // stride + 1 if n >= block_size + 1 else 0


@pytest.mark.parametrize(
    "n, block_size, stride",
    [(0, 4, 2), (4, 4, 1), (5, 4, 1), (6, 4, 1), (20, 4, 2), (20, 4, 5), (20, 4, 7), (100, 8, 100), (9, 8, 9)],
)
def test_window_count_is_the_formula(n, block_size, stride):
    assert window_count(n, block_size, stride) == formula(n, block_size, stride)
    starts = window_starts(n, block_size, stride)
    assert len(starts) == formula(n, block_size, stride)
    assert all(start + block_size + 1 <= n for start in starts)
    # One more stride would run past the end.
    if len(starts):
        assert starts[-1] + stride + block_size + 1 > n


def test_document_shorter_than_a_window_gives_none():
    assert window_count(4, 4, 1) == 0  # T + 1 = 5 tokens are needed
    assert window_count(5, 4, 1) == 1
    plans, counts = plan_windows([Piece(0, "train", 0, 4, (1, 2, 3, 4))], block_size=4, stride=1)
    assert plans[(0, "train", 0)].count == 0
    assert counts["splits"]["train"]["windows"] == 0


def test_stride_larger_than_block_skips_tokens():
    ids = np.arange(20)
    starts = window_starts(20, 4, 7)
    windows = cut_windows(ids, starts, 4)
    assert starts.tolist() == [0, 7, 14]
    assert windows.tolist() == [[0, 1, 2, 3, 4], [7, 8, 9, 10, 11], [14, 15, 16, 17, 18]]


def reference_windows(sequences: dict, block_size: int, stride: int) -> dict:
    """split -> list of (doc_id, start, ids) cut directly from whole sequences."""
    out = {"train": [], "val": []}
    for (doc_id, split), ids in sorted(sequences.items(), key=lambda item: (item[0][1], item[0][0])):
        for start in window_starts(len(ids), block_size, stride):
            out[split].append((doc_id, int(start), ids[start : start + block_size + 1].tolist()))
    return out


@pytest.mark.parametrize("block_size, stride", [(4, 1), (4, 3), (4, 5), (4, 11), (8, 8), (2, 1)])
def test_windows_across_pieces_equal_windows_of_the_whole_sequence(block_size, stride):
    rng = np.random.default_rng(block_size * 100 + stride)
    sequences, pieces_ids = {}, {}
    for doc_id in range(3):
        for split in ("train", "val"):
            ids = rng.integers(0, 1000, size=int(rng.integers(0, 60)))
            sequences[(doc_id, split)] = ids
            cuts = sorted(set(rng.integers(0, len(ids) + 1, size=4).tolist()) | {0, len(ids)})
            for number, (begin, end) in enumerate(pairwise(cuts)):
                pieces_ids[(doc_id, split, number)] = ids[begin:end]  # pieces as short as 1 token
    pieces = [Piece(d, s, p, len(ids), tuple(ids[:block_size].tolist())) for (d, s, p), ids in pieces_ids.items()]
    plans, counts = plan_windows(pieces, block_size, stride)

    got = {"train": [], "val": []}
    for (doc_id, split, number), ids in pieces_ids.items():
        for starts, indices, rows in plans[(doc_id, split, number)].windows(ids, block_size, stride, limit=3):
            got[split] += [(int(i), doc_id, int(s), w.tolist()) for i, s, w in zip(indices, starts, rows, strict=True)]
    expected = reference_windows(sequences, block_size, stride)
    for split in ("train", "val"):
        got[split].sort()
        assert [row[0] for row in got[split]] == list(range(len(expected[split])))  # idx: 0..n-1, no gaps
        assert [row[1:] for row in got[split]] == expected[split]
        assert counts["splits"][split]["windows"] == len(expected[split])
        assert counts["splits"][split]["windows"] == sum(
            formula(len(ids), block_size, stride) for (d, s), ids in sequences.items() if s == split
        )


@pytest.mark.parametrize("block_size, stride", [(4, 1), (4, 3), (4, 5), (8, 8), (2, 1)])
def test_packed_windows_equal_windows_of_the_files_joined_by_the_separator(block_size, stride):
    separator = 7777
    rng = np.random.default_rng(block_size * 10 + stride)
    streams, pieces_ids = {"train": [], "val": []}, {}
    for doc_id in range(5):
        for split in ("train", "val"):
            ids = rng.integers(0, 1000, size=int(rng.integers(0, 9)))  # mostly shorter than a window
            cuts = sorted(set(rng.integers(0, len(ids) + 1, size=3).tolist()) | {0, len(ids)})
            for number, (begin, end) in enumerate(pairwise(cuts)):
                pieces_ids[(doc_id, split, number)] = ids[begin:end]
            if len(ids):
                streams[split] += ids.tolist() + [separator]
    pieces = [Piece(d, s, p, len(ids), tuple(ids[:block_size].tolist())) for (d, s, p), ids in pieces_ids.items()]
    plans, counts = plan_windows(pieces, block_size, stride, separator)

    for split, stream in streams.items():
        got = sorted(
            (int(i), int(start), w.tolist())
            for (doc_id, s, number), ids in pieces_ids.items()
            if s == split
            for starts, indices, windows in [*plans[(doc_id, s, number)].windows(ids, block_size, stride, limit=2)]
            for i, start, w in zip(indices, starts, windows, strict=True)
        )
        starts = window_starts(len(stream), block_size, stride)
        assert [row[0] for row in got] == list(range(len(starts)))
        assert [(row[1], row[2]) for row in got] == [(int(k), stream[k : k + block_size + 1]) for k in starts]
        assert counts["splits"][split] == {
            "windows": len(starts),
            "tokens": len(stream),
            "sequences": 1,
            "covered_tokens": covered_tokens(len(stream), block_size, stride),
        }


class ReadCountingList(list):
    """A list that counts the elements read from it: one per index, per item iterated, and per
    element a slice copies."""

    reads = 0

    def __iter__(self):
        for item in super().__iter__():
            ReadCountingList.reads += 1
            yield item

    def __getitem__(self, index):
        found = super().__getitem__(index)
        ReadCountingList.reads += len(found) if isinstance(index, slice) else 1
        return found


@pytest.mark.parametrize("n_files", [1000, 4000])
@pytest.mark.parametrize("heads", [True, False])  # tokenize plans for the counts alone, without heads
def test_planning_a_packed_split_reads_each_piece_a_few_times(monkeypatch, n_files, heads):
    # Packed, a split is one sequence of every file's part: planning must not read the rest of the
    # sequence for each piece (quadratic: 400,000 files took minutes), nor further than the
    # block_size tokens a tail needs. The planner walks each sequence's pieces in the list `sorted`
    # gives it: count what it reads of that list.
    monkeypatch.setattr(
        sliding_windows, "sorted", lambda *args, **kwargs: ReadCountingList(sorted(*args, **kwargs)), raising=False
    )
    ReadCountingList.reads = 0
    pieces = [
        Piece(doc_id, "train", number, 3, (1, 2, 3) if heads else ()) for doc_id in range(n_files) for number in (0, 1)
    ]
    plans, counts = plan_windows(pieces, block_size=16, stride=8, separator=0)
    stream = [1, 2, 3, 1, 2, 3, 0] * n_files  # two pieces of 3 tokens and the separator a file
    assert counts["splits"]["train"]["windows"] == window_count(len(stream), 16, 8)
    if heads:
        assert plans[(0, "train", 0)].tail.tolist() == stream[3:19]
    assert ReadCountingList.reads <= 10 * len(pieces)


def test_the_window_plan_keeps_ids_in_int32_arrays(tmp_path):
    # The driver holds the first T ids of every piece, and tails of as many: as tuples of Python
    # ints they took about 0.7 GB for 100,000 files; as int32, 4 bytes an id.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_jobs import window

    rows = {"doc_id": [0, 1], "path": ["a", "b"], "split": ["train", "train"], "piece": [0, 0], "n_tokens": [6, 3]}
    table = pa.table({**rows, "ids": pa.array([[300, 301, 302, 303, 304, 305], [400, 401, 402]], pa.list_(pa.int32()))})
    pq.write_table(table, tmp_path / "part-00000.parquet")
    rows = window.read_heads(4)((tmp_path / "part-00000.parquet").as_uri())
    heads = [row[-1] for row in rows]
    assert [head.dtype for head in heads] == [np.int32, np.int32]
    assert [head.tolist() for head in heads] == [[300, 301, 302, 303], [400, 401, 402]]
    plans, _ = plan_windows([Piece(*row[:1], *row[2:]) for row in rows], block_size=4, stride=2, separator=9)
    tail = plans[(0, "train", 0)].tail  # the next file's ids and its separator
    assert tail.dtype == np.int32 and tail.tolist() == [400, 401, 402, 9]


def test_windows_never_straddle_the_split_boundary():
    # One file: train tokens 0..29, val tokens 100..111. A window across the boundary would mix them.
    train, val = np.arange(30), np.arange(100, 112)
    pieces = [
        Piece(0, "train", 0, 30, tuple(train[:4].tolist())),
        Piece(0, "val", 0, 12, tuple(val[:4].tolist())),  # same piece number: the piece holding the boundary
    ]
    plans, counts = plan_windows(pieces, block_size=4, stride=3)
    train_windows = np.concatenate([w for _, _, w in plans[(0, "train", 0)].windows(train, 4, 3)])
    val_windows = np.concatenate([w for _, _, w in plans[(0, "val", 0)].windows(val, 4, 3)])
    assert (train_windows < 100).all() and (val_windows >= 100).all()
    assert counts["splits"]["train"]["windows"] == formula(30, 4, 3) == 9
    assert counts["splits"]["val"]["windows"] == formula(12, 4, 3) == 3
    assert plans[(0, "train", 0)].tail.size == 0 and plans[(0, "val", 0)].tail.size == 0


def test_split_boundary_is_the_last_fraction_of_characters():
    assert corpus.split_boundary(1_115_394, 0.1) == 1_003_854  # nanoGPT's shakespeare_char split
    assert corpus.split_boundary(10, 0.25) == 7


def test_corpus_check_size_needs_a_window_in_each_split():
    corpus.check_size([1000, 0], block_size=128, val_fraction=0.1)  # 1000 bytes may hold enough tokens
    with pytest.raises(PipelineError, match=r"^the corpus is empty: its 2 file\(s\) hold no bytes$"):
        corpus.check_size([0, 0], block_size=128, val_fraction=0.1)
    with pytest.raises(
        PipelineError,
        match=r"^the corpus holds 100 bytes, so at most 100 tokens, and a window needs data.block_size \+ 1 = 129",
    ):
        corpus.check_size([60, 40], block_size=128, val_fraction=0.1)
    # 200 bytes: the last tenth is 20 characters, at most 84 tokens even at 4 bytes a character
    with pytest.raises(
        PipelineError, match=r"validation part \(data.val_fraction=0.1 of 200 bytes\) holds at most 84 tokens"
    ):
        corpus.check_size([200], block_size=128, val_fraction=0.1)


def test_corpus_files_come_with_their_sizes(tmp_path):
    from pipeline.config_files import load_config

    (tmp_path / "b.txt").write_text("bb")
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "skip.md").write_text("ccc")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("cccc")
    config = load_config(
        overrides=[{"corpus": [str(tmp_path / "*.txt"), str(tmp_path / "sub"), str(tmp_path / "a.txt")]}]
    )
    assert corpus_files.corpus_files(config) == {
        (tmp_path / "a.txt").as_uri(): 1,
        (tmp_path / "b.txt").as_uri(): 2,
        (tmp_path / "sub" / "c.txt").as_uri(): 4,
    }


def test_the_tokenizer_trains_on_training_text_only_within_the_cap(tmp_path):
    texts = {"a.txt": "aaaa\n" * 20, "b.txt": "bbbb\n" * 40, "c.txt": "cccc\n" * 20}
    docs = []
    for doc_id, (name, text) in enumerate(texts.items()):
        (tmp_path / name).write_text(text)
        boundary = 0 if name == "c.txt" else len(text) - 10  # c.txt: a validation file
        docs.append(corpus.Document(doc_id, (tmp_path / name).as_uri(), len(text), len(text), boundary))
    assert corpus.training_sample(docs, cap_bytes=10_000) == [texts["a.txt"][:90], texts["b.txt"][:190]]
    # Over the cap: a prefix of each training part, in proportion to its size (90 : 190 bytes).
    assert corpus.training_sample(docs, cap_bytes=56) == [texts["a.txt"][:18], texts["b.txt"][:38]]


def test_pack_groups_consecutive_items_up_to_the_target():
    assert corpus.pack([5, 5, 5, 12, 1, 1, 9], lambda n: n, 10) == [[5, 5], [5], [12], [1, 1], [9]]
    assert corpus.pack([], lambda n: n, 10) == []


def documents(*chars: int) -> list[corpus.Document]:
    return [corpus.Document(i, f"file:///c/part{i:03d}.txt", n, n, n) for i, n in enumerate(chars)]


def test_one_file_is_split_at_its_tail():
    for val_split in ("auto", "tail"):
        (doc,), used = corpus.split_validation(documents(1000), 0.1, val_split)
        assert used == "tail" and doc.boundary == 900
    with pytest.raises(
        PipelineError,
        match=r"data.val_split=files: whole files cannot make up data.val_fraction=0.1 of the corpus \(its "
        r"smallest file holds 100.0% ",
    ):
        corpus.split_validation(documents(1000), 0.1, "files")


def test_many_small_files_go_to_validation_whole():
    docs = documents(*[100 + i for i in range(100)])
    split, used = corpus.split_validation(docs, 0.1, "auto")
    assert used == "files"
    val = [doc for doc in split if doc.boundary == 0]
    assert {doc.boundary for doc in split if doc.boundary} == {doc.chars for doc in split if doc.boundary}
    total = sum(doc.chars for doc in docs)
    assert 0.1 * total - 200 <= sum(doc.chars for doc in val) <= 0.1 * total  # short by less than one file
    # Chosen by a hash of the names: spread over the corpus, the same whatever order they come in.
    ids = sorted(doc.doc_id for doc in val)
    assert ids != list(range(len(ids))) and ids != list(range(100 - len(ids), 100))
    again, _ = corpus.split_validation(list(reversed(docs)), 0.1, "auto")
    assert sorted(doc.doc_id for doc in again if doc.boundary == 0) == ids
    # Asked for tails, every file gets one.
    split, used = corpus.split_validation(docs, 0.1, "tail")
    assert used == "tail" and all(0 < doc.boundary < doc.chars for doc in split)


def test_a_few_large_files_keep_tails_unless_whole_files_are_asked_for():
    docs = documents(600, 352, 48)  # whole files: 48 of the 100 wanted characters, under half
    split, used = corpus.split_validation(docs, 0.1, "auto")
    assert used == "tail" and [doc.boundary for doc in split] == [540, 316, 43]
    with pytest.raises(PipelineError, match=r"its smallest file holds 4.8% of the characters"):
        corpus.split_validation(docs, 0.1, "files")
    split, used = corpus.split_validation(documents(600, 350, 50), 0.1, "auto")  # 50: half is enough
    assert used == "files" and [doc.boundary for doc in split] == [600, 350, 0]


def test_a_piece_holding_the_boundary_is_split_at_the_right_character():
    pieces = [corpus.Piece(0, "f", 0, 0, 40), corpus.Piece(0, "f", 1, 40, 100), corpus.Piece(0, "f", 2, 100, 130)]
    scans = [corpus.Scan(0, 0, 40, None), corpus.Scan(0, 1, 50, None), corpus.Scan(0, 2, 30, None)]
    doc = corpus.Document(0, "f", 130, 120, corpus.split_boundary(120, 0.25))  # boundary at character 90
    tasks = encode_tasks(pieces, scans, [doc])
    # (piece, first validation character within the piece): all train, split at 50 of 50, all val
    assert [(piece.index, val_start) for piece, val_start in tasks] == [(0, 40), (1, 50), (2, 0)]
    doc = corpus.Document(0, "f", 130, 120, 75)
    assert [val_start for _, val_start in encode_tasks(pieces, scans, [doc])] == [40, 35, 0]


def test_no_window_in_a_split_names_the_file():
    _, counts = plan_windows([Piece(0, "train", 0, 100, ()), Piece(0, "val", 0, 3, ())], block_size=8, stride=4)
    with pytest.raises(
        PipelineError,
        match=r"corpus file /data/a.txt is shorter than one window: its validation part has 3 "
        r"tokens.*block_size \+ 1 = 9",
    ):
        check_windows(counts, 8, 4, {0: "/data/a.txt"})
    _, counts = plan_windows(
        [
            Piece(0, "train", 0, 100, ()),
            Piece(0, "val", 0, 20, ()),
            Piece(1, "train", 0, 5, ()),
            Piece(1, "val", 0, 1, ()),
        ],
        block_size=8,
        stride=4,
    )
    warnings = check_windows(counts, 8, 4, {0: "/data/a.txt", 1: "/data/b.txt"})
    assert len(warnings) == 3 and all("/data/b.txt" in warning for warning in warnings[:2])
    # val: a.txt's 20 tokens give windows over 17 of them, b.txt's 1 token none: 17 of 21
    assert warnings[2].startswith("the val windows cover 81% of the val split's tokens")


def test_no_validation_window_from_whole_files_suggests_tails():
    pieces = [Piece(0, "train", 0, 100, ()), Piece(1, "val", 0, 5, ()), Piece(2, "val", 0, 3, ())]
    _, counts = plan_windows(pieces, block_size=8, stride=4)
    paths = {0: "/data/a.txt", 1: "/data/b.txt", 2: "/data/c.txt"}
    with pytest.raises(PipelineError, match=r"validation part has 5 tokens.*data.val_fraction, data.val_split=tail"):
        check_windows(counts, 8, 4, paths, val_split="files")
    with pytest.raises(PipelineError) as tails:
        check_windows(counts, 8, 4, paths, val_split="tail")
    assert "data.val_split" not in str(tails.value)


def test_many_short_parts_make_one_warning_per_split():
    short = [Piece(i, "val", 0, i, ()) for i in range(1, 6)]
    _, counts = plan_windows(
        [Piece(0, "train", 0, 100, ()), Piece(0, "val", 0, 401, ()), *short], block_size=8, stride=4
    )
    (warning,) = check_windows(counts, 8, 4, {i: f"/data/{i}.txt" for i in range(6)})
    assert warning == (
        "5 corpus files have a validation part of fewer tokens than one window (9): /data/1.txt (1), "
        "/data/2.txt (2), /data/3.txt (3) and 2 more; their 15 tokens (3.6% of the val split) give no val window "
        "(data.pack_documents=true would use them)"
    )


def test_windows_leaving_much_of_a_split_unused_are_warned_about():
    pieces = [Piece(0, "train", 0, 1000, ()), Piece(0, "val", 0, 100, ())]
    pieces += [Piece(i, "val", 0, 12, ()) for i in range(1, 30)]  # one window of 9 per 12 tokens
    _, counts = plan_windows(pieces, block_size=8, stride=4)
    assert (
        counts["splits"]["train"]["covered_tokens"] == 997 and counts["splits"]["val"]["covered_tokens"] == 97 + 29 * 9
    )
    (warning,) = check_windows(counts, 8, 4, {i: f"/data/{i}.txt" for i in range(30)})
    assert warning == (
        "the val windows cover 80% of the val split's tokens: each file's tokens after its last window go unused, "
        "and the files are short (median 12 tokens, windows of 9); a smaller data.stride or data.block_size, "
        "or data.pack_documents=true, uses more of them"
    )
    # A stride longer than the window skips tokens on purpose: no warning.
    _, counts = plan_windows([Piece(0, "train", 0, 1000, ()), Piece(0, "val", 0, 1000, ())], block_size=8, stride=20)
    assert counts["splits"]["train"]["covered_tokens"] == 450 and check_windows(counts, 8, 20, {0: "/data/a.txt"}) == []


def test_pieces_are_cut_after_newlines_and_cover_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "MIN_PIECE_BYTES", 64)
    lines = [("word " * int(n)).strip() + "\n" for n in np.random.default_rng(0).integers(0, 12, size=300)]
    text = "".join(lines) + "no newline at the end é"
    path = tmp_path / "a.txt"
    path.write_text(text, encoding="utf-8")
    data = path.read_bytes()
    pieces = corpus.plan_pieces([(path.as_uri(), len(data))], parallelism=4)
    assert len(pieces) == 8
    assert pieces[0].start == 0 and pieces[-1].end == len(data)
    assert all(a.end == b.start for a, b in pairwise(pieces))
    assert all(data[piece.start - 1 : piece.start] == b"\n" for piece in pieces[1:])
    assert "".join(data[p.start : p.end].decode("utf-8") for p in pieces) == text


def test_a_file_without_newlines_is_cut_between_characters(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "MIN_PIECE_BYTES", 16)
    monkeypatch.setattr(corpus, "LOOKAHEAD_BYTES", 8)
    text = "ééé€€€x" * 40  # 2- and 3-byte characters
    path = tmp_path / "b.txt"
    path.write_text(text, encoding="utf-8")
    data = path.read_bytes()
    pieces = corpus.plan_pieces([(path.as_uri(), len(data))], parallelism=8)
    assert len(pieces) > 4
    assert "".join(data[p.start : p.end].decode("utf-8") for p in pieces) == text


def test_text_is_read_without_a_byte_order_mark_and_with_newline_line_ends():
    assert corpus.normalize_text("\ufeffTo be\r\nor not\rto be\n", file_start=True) == "To be\nor not\nto be\n"
    assert corpus.normalize_text("\ufeffmid-file", file_start=False) == "\ufeffmid-file"
    assert corpus.check_text("\ufeffhé\r\n".encode()) == (3, None)
    assert corpus.check_text("\ufeffhé\r\n".encode(), offset=10) == (4, None)


def test_check_text_finds_bad_bytes_with_their_offset():
    assert corpus.check_text("héllo\n".encode()) == (6, None)
    assert corpus.check_text(b"abc\xff def", offset=100)[1].startswith(
        "is not UTF-8 text (byte 0xff at offset 103); convert it"
    )
    assert corpus.check_text("To be".encode("utf-16-be").join([b"\xfe\xff", b""]))[1].startswith(
        "is UTF-16 text, not UTF-8"
    )
    assert corpus.check_text(b"almost text\x00with a NUL\n")[1] == "looks binary (NUL byte at offset 11)"
    assert corpus.check_text(b"PK\x03\x04\x00\x00")[1] == "is a zip archive, not text (decompress it first)"
    assert (
        corpus.check_text(gzip.compress("To be, or not to be\n".encode()))[1]
        == "is a gzip archive, not text (decompress it first)"
    )
    assert corpus.check_text(bz2.compress(b"To be\n"))[1] == "is a bzip2 archive, not text (decompress it first)"
    assert corpus.check_text(b"BZh is how this line starts\n") == (28, None)


def test_assess_fails_or_skips_bad_files():
    files = [("file:///c/bad.bin", 10), ("file:///c/good.txt", 10), ("file:///c/empty.txt", 0)]
    scans = [
        corpus.Scan(0, 0, 0, "is not UTF-8 text (byte 0xff at offset 3)"),
        corpus.Scan(1, 0, 10, None),
        corpus.Scan(2, 0, 0, None),
    ]
    with pytest.raises(
        PipelineError,
        match=r"corpus file file:///c/bad.bin is not UTF-8 text \(byte 0xff at offset 3\); set data.bad_files=skip",
    ):
        corpus.assess(files, scans, bad_files="fail")
    documents, skipped, warnings = corpus.assess(files, scans, bad_files="skip")
    assert [doc.path for doc in documents] == ["file:///c/good.txt"]
    assert [item["path"] for item in skipped] == ["file:///c/bad.bin", "file:///c/empty.txt"]
    assert "skipping corpus file file:///c/bad.bin" in warnings[0]
    with pytest.raises(PipelineError, match="corpus file file:///c/empty.txt is empty"):
        corpus.assess(files[2:], [corpus.Scan(0, 0, 0, None)], bad_files="fail")


@pytest.mark.parametrize("size", [1, 7, 64])
def test_text_chunks_join_back(size):
    text = "First line\nsecond, longer line\n\n" + "x" * 300 + " y" * 50 + "\nend"
    pieces = list(bpe.chunks(text, size))
    assert "".join(pieces) == text
    assert all(piece for piece in pieces)


def test_a_literal_end_of_text_in_the_corpus_is_the_separator_token(shakespeare_slice):
    """Text that marks its documents itself (TinyStories' files do) gets the separator there."""
    tokenizer = bpe.train([shakespeare_slice.read_text()], vocab_size=300, min_frequency=2)
    text = "Once upon a time.\n<|endoftext|>\nAnother story."
    ids = bpe.encode(tokenizer, text).tolist()
    assert ids.count(bpe.separator_id(tokenizer)) == 1
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert tokenizer.decode(ids) == text.replace("<|endoftext|>", "")


def test_a_file_rewritten_while_tokenize_reads_it_is_caught_and_one_that_grew_is_not(tmp_path):
    """The stage's own scan and encoding functions, run here without Spark."""
    from types import SimpleNamespace

    path = tmp_path / "play.txt"
    path.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40)
    files = [(f"file://{path}", path.stat().st_size)]
    pieces = corpus.plan_pieces(files, parallelism=2)
    scans = corpus.scan_pieces(pieces)
    documents, _, _ = corpus.assess(files, scans, bad_files="fail")
    documents, _ = corpus.split_validation(documents, 0.1, "tail")
    tokenizer = SimpleNamespace(value=bpe.train([path.read_text()], 300, 2).to_str())
    encode = encode_task([encode_tasks(pieces, scans, documents)], tokenizer, f"file://{tmp_path}/tokens")

    corpus.check_unchanged(documents, encode(0))
    with path.open("a") as grown:
        grown.write("All:\nSpeak, speak.\n")
    corpus.check_unchanged(documents, encode(0))
    path.write_text("A line an editor saved meanwhile.\n" * 30)
    with pytest.raises(corpus.CorpusChanged, match=rf"corpus file file://{path} changed while tokenize read it"):
        corpus.check_unchanged(documents, encode(0))
