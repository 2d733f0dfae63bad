"""The one exception type a user is meant to read."""


class PipelineError(Exception):
    """A problem the user can fix. The message names what is wrong and what is allowed.

    Stages catch it at the top (see `xdbert.stage.run`), print it on one line and exit non-zero,
    so a bad param or a missing file never ends in a traceback or a half-written output.
    """
