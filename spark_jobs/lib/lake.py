"""The lake and the run folder: file I/O over file:// and s3:// URIs, and stage completion markers.

A run folder is {lake}/runs/{run_id}/. A stage is complete when its stats file
stats/{stage}.json exists: stages write their outputs first and that file last, and clear it
before they start, so a crashed stage never looks finished. Starting a stage also removes the
completion markers of the stages that read its outputs (spark_jobs.lib.stages), so they never
look finished with outputs made from older inputs; their other files stay until they run again.
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import shutil
import sys
import uuid
from pathlib import Path
from urllib.parse import quote

from pyarrow import fs as pafs

from spark_jobs.lib import stages
from spark_jobs.lib.config import PipelineConfig, is_glob
from spark_jobs.lib.errors import PipelineError

CONFIG_FILE = "config.json"
# The run's report, written by the collect task once every stage has completed.
REPORT_JSON = "report.json"
REPORT_TEXT = "report.md"
TOKENIZER_PATH = "tokenizer/tokenizer.json"  # tokenize's, read by window (packed) and train
MANIFEST_PATH = "tfrecords/manifest.json"  # export's, read by train
SAMPLES_PATH = "samples.txt"  # generate's, copied by collect
LOCAL_FILESYSTEM = pafs.LocalFileSystem()
COPY_CHUNK_BYTES = 8 * 2**20
S3_COPY_MAX_BYTES = 5 * 10**9  # S3's CopyObject copies at most 5 GB, and a move on S3 is one


class StageIncomplete(PipelineError):
    """A stage's input is missing because the stage that writes it has not completed."""


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of a URI. The project's URIs hold paths as they are, the way Hadoop
    (and so Spark) takes them: a space, '#' or 'é' in a file name is itself, never percent-encoded."""
    scheme, separator, path = uri.partition("://")
    if not separator:
        raise ValueError(f"not a URI: {uri!r}")
    if scheme == "file":
        return LOCAL_FILESYSTEM, path
    # pyarrow parses the URI, so it gets the path percent-encoded and returns it decoded.
    # AWS_ENDPOINT_URL (moto, LocalStack) is honoured by pyarrow's S3 client.
    return pafs.FileSystem.from_uri(f"{scheme}://{quote(path, safe='/')}")


def join(uri: str, *parts: str) -> str:
    return posixpath.join(uri.rstrip("/"), *parts)


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def read_bytes(uri: str) -> bytes:
    fs, path = filesystem(uri)
    try:
        with fs.open_input_stream(path) as stream:
            return stream.read()
    except FileNotFoundError:
        raise PipelineError(f"{uri} does not exist") from None


def read_text(uri: str) -> str:
    return read_bytes(uri).decode("utf-8")


def read_json(uri: str):
    return json.loads(read_text(uri))


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole file (an AtomicFile: readers never see half of it)."""
    with AtomicFile(uri) as file:
        file.stream.write(data)


class AtomicFile:
    """A file written to the lake whole or not at all: locally under a hidden temporary name (which
    Spark and readers of the folder ignore), renamed when committed; on S3 the object appears when
    its upload completes. An aborted file is deleted."""

    def __init__(self, uri: str):
        self.uri = uri
        self.fs, self.path = filesystem(uri)
        folder, name = posixpath.split(self.path)
        self.fs.create_dir(folder, recursive=True)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        self.target = posixpath.join(folder, f".{name}.tmp-{uuid.uuid4().hex}") if self.local else self.path
        self.stream = self.fs.open_output_stream(self.target)

    def commit(self) -> None:
        self.stream.close()
        if self.local:
            self.fs.move(self.target, self.path)

    def abort(self) -> None:
        if not self.stream.closed:
            try:
                self.stream.close()
            except OSError:  # e.g. the disk is full: what it holds goes anyway
                pass
        if self.fs.get_file_info(self.target).type == pafs.FileType.File:
            self.fs.delete_file(self.target)

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None:
            self.abort()
            return
        try:
            self.commit()
        except BaseException:  # a commit that fails (a full disk) leaves no temporary file either
            self.abort()
            raise


