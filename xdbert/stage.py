"""The entry point every `stages/*.py` script goes through."""
from __future__ import annotations

import sys
from typing import Callable

from xdbert.errors import PipelineError


def run(main: Callable[[], None]) -> None:
    """Run a stage; a `PipelineError` becomes one line on stderr and exit code 2."""
    try:
        main()
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
