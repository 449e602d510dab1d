"""Sliding windows over token sequences: the pure logic of the window stage.

A sequence is one corpus file's train or validation part. Its tokens are stored as ordered pieces
(rows of tokens/); windows are cut per sequence, as if the pieces were one array: a window that
starts in a piece may run into the pieces after it. For a sequence of n tokens, block size T and
stride S the window starts are 0, S, 2S, ... while start + T + 1 <= n, i.e.
floor((n - T - 1) / S) + 1 windows when n >= T + 1, else none. No window crosses from one
sequence into another, so none straddles the train/validation boundary or two files.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from pipeline.errors import PipelineError, name_some

SPLITS = ("train", "val")
PACKED = -1  # the doc_id of a split's one sequence when documents are packed


def as_ids(ids) -> np.ndarray:
    """Token ids as the planner keeps them: int32 arrays, 4 bytes an id against some 36 in a tuple
    of Python ints (the window stage's driver holds the first block_size ids of every piece)."""
    return np.asarray(ids, dtype=np.int32)


NO_IDS = as_ids(())


def window_count(n_tokens: int, block_size: int, stride: int) -> int:
    """Windows of block_size + 1 tokens, `stride` apart, in a sequence of n_tokens."""
    if n_tokens < block_size + 1:
        return 0
    return (n_tokens - block_size - 1) // stride + 1


def covered_tokens(n_tokens: int, block_size: int, stride: int) -> int:
    """Tokens of a sequence of n_tokens that lie in at least one of its windows."""
    n_windows = window_count(n_tokens, block_size, stride)
    return (n_windows - 1) * min(stride, block_size + 1) + block_size + 1 if n_windows else 0


def window_starts(n_tokens: int, block_size: int, stride: int) -> np.ndarray:
    return np.arange(window_count(n_tokens, block_size, stride), dtype=np.int64) * stride


def cut_windows(ids: np.ndarray, starts: np.ndarray, block_size: int) -> np.ndarray:
    """Windows [len(starts), block_size + 1] of ids beginning at `starts`."""
    return ids[starts[:, None] + np.arange(block_size + 1)]


@dataclass(frozen=True)
class PiecePlan:
    """The windows that start in one piece of a sequence."""

    first: int  # position in the piece of its first window start
    count: int  # windows starting in this piece
    offset: int  # position of the piece's first token in its sequence
    index: int  # index of the piece's first window among all windows of its split
    tail: np.ndarray  # the (up to block_size) tokens that follow the piece in its sequence
    append: tuple[int, ...] = ()  # tokens the sequence has after the piece's own: the separator, when packed

    def windows(self, ids: np.ndarray, block_size: int, stride: int, limit: int | None = None):
        """(window starts in the sequence, window indices in the split, windows) of this piece's ids,
        at most `limit` windows at a time."""
        sequence = np.concatenate([as_ids(ids), as_ids(self.append), as_ids(self.tail)])
        limit = limit or max(self.count, 1)
        for begin in range(0, self.count, limit):
            ks = np.arange(begin, min(begin + limit, self.count), dtype=np.int64)
            local = self.first + ks * stride
            yield self.offset + local, self.index + ks, cut_windows(sequence, local, block_size)


@dataclass(frozen=True)
class Piece:
    """What the planner needs to know of a tokens/ row."""

    doc_id: int
    split: str
    piece: int
    n_tokens: int
    head: np.ndarray  # its first block_size tokens (all of them when shorter): int32, 4 bytes an id


def with_separators(pieces: list[Piece], separator: int, block_size: int) -> tuple[list[Piece], set]:
    """The pieces as a packed split sees them: the last piece of each file's part of a split is one
    token (the separator) longer. Returns them and the keys of the pieces that end a part."""
    last: dict[tuple[int, str], int] = {}
    for item in pieces:
        last[(item.doc_id, item.split)] = max(item.piece, last.get((item.doc_id, item.split), item.piece))
    ends = {(doc_id, split, piece) for (doc_id, split), piece in last.items()}
    return [
        replace(item, n_tokens=item.n_tokens + 1, head=np.append(as_ids(item.head), separator)[:block_size])
        if (item.doc_id, item.split, item.piece) in ends
        else item
        for item in pieces
    ], ends


def following_tokens(ordered: list[Piece], position: int, block_size: int) -> np.ndarray:
    """The (up to block_size) tokens that follow piece `position` of a sequence, from the heads of
    the pieces after it. It reads only the pieces those tokens are in (counted by n_tokens, also
    when heads are left out), so that planning a sequence of many pieces (a packed split is one)
    takes time in proportion to them."""
    heads: list[np.ndarray] = [NO_IDS]
    wanted, following = block_size, position + 1
    while wanted > 0 and following < len(ordered):
        heads.append(as_ids(ordered[following].head[:wanted]))
        wanted -= ordered[following].n_tokens
        following += 1
    return np.concatenate(heads)


def plan_windows(
    pieces: list[Piece], block_size: int, stride: int, separator: int | None = None
) -> tuple[dict[tuple[int, str, int], PiecePlan], dict]:
    """Which windows each piece produces, and the counts: ({(doc_id, split, piece): PiecePlan},
    {"splits": {split: {"windows", "tokens", "covered_tokens", "sequences"}},
     "sequences": [{doc_id, split, tokens, windows}]}).
    A sequence is one file's part of a split; with a `separator` token (data.pack_documents) it is
    the whole split, every file's part followed by the separator (doc_id PACKED)."""
    ends: set = set()
    if separator is not None:
        pieces, ends = with_separators(pieces, separator, block_size)
    by_sequence: dict[tuple[int, str], list[Piece]] = defaultdict(list)
    for item in pieces:
        by_sequence[(item.doc_id if separator is None else PACKED, item.split)].append(item)
    plans: dict[tuple[int, str, int], PiecePlan] = {}
    next_index = dict.fromkeys(SPLITS, 0)
    totals = {split: {"windows": 0, "tokens": 0, "covered_tokens": 0, "sequences": 0} for split in SPLITS}
    sequences = []
    for doc_id, split in sorted(by_sequence, key=lambda key: (key[1], key[0])):
        ordered = sorted(by_sequence[(doc_id, split)], key=lambda item: (item.doc_id, item.piece))
        n_total = sum(item.n_tokens for item in ordered)
        n_windows = window_count(n_total, block_size, stride)
        offset = 0
        for position, item in enumerate(ordered):
            first_k = -(-offset // stride)
            end_k = min(n_windows, -(-(offset + item.n_tokens) // stride))
            count = max(0, end_k - first_k)
            key = (item.doc_id, split, item.piece)
            plans[key] = PiecePlan(
                first=first_k * stride - offset,
                count=count,
                offset=offset,
                index=next_index[split] + first_k if count else next_index[split],
                tail=following_tokens(ordered, position, block_size) if count else NO_IDS,
                append=(separator,) if key in ends else (),
            )
            offset += item.n_tokens
        next_index[split] += n_windows
        totals[split]["windows"] += n_windows
        totals[split]["tokens"] += n_total
        totals[split]["covered_tokens"] += covered_tokens(n_total, block_size, stride)
        totals[split]["sequences"] += 1
        sequences.append({"doc_id": doc_id, "split": split, "tokens": n_total, "windows": n_windows})
    return plans, {"splits": totals, "sequences": sequences}


PART_NAMES = {"train": "training part", "val": "validation part"}


def check_windows(
    counts: dict, block_size: int, stride: int, paths: dict[int, str], val_split: str = "tail"
) -> list[str]:
    """Stop with a message naming the file(s) when a split has no window at all; return warnings
    for files whose part of a split is too short to give one, and for a split whose windows leave
    much of its text unused. `val_split` is the split tokenize used (data.val_split)."""
    needed = block_size + 1
    for split in SPLITS:
        if counts["splits"].get(split, {}).get("windows", 0) == 0:
            parts = [seq for seq in counts["sequences"] if seq["split"] == split]
            longest = max(parts, key=lambda seq: seq["tokens"], default=None)
            packed = longest is not None and longest["doc_id"] == PACKED
            if longest is None or packed:
                where = "corpus"
            elif len(paths) == 1:
                where = f"corpus file {paths[longest['doc_id']]}"
            else:
                where = f"corpus ({len(paths)} files; longest {PART_NAMES[split]}: {paths[longest['doc_id']]})"
            have = longest["tokens"] if longest else 0
            remedies = ["more text", "a smaller data.block_size"]
            remedies += ["a larger data.val_fraction"] if split == "val" else []
            remedies += (
                ["data.val_split=tail (each file's last part)"] if split == "val" and val_split == "files" else []
            )
            remedies += (
                ["data.pack_documents=true (windows across files)"] if len(paths) > 1 and longest and not packed else []
            )
            raise PipelineError(
                f"{where} is shorter than one window: its {PART_NAMES[split]} has {have} tokens and a window needs "
                f"data.block_size + 1 = {needed}; use {', '.join(remedies[:-1])} or {remedies[-1]}"
            )
    warnings = [
        short_parts_warning(split, short, counts["splits"][split]["tokens"], needed, paths)
        for split in SPLITS
        if (short := [seq for seq in counts["sequences"] if seq["split"] == split and seq["windows"] == 0])
    ]
    return warnings + coverage_warnings(counts, block_size, stride)


def check_enough_windows(where: str, train_windows: int, val_windows: int, val_shards: int, config) -> None:
    """Training needs a batch's worth of windows. Validation needs only a window in every shard, so
    that every worker has some: a worker's validation batches repeat its windows to fill them, so a
    small corpus's few validation windows still measure the model. The window stage checks as soon
    as it has counted them, train again on export's manifest."""
    if train_windows < config.train.batch_size:
        raise PipelineError(
            f"{where}: the train split has {train_windows} windows, fewer than train.batch_size "
            f"{config.train.batch_size}; use a larger corpus or a smaller block size or batch"
        )
    if val_windows < val_shards:
        raise PipelineError(
            f"{where}: the val split has {val_windows} windows, fewer than its {val_shards} shards, so some "
            f"of the {config.train.num_workers} workers would have none; lower data.shards (a multiple of "
            "train.num_workers), or give validation more text (data.val_fraction) or shorter windows (data.block_size)"
        )


def coverage_warnings(counts: dict, block_size: int, stride: int) -> list[str]:
    """A warning per split whose windows cover much less of its tokens than long files would give:
    the tokens after each file's last window go unused, which adds up over many short files."""
    wanted = 0.9 * min(1.0, (block_size + 1) / stride)  # a stride past the window skips tokens on purpose
    warnings = []
    for split in SPLITS:
        totals = counts["splits"][split]
        share = totals["covered_tokens"] / totals["tokens"]
        if share < wanted:
            lengths = sorted(seq["tokens"] for seq in counts["sequences"] if seq["split"] == split)
            warnings.append(
                f"the {split} windows cover {share:.0%} of the {split} split's tokens: each file's tokens after its "
                f"last window go unused, and the files are short (median {lengths[len(lengths) // 2]:,} tokens, "
                f"windows of {block_size + 1}); a smaller data.stride or data.block_size, or data.pack_documents=true, "
                "uses more of them"
            )
    return warnings


def short_parts_warning(split: str, short: list[dict], split_tokens: int, needed: int, paths: dict[int, str]) -> str:
    """One warning for a split's file parts too short to give a window (a corpus of many small files
    would otherwise print one line per file)."""
    part = PART_NAMES[split]
    if len(short) == 1:
        seq = short[0]
        return (
            f"corpus file {paths[seq['doc_id']]}: its {part} has {seq['tokens']} tokens, fewer than one window "
            f"({needed}); it contributes no {split} window"
        )
    listed = name_some([f"{paths[seq['doc_id']]} ({seq['tokens']})" for seq in short])
    lost = sum(seq["tokens"] for seq in short)
    return (
        f"{len(short)} corpus files have a {part} of fewer tokens than one window ({needed}): {listed}; "
        f"their {lost:,} tokens ({lost / split_tokens:.1%} of the {split} split) give no {split} window "
        "(data.pack_documents=true would use them)"
    )
