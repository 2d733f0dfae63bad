"""The `mechanism` params section: the embedded world where CLIP's stand-in knows facts the corpus never states
(issue 55, ../shared/MECHANISM.md, docs/mechanism.md).

Two readers see different parts of it, on purpose:
- `corpus_world(params)`: the language corpus reads `extra_objects` and `patterns` and nothing else, so its
  bytes cannot depend on the facts (their seed, their rates);
- `MechanismSettings.from_params(params)`: every other stage, the whole section checked.

With `enabled: false` (the paper profile) no stage builds the world: the captions, the CLIP stand-in, the
tasks and the reports are what they were before the study.
"""
from __future__ import annotations

from dataclasses import dataclass

from xdbert import params as P
from xdbert.data.caption_mix import attribute_words, caption_share
from xdbert.data.synthetic.words import EXTRA_OBJECTS, OBJECTS, PATTERNS, Noun
from xdbert.errors import PipelineError
from xdbert.paths import CLIP_TOWERS

NOFACTS = "nofacts"          # the adapt variant beside the twin tower (`adapt.clip_tower: nofacts`)
CAPTION_MLM = "caption_mlm"  # the caption-text control (`adapt.text: captions`): the facts read directly, the upper reference
CAPTION_MLM_NOFACTS = "caption_mlm_nofacts"  # its twin (`adapt.text: captions_nofacts`): rung R's null
DISTILL_KL = "distill_kl"    # rung T's control: MLM on the corpus, masked words pulled towards the tower's next token
DISTILL_KL_NOFACTS = "distill_kl_nofacts"  # the same beside the twin tower: rung T's null
DISTILL_COS = "distill_cos"  # rung T's other control: each token's state mapped onto the tower's state of it
DISTILL_COS_NOFACTS = "distill_cos_nofacts"
VIS = "vis"                  # the probe task, finetuned beside `tasks.names` when the study is on
VIS_SIZES = ("train", "f_plus", "f_zero", "t")
MECHANISM_KEYS = ("enabled", "extra_objects", "patterns", "seed", "n_train", "n_dev_captioned", "n_dev_uncaptioned",
                  "fact_share", "fact_rate", "after_object", "caption_frames", "caption_share", "vis", "models", "full_models",
                  "clip_towers", "control_task", "sentences", "bow_seeds", "replication", "gates")
GATE_KEYS = ("level", "n_boot", "exact_below", "n_perm", "n_flip", "lambda", "probe_layer", "alpha_a", "alpha_c",
             "alpha_d", "alpha_e", "m_accuracy", "alpha_r", "alpha_t")
PROBE_LAYERS = ("cross_input",)  # the layer the cross layers read: the encoder's last, the tower's after ln_final


def corpus_world(params: dict) -> tuple[list[Noun], tuple[str, ...]]:
    """(the objects the corpus draws its props from, its pattern words): `mechanism.extra_objects` and
    `mechanism.patterns`, the only keys of the section the corpus reads (every key of it checked)."""
    sec = P.section(params, "mechanism", MECHANISM_KEYS)
    get = P.getter(sec, "mechanism")
    n_extra = get("extra_objects")
    if not isinstance(n_extra, int) or isinstance(n_extra, bool) or not 0 <= n_extra <= len(EXTRA_OBJECTS):
        raise PipelineError(f"`mechanism.extra_objects` must be an integer from 0 to {len(EXTRA_OBJECTS)} (the new "
                            f"nouns of words.EXTRA_OBJECTS beside the {len(OBJECTS)} old ones); got {n_extra!r}")
    return OBJECTS + EXTRA_OBJECTS[:n_extra], attribute_words(params)


