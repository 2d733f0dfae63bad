"""The entry point every `stages/*.py` script goes through."""
from __future__ import annotations

import errno
import sys
from pathlib import Path
from typing import Callable

from xdbert.errors import PipelineError

# A write that fails for lack of room: no space, a quota, a file-size limit. torch's writer reports it
# as a RuntimeError naming only "file write failed", so the text is matched too.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "File too large", "file write failed")


def disk_full(e: BaseException) -> bool:
    return getattr(e, "errno", None) in DISK_FULL_ERRNOS or any(t in str(e) for t in DISK_FULL_TEXTS)


def run(main: Callable[[], None], takes_arguments: bool = False) -> None:
    """Run a stage; a `PipelineError`, or a write that found the disk full, becomes one line on stderr
    and exit code 2. Outputs are written atomically (xdbert.io), so what was complete before stays.
    A stage that takes no arguments refuses any, which it would otherwise ignore; one that takes some
    checks them itself."""
    try:
        if not takes_arguments and len(sys.argv) > 1:
            raise PipelineError(f"usage: python stages/{Path(sys.argv[0]).name} (no arguments: it reads params.yaml); got {' '.join(sys.argv[1:])!r}")
        main()
    except PipelineError as e:
        print("error: " + " ".join(str(e).split()), file=sys.stderr)
        sys.exit(2)
    except (OSError, RuntimeError) as e:
        if not disk_full(e):
            raise
        where = f" while writing {e.filename}" if getattr(e, "filename", None) else ""
        print(f"error: the disk is full{where} ({' '.join(str(e).split())[:200]}); free space and rerun `dvc repro`: "
              "complete outputs were kept, and a killed run resumes from its last checkpoint", file=sys.stderr)
        sys.exit(2)