def move_file(fs: pafs.FileSystem, source: str, target: str) -> None:
    """Move a file within a filesystem: a rename locally; on S3 a server-side copy, or for a file
    past what S3 copies at once (a TFRecord shard of a large corpus), a streamed copy, which S3
    takes as a multipart upload of any size."""
    if isinstance(fs, pafs.S3FileSystem) and fs.get_file_info(source).size >= S3_COPY_MAX_BYTES:
        with fs.open_input_stream(source) as stream, fs.open_output_stream(target) as copy:
            shutil.copyfileobj(stream, copy, COPY_CHUNK_BYTES)
        fs.delete_file(source)
    else:
        fs.move(source, target)


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode("utf-8"))


def write_json(uri: str, value) -> None:
    write_text(uri, json.dumps(value, indent=2, sort_keys=True) + "\n")


def delete(uri: str) -> None:
    """Remove a file or a whole folder; nothing there is fine."""
    fs, path = filesystem(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif info.type == pafs.FileType.File:
        fs.delete_file(path)


def list_file_sizes(uri: str) -> dict[str, int]:
    """{URI: size in bytes} of every file below a folder, sorted, from one listing."""
    fs, path = filesystem(uri)
    if fs.get_file_info(path).type != pafs.FileType.Directory:
        return {}
    selector = pafs.FileSelector(path, recursive=True)
    base = uri.rstrip("/")
    return dict(
        sorted(
            (join(base, posixpath.relpath(info.path, path)), info.size)
            for info in fs.get_file_info(selector)
            if info.type == pafs.FileType.File
        )
    )


def list_files(uri: str) -> list[str]:
    """URIs of every file below a folder, sorted."""
    return list(list_file_sizes(uri))


def upload_dir(local_dir: str | Path, uri: str) -> None:
    local_dir = Path(local_dir)
    for file in sorted(local_dir.rglob("*")):
        if file.is_file():
            write_bytes(join(uri, file.relative_to(local_dir).as_posix()), file.read_bytes())


def download_file(uri: str, target: str | Path) -> Path:
    """Copy a file to local disk a chunk at a time: a TFRecord shard of gigabytes never sits whole in memory."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fs, path = filesystem(uri)
    try:
        with fs.open_input_stream(path) as stream, target.open("wb") as copy:
            shutil.copyfileobj(stream, copy, COPY_CHUNK_BYTES)
    except FileNotFoundError:
        raise PipelineError(f"{uri} does not exist") from None
    return target


def split_glob(pattern: str) -> tuple[str, list[str]]:
    """(the folder a pattern's glob starts in, the glob's components); (pattern, []) for no glob."""
    components = pattern.split("/")
    first_glob = next((index for index, name in enumerate(components) if is_glob(name)), None)
    if first_glob is None:
        return pattern, []
    return "/".join(components[:first_glob]), components[first_glob:]


def expand(pattern: str) -> dict[str, int]:
    """{URI: size in bytes} of the files matching a path, URI or glob, from one listing rather than
    a request per file (thousands of S3 objects). A folder stands for every file below it. Any
    path component may be a glob (`*`, `?`, `[…]`, each matching within one component), and `**`
    matches any number of folders: data/*/part-*.txt, s3://bucket/books/**/*.txt. Below a folder
    or a glob, names starting with '.' or '_' are hidden, as Hadoop and Spark take them (.DS_Store,
    .git/, _SUCCESS, .part-0.crc), unless the glob's own component starts so. A name holding a
    glob's characters ('Hamlet [1603].txt') is taken as it is when such a file or folder exists."""
    folder, globs = split_glob(pattern)
    if globs and exists(pattern):
        folder, globs = pattern, []
    fs, path = filesystem(folder)
    info = fs.get_file_info(path)
    if not globs and info.type == pafs.FileType.File:
        return {pattern: info.size}
    if info.type != pafs.FileType.Directory:
        return {}
    globs = globs or ["**"]
    recursive = len(globs) > 1 or "**" in globs
    wanted = lambda relative: matches(relative.split("/"), globs)  # noqa: E731
    if fs is LOCAL_FILESYSTEM:
        below = local_files_below(path, recursive, wanted)
    else:
        below = remote_files_below(fs, path, recursive, wanted)
    return dict(sorted((join(folder, relative), size) for relative, size in below.items()))


def remote_files_below(fs: pafs.FileSystem, path: str, recursive: bool, wanted) -> dict[str, int]:
    """{path relative to the folder: size in bytes} of the `wanted` files below an object store's folder."""
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=recursive))
    relative = {posixpath.relpath(info.path, path): info.size for info in infos if info.type == pafs.FileType.File}
    return {name: size for name, size in relative.items() if wanted(name)}


