"""Compare the stage outputs of two checkouts file by file, e.g. before and after a refactoring.

    python tools/compare_outputs.py OLD_ROOT NEW_ROOT [--rename OLD=NEW ...]

Every file under the output folders (data, models, results, reports, metrics, dvclive) is classed as:
- identical: the same bytes;
- renamed path only: the same once the given path renames are applied to the old file's text;
- volatile only: the same once wall-clock timings (JSON keys `seconds`, `*_seconds`, `mb_per_s`) and the
  reports' `commit:` stamp are set aside;
- DIFFERENT, or missing on one side.
Exit code 1 when anything is DIFFERENT or missing.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

OUTPUT_DIRS = ("data", "models", "results", "reports", "metrics", "dvclive")
VOLATILE_KEY = re.compile(r"^(seconds|.*_seconds|mb_per_s)$")
COMMIT_LINE = re.compile(rb"^.*\bcommit\b.*$", re.M)


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for d in OUTPUT_DIRS if (root / d).is_dir()
            for p in (root / d).rglob("*") if p.is_file()}


def rename(text: bytes, renames: list[tuple[str, str]]) -> bytes:
    for old, new in renames:
        text = text.replace(old.encode(), new.encode())
    return text


def without_volatile(path: str, data: bytes) -> bytes:
    if path.endswith(".json"):
        try:
            obj = json.loads(data)
        except ValueError:
            return data

        def strip(x):
            if isinstance(x, dict):
                return {k: strip(v) for k, v in x.items() if not VOLATILE_KEY.match(k)}
            if isinstance(x, list):
                return [strip(v) for v in x]
            return x
        return json.dumps(strip(obj), sort_keys=True).encode()
    if path.endswith(".md"):
        return COMMIT_LINE.sub(b"", data)
    return data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                    help="a path renamed between the two (applied to file paths and to text inside files)")
    args = ap.parse_args()
    renames = [tuple(r.split("=", 1)) for r in args.rename]
    old_files, new_files = files(args.old), files(args.new)
    to_new = {f: rename(f.encode(), renames).decode() for f in old_files}
    classes: dict[str, list[str]] = {"identical": [], "renamed path only": [], "volatile only": [],
                                     "DIFFERENT": [], "missing in new": [], "only in new": []}
    for old_name, new_name in sorted(to_new.items()):
        if new_name not in new_files:
            classes["missing in new"].append(old_name)
            continue
        a, b = (args.old / old_name).read_bytes(), (args.new / new_name).read_bytes()
        if a == b:
            classes["identical"].append(new_name)
        elif rename(a, renames) == b:
            classes["renamed path only"].append(new_name)
        elif without_volatile(new_name, rename(a, renames)) == without_volatile(new_name, b):
            classes["volatile only"].append(new_name)
        else:
            classes["DIFFERENT"].append(new_name)
    classes["only in new"] = sorted(new_files - set(to_new.values()))
    for name, members in classes.items():
        print(f"{name}: {len(members)} files")
        if name != "identical":
            for m in members:
                print(f"  {m}")
    return 1 if classes["DIFFERENT"] or classes["missing in new"] or classes["only in new"] else 0


if __name__ == "__main__":
    sys.exit(main())
