"""The prune_runs task: with keep_runs set, remove the lake's older collected run folders of a
run's name and corpus (their records on S3 stay)."""

from __future__ import annotations

import logging

from include import locks
from include.promote import latest_run
from include.record import StoredRun
from pipeline import lake, run_folder

log = logging.getLogger(__name__)


def remove_old_runs(run_dir: str, hook) -> list[str]:
    """With keep_runs set, remove the lake's run folders of this run's name and corpus that collect
    finished, all but the newest keep_runs (this run among them), and return them. Runs without a report
    (unfinished, or being run again), runs of other names or corpora and folders it cannot read (logged) are
    left alone, and so is the run whose model the latest pointer names (s3.promote: if_better may
    keep an older one); records on S3 stay. A removal that stopped halfway (its folder holds
    REMOVING) is finished."""
    run = StoredRun(run_dir, hook)
    config = run_folder.read_config(run.uri, run.read)
    if config.keep_runs is None:
        return []
    others, unfinished_removals = [], []
    for folder in run.siblings():
        if folder.uri == run.uri:
            continue
        try:
            if folder.has(run_folder.REMOVING):
                unfinished_removals.append(folder)
            elif collected_lineage(folder) == (config.run_name, config.corpus):
                others.append((collected_at(folder), folder))
        except (OSError, ValueError, AttributeError) as error:  # another's folder must not stop this run's prune
            log.warning("keep_runs: left %s alone, it cannot be read: %s", folder.uri, error)
    others.sort(key=lambda item: item[0], reverse=True)
    old = [folder for _, folder in others[config.keep_runs - 1 :]]
    served = latest_run(config, hook)
    if served in [folder.name for folder in old]:
        log.info("keep_runs: kept %s, whose model the latest pointer names", served)
    removed = []
    for folder in [folder for folder in old if folder.name != served] + unfinished_removals:
        try:
            with locks.run_folder_held(folder.uri, "prune_runs"):
                remove_run_folder(folder)
            removed.append(folder.uri)
        except locks.InUse as error:  # being run again: no longer a collected run to prune
            log.warning("keep_runs: left %s alone: %s", folder.uri, error)
    return removed


def remove_run_folder(folder: StoredRun) -> None:
    """A REMOVING marker goes in first and out last, so that a removal that stops halfway is
    finished by the next one; the report and the stages' stats go first, so that a folder half
    removed never looks collected or its stages complete."""
    folder.write(run_folder.REMOVING, b"")
    markers = (*run_folder.REPORTS, f"{run_folder.STATS_FOLDER}/")
    files = [path for path in folder.files() if path != run_folder.REMOVING]
    first = [path for path in files if path.startswith(markers)]
    folder.remove(*first)
    folder.remove(*[path for path in files if path not in first])
    folder.remove(run_folder.REMOVING)
    if not folder.uri.startswith("s3://"):
        lake.delete(folder.uri)  # the folders left, empty


def collected_lineage(run: StoredRun) -> tuple[str, list[str]] | None:
    """The run name and corpus of a run folder collect finished (with a report), else None: the
    retrainings keep_runs counts share both (two corpora may share a default run name, input.txt's)."""
    if not (run.has(run_folder.REPORT_JSON) and run.has(run_folder.CONFIG_FILE)):
        return None
    config = run_folder.read_config_data(run.uri, run.read)  # of any version: it may not validate now
    return config.get("run_name"), config.get("corpus")


def collected_at(run: StoredRun) -> str:
    """When collect finished the run: its report's collected_at, or for a report without
    collected_at, its file's time."""
    report = run.read_json(run_folder.REPORT_JSON)
    if "collected_at" in report:
        return report["collected_at"]
    return run.modified(run_folder.REPORT_JSON).isoformat(timespec="microseconds")
