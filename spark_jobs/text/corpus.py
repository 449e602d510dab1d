"""Corpus files for the tokenize stage: byte pieces cut at line ends, the UTF-8/binary check, the
train/validation boundary and the driver's tokenizer-training sample.

Each file is cut into pieces of about `piece_bytes` bytes, each cut placed just after a newline
(or, in a file without newlines nearby, at a UTF-8 character boundary), so every piece decodes on
its own and executors read and encode pieces in parallel.

Text is read as Python reads text files: a byte-order mark at the start of a file is dropped and
line ends become "\n" (Windows' "\r\n" and old Macs' "\r" alike), so a corpus mixing them teaches
the model one line end. Characters are counted in the text so read. No cut falls inside "\r\n".

The train/validation split (data.val_split) takes about `val_fraction` of the characters either
as whole files (`files`: a corpus of many small documents, where a tail of each would be shorter
than a window and lost) or as the last `val_fraction` of every file (`tail`: the boundary is
character int(n_chars * (1 - val_fraction)), nanoGPT's shakespeare split). `auto` takes whole
files when they can make up at least half the wanted share, else tails (and the tokenize stage
takes tails too when the whole files turn out too short for a window).
"""

from __future__ import annotations

import codecs
import hashlib
import posixpath
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import pairwise

from pipeline import lake
from pipeline.errors import PipelineError, name_some

MIN_PIECE_BYTES = 16 * 1024
MAX_PIECE_BYTES = 8 * 1024 * 1024
LOOKAHEAD_BYTES = 64 * 1024  # how far past a nominal cut we look for a newline


@dataclass(frozen=True)
class Piece:
    doc_id: int  # index of the file in the sorted corpus file list
    path: str  # file URI
    index: int  # order of the piece within its file
    start: int  # byte range [start, end)
    end: int


@dataclass(frozen=True)
class Scan:
    """What pass 1 learns of a piece."""

    doc_id: int
    index: int
    chars: int
    problem: str | None  # why the file cannot be used, with the byte offset


@dataclass(frozen=True)
class Document:
    """A usable corpus file."""

    doc_id: int
    path: str
    size: int  # bytes
    chars: int
    boundary: int  # first validation character: 0 for a validation file, chars for a training file


def check_size(sizes: list[int], block_size: int, val_fraction: float) -> None:
    """Stop a corpus too small for a window in either split before any Spark (or cluster) starts.
    A token is at least one byte and a character at most four, so these bounds never stop a corpus
    that the tokenize stage would accept; the stage checks exactly, on the tokens."""
    total, needed = sum(sizes), block_size + 1
    if total == 0:
        raise PipelineError(f"the corpus is empty: its {len(sizes)} file(s) hold no bytes")
    if total < needed:
        raise PipelineError(
            f"the corpus holds {total} bytes, so at most {total} tokens, and a window needs data.block_size + 1 = "
            f"{needed}; use more text or a smaller data.block_size"
        )
    val_tokens = int(4 * (val_fraction * total + 1))
    if val_tokens < needed:
        raise PipelineError(
            f"the corpus's validation part (data.val_fraction={val_fraction} of {total} bytes) holds at most "
            f"{val_tokens} tokens, and a window needs data.block_size + 1 = {needed}; use more text, a smaller "
            "data.block_size or a larger data.val_fraction"
        )


def check_fits(config, sizes: dict[str, int]) -> None:
    """check_size for the corpus files `sizes` ({URI: bytes}) under the config's window and split,
    and data.val_split=files for a corpus of one file (tokenize checks more files exactly)."""
    check_size(list(sizes.values()), config.data.block_size, config.data.val_fraction)
    if config.data.val_split == "files" and len(sizes) == 1:
        raise PipelineError(
            f"data.val_split=files: the corpus is one file ({next(iter(sizes))}), and validation would take it "
            "whole; use data.val_split=tail (or auto) or more files"
        )


def read_range(uri: str, start: int, length: int) -> bytes:
    fs, path = lake.filesystem(uri)
    with fs.open_input_file(path) as handle:
        return handle.read_at(length, start)


