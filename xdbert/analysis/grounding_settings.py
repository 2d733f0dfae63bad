"""The `grounding` section, checked, with the predictions it compares present: apart from the analysis
(xdbert.analysis.grounding), whose comparison of two runs the mechanism study uses without reading this section."""
from __future__ import annotations

from dataclasses import dataclass

from xdbert import params as P
from xdbert.analysis.grounding import TASK_TITLES
from xdbert.data.tasks.names import task_names
from xdbert.errors import PipelineError
from xdbert.finetuning.control.runs import run_name
from xdbert.model.families import ablation_family
from xdbert.paths import FINETUNE, PREDICTIONS, predictions


# Every key of the section, the caption keys (xdbert.data.captions) too: a typo among them is refused
GROUNDING_KEYS = ("tasks", "baseline", "model", "threshold", "captions", "captions_hub_split", "captions_hub_column",
                  "n_captions", "seed", "stopwords", "examples_task", "examples_per_class")


@dataclass(frozen=True)
class GroundingSettings:
    """The `grounding` params section, checked, with the predictions it compares present.

    The caption corpus is the `captions` stage's (xdbert.data.captions reads the section's caption keys);
    the grounding stage reads its word counts. `stopwords` empty or absent: the shipped NLTK English list.
    """

    tasks: tuple[str, ...]
    baseline: str             # the runs compared, `<adapt.family>/<grounding.baseline>`
    model: str                # and `<adapt.family>/<grounding.model>`
    threshold: int
    stopwords: str | None
    examples_task: str
    examples_per_class: int

    @classmethod
    def from_params(cls, params: dict, files: bool = True) -> "GroundingSettings":
        """`files`: also check that the predictions it compares exist (False: the values only, as `xdbert check`)."""
        sec = P.section(params, "grounding", GROUNDING_KEYS)
        get = P.getter(sec, "grounding")

        # the tasks the study finetunes (a task outside `tasks.names` has no predictions to compare)
        tasks = P.subset(get("tasks"), "grounding.tasks", [t for t in task_names(params) if t in TASK_TITLES])
        threshold = P.positive(get("threshold"), "grounding.threshold")
        examples_per_class = P.positive(get("examples_per_class"), "grounding.examples_per_class")
        examples_task = P.choice(get("examples_task"), "grounding.examples_task", tasks)
        # the runs of `adapt.family` (as Table 3's ablations): results/finetune/<task>/<family>/<model>
        family = ablation_family(params).name
        baseline, model = (run_name("encoder", P.nonempty_str(get(key), f"grounding.{key}"), family) for key in ("baseline", "model"))
        if baseline == model:
            raise PipelineError(f"`grounding.baseline` and `grounding.model` both name {get('model')!r}: Figure 4 compares "
                                f"two finetuned models (the paper: baseline and xdbert)")
        stopwords = sec.get("stopwords")
        if stopwords is not None and not isinstance(stopwords, str):
            raise PipelineError(f'`grounding.stopwords` must be a stopword file, or "" for the shipped NLTK English list; got {stopwords!r}')
        settings = cls(tuple(tasks), baseline, model, threshold, stopwords or None, examples_task, examples_per_class)
        if files:
            settings.check_files()
        return settings

    def check_files(self) -> None:
        """The predictions of both runs compared are there."""
        family = self.baseline.split("/", 1)[0]  # run names are <family>/<model>; a family's name has no slash
        for key, run in (("baseline", self.baseline), ("model", self.model)):
            for task in self.tasks:
                if not predictions(task, run).is_file():
                    written = sorted(p.parent.name for p in (FINETUNE / task / family).glob(f"*/{PREDICTIONS}"))
                    raise PipelineError(f"missing {predictions(task, run)}: `grounding.{key}` names a run the finetune "
                                        f"stage did not write for `{task}`; runs of {family} there: "
                                        f"{', '.join(written) or 'none yet (`dvc repro finetune`)'}")

    @property
    def names(self) -> tuple[str, str]:
        """(baseline, model): the two runs compared."""
        return self.baseline, self.model