@dataclass(frozen=True)
class MechanismSettings:
    """The `mechanism` section, checked whole (every key whatever `enabled` says, so a bad value shows
    before the study is switched on)."""

    enabled: bool
    objects: tuple[Noun, ...]        # old objects first, then the new ones
    n_old: int
    patterns: tuple[str, ...]        # the attribute words: one per object is its fact
    seed: int                        # the facts' draw (0: the study; 1: D's replication; 100: the de-risk's)
    n_train: int                     # objects whose facts the `vis` task trains on
    n_dev_captioned: int             # held-out objects the captions speak of (F+)
    n_dev_uncaptioned: int           # held-out objects nobody speaks of (F0)
    fact_share: float                # captions about one captioned object; the rest are scenes
    fact_rate: float                 # fact captions that state the object's own attribute
    after_object: float              # fact captions with the attribute after the object (the rest: before it)
    caption_frames: int              # frames a side the fact captions are drawn from (world.FRAMES_AFTER, _BEFORE)
    caption_share: float             # the CLIP stand-in's training blocks that are caption blocks
    vis: dict[str, int]              # the probe task's sizes: train, f_plus, f_zero, t
    models: tuple[str, ...]          # adapt.family's encoders (baseline or adapt variants) finetuned on vis and control
    full_models: tuple[str, ...]     # whole cross-modal models (adapt variants) finetuned on vis and control
    clip_towers: tuple[str, ...]     # CLIP-T rows: pretrain_clip, pretrain_clip_nofacts
    control_task: str                # the fact-free task of gate D (a task of `tasks.names`)
    sentences: int                   # neutral sentences the representation probe averages over
    bow_seeds: tuple[int, ...]       # facts seeds the bag-of-words row is pooled over (gate C)
    replication: str                 # gate D: the results of the study rerun on facts seed 1; "" = not run
    gates: dict                      # the pre-registered thresholds (analysis.mechanism_stats)

    @classmethod
    def from_params(cls, params: dict) -> "MechanismSettings":
        objects, patterns = corpus_world(params)
        sec = P.section(params, "mechanism")
        get = P.getter(sec, "mechanism")
        enabled = P.flag(get("enabled"), "mechanism.enabled")
        counts = {k: P.positive(get(k), f"mechanism.{k}") for k in ("n_train", "n_dev_captioned", "n_dev_uncaptioned")}
        if enabled and sorted(patterns) != sorted(PATTERNS):  # the probe task `vis` is 4-way, labelled by position
            raise PipelineError(f"`mechanism.patterns` must list all four attribute words {', '.join(PATTERNS)} (in any "
                                f"order: a `vis` label is the word's position) with `mechanism.enabled: true`; got {list(patterns)!r}")
        if enabled and sum(counts.values()) != len(objects):
            raise PipelineError(f"`mechanism.n_train` + `mechanism.n_dev_captioned` + `mechanism.n_dev_uncaptioned` must "
                                f"be the {len(objects)} objects (44 old + `mechanism.extra_objects`); got {sum(counts.values())}")
        vis = get("vis")
        if not isinstance(vis, dict) or sorted(vis) != sorted(VIS_SIZES):
            raise PipelineError(f"`mechanism.vis` must map {', '.join(VIS_SIZES)} to sizes; got {vis!r}")
        # checked against the adapt variants where the finetuning plan is built
        names = {k: tuple(P.names(get(k), f"mechanism.{k}", "adapt variant names (or baseline)"))
                 for k in ("models", "full_models")}
        clip_towers = P.subset(get("clip_towers"), "mechanism.clip_towers", CLIP_TOWERS)
        if len(set(clip_towers)) != len(clip_towers):  # one CLIP-T row per tower
            raise PipelineError(f"`mechanism.clip_towers` lists a tower twice: {clip_towers}")
        control = get("control_task")
        if enabled and control not in P.get(P.section(params, "tasks"), "names", "tasks"):
            raise PipelineError(f"`mechanism.control_task` {control!r} must be a task of `tasks.names`, whose runs it reads")
        bow_seeds = get("bow_seeds")
        if not isinstance(bow_seeds, list) or not bow_seeds:
            raise PipelineError(f"`mechanism.bow_seeds` must be a non-empty list of facts seeds; got {bow_seeds!r}")
        bow_seeds = tuple(P.non_negative(s, "entry of `mechanism.bow_seeds`") for s in bow_seeds)
        if len(set(bow_seeds)) != len(bow_seeds):  # each seed's facts pooled once
            raise PipelineError(f"`mechanism.bow_seeds` lists a seed twice: {list(bow_seeds)}")
        gates = get("gates")
        if not isinstance(gates, dict) or sorted(gates) != sorted(GATE_KEYS):
            raise PipelineError(f"`mechanism.gates` must have exactly the keys {', '.join(GATE_KEYS)}; got "
                                f"{sorted(gates) if isinstance(gates, dict) else gates!r}")
        level = gates["level"]
        if not isinstance(level, float) or not 0 < level < 1:  # an interval's coverage: 0 and 1 give no interval
            raise PipelineError(f"`mechanism.gates.level` must be a number strictly between 0 and 1 (0.95: 95% intervals); "
                                f"got {level!r}")
        checked = {"level": level,
                   "lambda": P.positive(gates["lambda"], "mechanism.gates.lambda", float),
                   "probe_layer": P.choice(gates["probe_layer"], "mechanism.gates.probe_layer", PROBE_LAYERS),
                   **{k: P.positive(gates[k], f"mechanism.gates.{k}") for k in ("n_boot", "exact_below", "n_perm", "n_flip")},
                   **{k: P.fraction(gates[k], f"mechanism.gates.{k}")
                      for k in ("alpha_a", "alpha_c", "alpha_d", "alpha_e", "m_accuracy", "alpha_r", "alpha_t")}}
        return cls(
            enabled=enabled, objects=tuple(objects), n_old=len(OBJECTS), patterns=patterns,
            seed=P.non_negative(get("seed"), "mechanism.seed"), **counts,
            **{k: P.fraction(get(k), f"mechanism.{k}") for k in ("fact_share", "fact_rate", "after_object")},
            caption_frames=_caption_frames(get("caption_frames")),
            caption_share=caption_share(params),
            vis={k: P.positive(vis[k], f"mechanism.vis.{k}") for k in VIS_SIZES}, **names,
            clip_towers=tuple(clip_towers), control_task=P.nonempty_str(control, "mechanism.control_task"),
            sentences=P.positive(get("sentences"), "mechanism.sentences"),
            bow_seeds=bow_seeds,
            replication=_replication(get("replication")),
            gates={k: checked[k] for k in GATE_KEYS})

    def facts(self, seed: int | None = None):
        """The world's facts (`world.draw_facts`) for `seed` (default: `mechanism.seed`)."""
        from xdbert.data.synthetic.world import draw_facts

        try:
            # the words in `words.PATTERNS`' order, whatever order params list them in: a fact's label is its
            # index there (the `vis` task's label names)
            attributes = [w for w in PATTERNS if w in self.patterns]
            return draw_facts(list(self.objects), self.n_old, attributes, self.seed if seed is None else seed,
                              self.n_train, self.n_dev_captioned, self.n_dev_uncaptioned)
        except ValueError as e:
            raise PipelineError(f"`mechanism`: {e}") from e


def _caption_frames(value) -> int:
    from xdbert.data.synthetic.world import FRAMES_AFTER

    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= len(FRAMES_AFTER):
        raise PipelineError(f"`mechanism.caption_frames` must be an integer from 1 to {len(FRAMES_AFTER)} (the fact "
                            f"captions' frames on each side of the object); got {value!r}")
    return value


def _replication(value) -> str:
    if not isinstance(value, str):
        raise PipelineError(f"`mechanism.replication` must be the path of a results/mechanism.json of the study on facts "
                            f"seed 1, or \"\" (not run); got {value!r}")
    return value


def study_on(params: dict) -> bool:
    """`mechanism.enabled`, checked (the tasks and finetuning stages add `vis` when it is on)."""
    return P.flag(P.get(P.section(params, "mechanism"), "enabled", "mechanism"), "mechanism.enabled")