def piece_bytes(total_bytes: int, parallelism: int) -> int:
    """About two pieces per task slot, within [MIN_PIECE_BYTES, MAX_PIECE_BYTES]."""
    wanted = -(-total_bytes // max(1, 2 * parallelism))
    return max(MIN_PIECE_BYTES, min(MAX_PIECE_BYTES, wanted))


def snap_cut(nominal: int, following: bytes) -> int | None:
    """Where to cut near byte `nominal`, given the bytes from nominal - 1 on: just after the first
    newline at or after nominal - 1, else at the first UTF-8 character start at or after nominal;
    None when the file ends first."""
    newline = following.find(b"\n")
    if newline >= 0:
        return nominal - 1 + newline + 1
    for step, byte in enumerate(following[1:5]):
        if byte & 0xC0 != 0x80:  # not a continuation byte
            return nominal + step
    return None


def plan_pieces(files: list[tuple[str, int]], parallelism: int) -> list[Piece]:
    """Pieces of every (uri, size) file, read ahead at each nominal cut to place it."""
    target = piece_bytes(sum(size for _, size in files), parallelism)
    pieces = []
    for doc_id, (uri, size) in enumerate(files):
        count = max(1, -(-size // target))
        cuts = [0]
        for k in range(1, count):
            nominal = k * size // count
            if nominal <= cuts[-1]:
                continue
            cut = snap_cut(nominal, read_range(uri, nominal - 1, min(LOOKAHEAD_BYTES, size - nominal + 1)))
            if cut is not None and cuts[-1] < cut < size:
                cuts.append(cut)
        cuts.append(size)
        pieces += [Piece(doc_id, uri, index, start, end) for index, (start, end) in enumerate(pairwise(cuts))]
    return pieces


def pack(items: list, size_of, target: int) -> list[list]:
    """Consecutive items in groups of about `target` bytes, one Spark task each: a small file's
    pieces share a task (and a part file) with their neighbours, so thousands of small files do not
    mean thousands of tasks in every stage."""
    groups: list[list] = []
    size = 0
    for item in items:
        if not groups or (groups[-1] and size + size_of(item) > target):
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += size_of(item)
    return groups


def piece_size(piece: Piece) -> int:
    return piece.end - piece.start


UTF16_MARKS = (b"\xff\xfe", b"\xfe\xff")
COMPRESSED = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"PK\x03\x04": "zip",
}


def normalize_text(text: str, file_start: bool) -> str:
    """A piece's text as the pipeline reads it (see the module docstring); file_start: the piece
    starts its file."""
    if file_start and text.startswith("\ufeff"):
        text = text[1:]
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def read_piece_text(uri: str, start: int, length: int) -> str:
    """The normalized text of a piece: whole UTF-8 characters from byte `start` of the file."""
    return normalize_text(read_range(uri, start, length).decode("utf-8"), start == 0)


def check_text(data: bytes, offset: int = 0) -> tuple[int, str | None]:
    """(characters once normalized, problem) of a piece's bytes that start at byte `offset` of their file."""
    if offset == 0:
        for magic, kind in COMPRESSED.items():
            if data.startswith(magic) and (kind != "bzip2" or data[3:4].isdigit()):
                return 0, f"is a {kind} archive, not text (decompress it first)"
        if data.startswith(UTF16_MARKS):  # what Windows calls Unicode
            return 0, "is UTF-16 text, not UTF-8 (convert it first: iconv -f UTF-16 -t UTF-8)"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        return 0, (
            f"is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {offset + error.start}); convert it "
            "first, from its encoding (iconv -f WINDOWS-1252 -t UTF-8 for most Western European text)"
        )
    nul = data.find(b"\x00")
    if nul >= 0:
        return len(text), f"looks binary (NUL byte at offset {offset + nul})"
    return len(normalize_text(text, offset == 0)), None


def scan_piece(piece: Piece) -> Scan:
    chars, problem = check_text(read_range(piece.path, piece.start, piece.end - piece.start), piece.start)
    return Scan(piece.doc_id, piece.index, chars, problem)


def scan_pieces(pieces: list[Piece]) -> list[Scan]:
    return [scan_piece(piece) for piece in pieces]


def split_boundary(n_chars: int, val_fraction: float) -> int:
    """Index of the first validation character of a file of n_chars characters."""
    return int(n_chars * (1 - val_fraction))


def validation_files(documents: list[Document], val_fraction: float) -> set[int]:
    """doc_ids of whole files for validation: in an order fixed by a hash of each file's name (so
    neither the first nor the last files in name order), every file that still fits within
    val_fraction of the corpus's characters."""
    wanted = val_fraction * sum(doc.chars for doc in documents)
    order = sorted(
        documents, key=lambda doc: (hashlib.sha256(posixpath.basename(doc.path).encode()).digest(), doc.path)
    )
    chosen, chars = set(), 0
    for doc in order:
        if chars + doc.chars <= wanted:
            chosen.add(doc.doc_id)
            chars += doc.chars
    return chosen


def split_validation(documents: list[Document], val_fraction: float, val_split: str) -> tuple[list[Document], str]:
    """The documents with their validation boundary placed, and the split used ("files" or "tail");
    see the module docstring."""
    if val_split != "tail":
        chosen = validation_files(documents, val_fraction)
        total = sum(doc.chars for doc in documents)
        val_chars = sum(doc.chars for doc in documents if doc.doc_id in chosen)
        if val_chars >= val_fraction * total / 2:
            return [replace(doc, boundary=0 if doc.doc_id in chosen else doc.chars) for doc in documents], "files"
        if val_split == "files":
            smallest = min(doc.chars for doc in documents) / total
            raise PipelineError(
                f"data.val_split=files: whole files cannot make up data.val_fraction={val_fraction} of the corpus "
                f"(its smallest file holds {smallest:.1%} of the characters); use more, smaller files, a larger "
                "data.val_fraction or data.val_split=tail"
            )
    return [replace(doc, boundary=split_boundary(doc.chars, val_fraction)) for doc in documents], "tail"


def assess(
    files: list[tuple[str, int]], scans: list[Scan], *, bad_files: str
) -> tuple[list[Document], list[dict], list[str]]:
    """The usable documents (all training text until split_validation places their boundary), the
    skipped files ({path, reason}) and warnings. Raises PipelineError for a bad file when bad_files
    is 'fail', and for a corpus with no text left."""
    chars = [0] * len(files)
    problems: dict[int, str] = {}
    for scan in sorted(scans, key=lambda scan: (scan.doc_id, scan.index)):
        chars[scan.doc_id] += scan.chars
        if scan.problem and scan.doc_id not in problems:
            problems[scan.doc_id] = scan.problem
    documents, skipped, warnings = [], [], []
    for doc_id, (uri, size) in enumerate(files):
        if doc_id in problems:
            if bad_files == "fail":
                raise PipelineError(
                    f"corpus file {uri} {problems[doc_id]}; set data.bad_files=skip to leave such files out"
                )
            skipped.append({"path": uri, "reason": problems[doc_id]})
            warnings.append(f"skipping corpus file {uri}: it {problems[doc_id]} (data.bad_files=skip)")
        elif chars[doc_id] == 0:
            skipped.append({"path": uri, "reason": "empty"})
            warnings.append(f"skipping corpus file {uri}: it is empty")
        else:
            documents.append(Document(doc_id, uri, size, chars[doc_id], boundary=chars[doc_id]))
    if not documents:
        names = name_some([uri for uri, _ in files], shown=5)
        if all(item["reason"] == "empty" for item in skipped):
            raise PipelineError(
                f"corpus file {names} is empty" if len(files) == 1 else f"the corpus is empty: {names} hold no text"
            )
        raise PipelineError(f"the corpus has no usable text: every file is bad or empty ({names})")
    return documents, skipped, warnings


class CorpusChanged(RuntimeError):
    """A corpus file changed while the stage read it. Not bad input: a retry, once the file is
    written, reads it whole."""


def check_unchanged(documents: list[Document], rows: list[dict]) -> None:
    """The encoding read as many characters of each file as the scan did. A file rewritten in
    between (an editor's save, a sync) would give tokens of other text than the one the split and
    the counts were made from. A file that only grew is fine: its pieces end where they were cut."""
    encoded = Counter()
    for row in rows:
        encoded[row["doc_id"]] += row["chars"]
    changed = [doc.path for doc in documents if encoded[doc.doc_id] != doc.chars]
    if changed:
        raise CorpusChanged(
            f"corpus file {name_some(changed)} changed while tokenize read it; run the stage again once it is written"
        )


READ_THREADS = 16  # concurrent reads of the training sample: on S3 each file is a request


def training_sample(documents: list[Document], cap_bytes: int) -> list[str]:
    """The tokenizer's training text: every document's training part when they hold at most
    cap_bytes together, else a prefix of each training part proportional to its size."""
    train_bytes = [doc.size * doc.boundary // doc.chars for doc in documents]
    total = sum(train_bytes)
    # Under the cap: the whole file, cut at the boundary below. Over it: a proportional prefix.
    lengths = [
        (doc, doc.size if total <= cap_bytes else cap_bytes * size // total)
        for doc, size in zip(documents, train_bytes, strict=True)
    ]

    def read(item: tuple[Document, int]) -> str:
        doc, length = item
        text = codecs.getincrementaldecoder("utf-8")().decode(read_range(doc.path, 0, length), final=False)
        return normalize_text(text, file_start=True)[: doc.boundary]

    with ThreadPoolExecutor(READ_THREADS) as pool:
        return list(pool.map(read, [(doc, length) for doc, length in lengths if length > 0 and doc.boundary > 0]))
