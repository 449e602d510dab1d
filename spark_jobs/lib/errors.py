class PipelineError(Exception):
    """Bad input or an incomplete run folder: reported to the user as one clear line, exit code 2."""
