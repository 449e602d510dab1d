BAD_INPUT_EXIT = 2  # a stage application's exit code for a PipelineError


class PipelineError(Exception):
    """Bad input or an incomplete run folder: reported to the user as one clear line, exit code 2."""


def name_some(items: list[str], shown: int = 3) -> str:
    """The first `shown` items for a message, then how many were left out: "a, b, c and 7 more"."""
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more