def local_files_below(path: str, recursive: bool, wanted) -> dict[str, int]:
    """{path relative to the folder: size in bytes} of the `wanted` files below a local folder.
    Links to folders are followed, except a link to a folder it is itself in, which would list
    the same files round and round under ever longer names. A wanted name that links to nothing
    is an error, not a file left out unnoticed."""
    files: dict[str, int] = {}

    def visit(folder: str, relative: str, real_folders: frozenset[str]) -> None:
        for entry in sorted(os.scandir(folder), key=lambda entry: entry.name):
            name = posixpath.join(relative, entry.name) if relative else entry.name
            if entry.is_dir():  # a link to a folder too
                real = os.path.realpath(entry.path)
                if recursive and real not in real_folders:
                    visit(entry.path, name, real_folders | {real})
            elif wanted(name):
                if not os.path.exists(entry.path):
                    raise FileNotFoundError(
                        f"{entry.path} is a link to {os.readlink(entry.path)}, which does not exist"
                    )
                if entry.is_file():
                    files[name] = entry.stat().st_size

    visit(path, "", frozenset([os.path.realpath(path)]))
    return files


def matches(names: list[str], globs: list[str]) -> bool:
    """Whether a relative path's components match the glob's, `**` standing for any number of
    them; a hidden name (see expand) only matches a component that starts the same way."""
    if not globs:
        return not names
    if globs[0] == "**":
        return any(matches(names[skip:], globs[1:]) for skip in range(len(names) + 1) if not hidden(names[:skip]))
    return (
        bool(names)
        and not hidden(names[:1], globs[0])
        and fnmatch.fnmatchcase(names[0], globs[0])
        and matches(names[1:], globs[1:])
    )


HIDDEN_PREFIXES = (".", "_")


def hidden(names: list[str], glob: str = "") -> bool:
    return not glob.startswith(HIDDEN_PREFIXES) and any(name.startswith(HIDDEN_PREFIXES) for name in names)


def corpus_files(config: PipelineConfig) -> dict[str, int]:
    """{URI: size in bytes} of every corpus file, sorted, or a PipelineError naming the pattern
    that matched nothing."""
    files: dict[str, int] = {}
    for pattern in config.corpus:
        try:
            matched = expand(pattern)
        except OSError as error:  # S3 unreachable or refusing, a folder that cannot be read, ...
            raise PipelineError(f"corpus {pattern} cannot be listed: {error}") from None
        if not matched:
            raise PipelineError(f"corpus {pattern} matches no file")
        files |= matched
    return without_second_names(dict(sorted(files.items())))


def without_second_names(files: dict[str, int]) -> dict[str, int]:
    """The files with each local file once: a file also reached through a link (or a hard link)
    would otherwise be read twice, its text in the training data twice. Of a file's names, the
    first that goes through no link is kept, else the first."""
    names_by_file: dict[object, list[str]] = {}
    for uri in files:
        names_by_file.setdefault(file_identity(uri), []).append(uri)
    kept = (min(names, key=goes_through_a_link) for names in names_by_file.values())
    return {uri: files[uri] for uri in sorted(kept)}


