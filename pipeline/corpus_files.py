"""Finding a corpus's files: paths, URIs, folders and globs expanded to files and their sizes
(local disk and S3), hidden names left out, and a file reached under two names read once."""

from __future__ import annotations

import fnmatch
import os
import posixpath

from pyarrow import fs as pafs

from pipeline import lake
from pipeline.config import PipelineConfig, is_glob
from pipeline.errors import PipelineError


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
    if globs and lake.exists(pattern):
        folder, globs = pattern, []
    fs, path = lake.filesystem(folder)
    info = fs.get_file_info(path)
    if not globs and info.type == pafs.FileType.File:
        return {pattern: info.size}
    if info.type != pafs.FileType.Directory:
        return {}
    globs = globs or ["**"]
    recursive = len(globs) > 1 or "**" in globs
    wanted = lambda relative: matches(relative.split("/"), globs)  # noqa: E731
    if fs is lake.LOCAL_FILESYSTEM:
        below = local_files_below(path, recursive, wanted)
    else:
        below = remote_files_below(fs, path, recursive, wanted)
    return dict(sorted((lake.join(folder, relative), size) for relative, size in below.items()))


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
    status = os.stat(lake.filesystem(uri)[1])
    return status.st_dev, status.st_ino


def goes_through_a_link(uri: str) -> bool:
    if not uri.startswith("file://"):
        return False
    path = lake.filesystem(uri)[1]
    return os.path.realpath(path) != path
