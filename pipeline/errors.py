BAD_INPUT_EXIT = 2  # a stage application's exit code for a PipelineError
SHOWN_CHARS = 200  # the most of a value that a message repeats


class PipelineError(Exception):
    """Bad input or an incomplete run folder: reported to the user as one clear line, exit code 2."""


def name_some(items: list[str], shown: int = 3, separator: str = ", ") -> str:
    """The first `shown` items for a message, then how many were left out: "a, b, c and 7 more"."""
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return separator.join(items[:shown]) + more


def cut(text: str, limit: int = SHOWN_CHARS) -> str:
    """text, or its first `limit` characters ending with '…' where longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shown(value, limit: int = SHOWN_CHARS) -> str:
    """A value as a message repeats it: its repr, cut to `limit` characters. A value pasted by
    mistake (a whole file into a form's field) then costs the message a line, not megabytes."""
    return cut(repr(value), limit)
