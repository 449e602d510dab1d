BAD_INPUT_EXIT = 2  # a stage application's exit code for a PipelineError


class PipelineError(Exception):
    """Bad input or an incomplete run folder: reported to the user as one clear line, exit code 2."""
