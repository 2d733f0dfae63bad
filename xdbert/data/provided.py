"""Files a user provides by hand, because no hub serves them: CommonLit's train.csv, COCO's captions and
ViComTe's files (xdbert.data.vicomte).

The paper profile expects them under inputs/, in folders dvc.yaml declares as dependencies of the stages
that read them (inputs/commonlit of `tasks`, inputs/coco of `captions`, inputs/vicomte of `probes`), so replacing a
file reruns those stages. The first stage of the graph (`corpus`) checks that CommonLit's and COCO's are there
and readable (`files`), so a missing or wrong file stops the run in a second, before any download or training,
instead of hours in; ViComTe's, which the probes stage alone reads, that stage checks
(xdbert.data.probes.vicomte_files), so their settings stay out of every other stage's code. `xdbert fetch`
checks them all.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from xdbert.data import vicomte
from xdbert.errors import PipelineError

INPUTS = Path("inputs")
VICOMTE = "probes.vicomte_dir"  # the param of every ViComTe file
READ_COLUMNS = ("excerpt", "target")  # of Kaggle's commonlitreadabilityprize train.csv


def files(p: dict) -> list[tuple[str, Path]]:
    """(param, path) of CommonLit's and COCO's files, where params `p` expect a user to have put them in place
    (ViComTe's: xdbert.data.probes.vicomte_files). A section `p` lacks (a params file written for one stage)
    expects none: the stage that reads that section checks it."""
    tasks, grounding = p.get("tasks") or {}, p.get("grounding") or {}
    out = []
    if tasks.get("source") == "hub" and "read" in tasks.get("names", []) and str(tasks.get("read_path")).endswith(".csv"):
        out.append(("tasks.read_path", Path(tasks["read_path"])))
    if str(grounding.get("captions")).endswith(".json"):
        out.append(("grounding.captions", Path(grounding["captions"])))
    return out


def check_files(expected: list[tuple[str, Path]]) -> None:
    """Every (param, path) of `files` (and of xdbert.data.probes.vicomte_files) is there and in its format: one
    PipelineError naming the first that is not. A file outside inputs/ is read, with a note that DVC does not track it. ViComTe's files are read a
    relation at a time, as their checks span files (a subject's counts, a class of the word list); the CoDa templates
    alone."""
    relations, noted = set(), set()
    for key, path in expected:
        if key == "tasks.read_path":
            check_read_csv(path)
        elif key == VICOMTE:
            folder, name = found = vicomte.locate(path)
            if found not in relations and name == vicomte.CODA:
                vicomte.load_coda_templates(folder)
            elif found not in relations:
                vicomte.load_relation(folder, name)
            relations.add(found)
        else:
            read_coco_captions(path)
        if key not in noted and not path.resolve().is_relative_to(INPUTS.resolve()):
            noted.add(key)
            print(f"note: {path} (`{key}`) is outside {INPUTS}/, which DVC tracks: replacing it will not rerun "
                  f"the stages that read it")


def check_read_csv(path: Path) -> None:
    """Kaggle's CommonLit train.csv: the file exists, has the columns the task reads, and every row has an
    excerpt and a finite target. The whole file is read (about 2,800 rows, well under a second), so a cut-short
    download or a hand-edited row fails here, before the tasks stage downloads GLUE and SWAG."""
    import math

    if not path.is_file():
        raise PipelineError(f"missing {path} (`tasks.read_path`): download train.csv of the Kaggle competition "
                            f"commonlitreadabilityprize and put it there (docs/profiles.md)")
    where = f"{path} (`tasks.read_path`)"
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = csv.DictReader(f, strict=True)  # strict: a quoted field the file cuts off is an error
            missing = [c for c in READ_COLUMNS if c not in (rows.fieldnames or [])]
            if missing:
                raise PipelineError(f"{where} lacks columns {missing}; Kaggle's train.csv has id, url_legal, license, "
                                    f"excerpt, target, standard_error")
            for row in rows:
                try:
                    target = float(row["target"])
                except (TypeError, ValueError):
                    target = math.nan
                if not math.isfinite(target) or not (row["excerpt"] or "").strip():
                    raise PipelineError(f"{where}, the row ending on line {rows.line_num}: every row needs an excerpt "
                                        f"and a finite number as target; got excerpt {str(row['excerpt'])[:40]!r}, "
                                        f"target {row['target']!r}")
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise PipelineError(f"{where} is not a readable CSV file: {e}") from e


def read_coco_captions(path: str | Path) -> list[str]:
    """Captions from a file in the layout of COCO's `annotations/captions_train2017.json`."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"missing caption file {path} (`grounding.captions`): download MSCOCO's "
                            f"annotations_trainval2017.zip and give annotations/captions_train2017.json, or use `generated`")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        captions = [a["caption"] for a in data["annotations"]]
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise PipelineError(f"{path} is not a COCO captions file (a JSON object whose `annotations` entries have a "
                            f"`caption`): {e}") from e
    if not captions:
        raise PipelineError(f"{path} holds no captions")
    odd = next((c for c in captions if not isinstance(c, str)), None)
    if odd is not None:
        raise PipelineError(f"{path} is not a COCO captions file: every `caption` is a string; got {odd!r}")
    return captions