def file_identity(uri: str) -> object:
    """What the names of one file share: its device and inode on local disk, its URI on S3."""
    if not uri.startswith("file://"):
        return uri
    status = os.stat(filesystem(uri)[1])
    return status.st_dev, status.st_ino


def goes_through_a_link(uri: str) -> bool:
    if not uri.startswith("file://"):
        return False
    path = filesystem(uri)[1]
    return os.path.realpath(path) != path


def run_dir(config: PipelineConfig, run_id: str) -> str:
    return join(config.lake, "runs", safe_run_id(run_id))


def safe_run_id(run_id: str) -> str:
    """The run id as a folder name: Airflow run ids hold ':' and '+', which are awkward in paths and
    S3 keys, and a leading '.' would make a hidden folder, or with '..' the lake itself."""
    if not run_id:
        raise PipelineError("a run id must not be empty")
    safe = "".join(char if char.isalnum() or char in "-_." else "_" for char in run_id)
    return "_" + safe[1:] if safe.startswith(".") else safe


def create_run(config: PipelineConfig, run_id: str) -> str:
    """Make a run folder holding the resolved config, or update an existing one's: the stages
    whose outputs changed settings make stale are no longer complete, and its report goes. Returns its URI."""
    folder = run_dir(config, run_id)
    config_uri = join(folder, CONFIG_FILE)
    if exists(config_uri):
        for report in (REPORT_JSON, REPORT_TEXT):  # run again, it is no longer a collected run (prune_runs)
            delete(join(folder, report))
        changed = stages.changed_settings(json.loads(read_text(config_uri)), json.loads(config.to_json()))
        cleared = [name for stage in stages.stale_stages(list(changed)) for name in clear_stage(folder, stage)]
        if cleared:
            settings = ", ".join(f"{path}: {old!r} -> {new!r}" for path, (old, new) in changed.items())
            print(
                f"NOTE run folder {folder}: changed {settings}; stage(s) {', '.join(cleared)} no longer complete",
                file=sys.stderr,
                flush=True,
            )
    try:
        write_text(config_uri, config.to_json())
    except OSError as error:  # a lake in a read-only place, under a file, ...
        raise PipelineError(f"lake {config.lake}: cannot create the run folder {folder}: {error}") from None
    return folder


def stats_uri(run: str, stage: str) -> str:
    return join(run, "stats", f"{stage}.json")


def error_path(stage: str) -> str:
    """Where, in the run folder, a stage that stopped on an error leaves it (see stage.record_error)."""
    return f"errors/{stage}.json"


def progress_path(stage: str) -> str:
    """Where, in the run folder, a running stage reports how far it is (train does; the EMR target's
    task logs it while the step runs)."""
    return f"progress/{stage}.json"


def clear_stage(run: str, stage: str) -> list[str]:
    """Mark a stage and the stages that read its outputs as not complete, and remove the run's
    report, which no longer describes it; returns the stages that were complete."""
    cleared = [name for name in (stage, *stages.downstream(stage)) if exists(stats_uri(run, name))]
    for name in cleared:
        delete(stats_uri(run, name))
    for report in (REPORT_JSON, REPORT_TEXT):
        delete(join(run, report))
    return cleared


def complete_stage(run: str, stage: str, stats: dict) -> None:
    write_json(stats_uri(run, stage), stats)


def require_stage(run: str, stage: str) -> dict:
    """The stats of a completed stage, or StageIncomplete naming what to run first."""
    uri = stats_uri(run, stage)
    if not exists(uri):
        raise StageIncomplete(f"stage {stage!r} has not completed in run folder {run} ({uri} is missing): run it first")
    return read_json(uri)


def local_path(uri: str) -> str:
    """The filesystem path of a file:// URI (for libraries that only take paths)."""
    fs, path = filesystem(uri)
    if not isinstance(fs, pafs.LocalFileSystem):
        raise ValueError(f"{uri} is not on the local filesystem")
    return os.fspath(path)
