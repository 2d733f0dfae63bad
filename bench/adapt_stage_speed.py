"""The `adapt` stage's own training loop at the paper's sizes, timed for N steps per family and variant.

Unlike bench/adapt_speed.py (one model step beside BertForMaskedLM), this runs what `dvc repro` runs for
`adapt@<family>`, `adapt_baseline@<family>` and `ablate@<variant>`: the paper profile's settings
(`AdaptSettings.from_params`), `build_xdbert`, the stage's `BatchMaker` (masking, MATCH negatives, CLIPTC
targets), token shards read through `open_shards`, and `xdbert.adaptation.loop.adapt` with its accelerate
set-up, precision (`auto`: bf16 on compute capability 8.0+), gradient accumulation and clipping. It stops
after `--warmup + --steps` optimizer steps (the loop's `stop_after`).

What differs from the stage, and why it does not change a step's cost: the GPU machine has no hub, so each
encoder is a local folder with its released config and random weights in the released key layout (what
`xdbert rehearse --sizes paper` mirrors), the CLIP tower is ViT-B-32's with random weights (GELU where
openai's weights have QuickGELU: the same matmuls), and the windows are random ids of full length
(wiki103's windows are full but a document's last).

Reported per (family, variant): median seconds per optimizer step after the warm-up (the first step pays
for compiling), model FLOPs per step (torch's FlopCounterMode on one micro-batch, times the micro-batches),
MFU against the GPU's dense bf16 peak, peak GPU memory, one wiki103 epoch (204,800 windows: the paper's
~800 steps of 256) in minutes, and the variant's whole adaptation (its epochs) in GPU-hours. Then a cost
table of the whole paper run per family: its adaptations plus its finetuning grid, the grid costed from a
measured finetuning MFU (`--finetune-mfu`, bench/finetune_share.py's; `--full-mfu` for the `full` runs) at
6 x parameters FLOPs per token.

Run it as the stage runs on a one-GPU machine, or under DDP with one process:

    python bench/adapt_stage_speed.py [--families bert-b,electra-b,electra-l] [--variants all] [--steps 4]
    torchrun --nproc_per_node 1 bench/adapt_stage_speed.py ...     # the DDP code path, one rank
    python bench/adapt_stage_speed.py --finetune-only --variants xdbert  # the models' sizes and the grid alone

`--sizes tiny` (the CPU check) shrinks the encoders as `xdbert rehearse --sizes tiny` does and the batch to
4 windows. Writes bench/results/adapt_stage_speed.md and .json (or under --out).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import xdbert  # noqa: F401  (first: it fixes the CPU kernels and threads before torch and numpy load)
import numpy as np
import torch
from accelerate import PartialState

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapt_speed import PAPER_TRAIN_SIZES, PEAK_BF16_TFLOPS, WIKI103_WINDOWS, profiled, step_flops  # noqa: E402
from provenance import code_version, describe  # noqa: E402

from xdbert import params as P  # noqa: E402
from xdbert.adaptation.loop import BatchMaker, adapt  # noqa: E402
from xdbert.adaptation.settings import AdaptSettings  # noqa: E402
from xdbert.clip import clip_special_ids  # noqa: E402
from xdbert.data import shards  # noqa: E402
from xdbert.mirror import write_encoder_weights  # noqa: E402
from xdbert.model.build import build_xdbert  # noqa: E402
from xdbert.model.clip_tower import CLIPTextTower  # noqa: E402
from xdbert.model.saving import save_clip_tower  # noqa: E402
from xdbert.model.families import ablation_family, family_names  # noqa: E402
from xdbert.model.settings import ModelSettings  # noqa: E402
from xdbert.profiles import values  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 30522  # bert-base-uncased's WordPiece, which ELECTRA shares
SPECIAL = {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}


def stand_in(model: ModelSettings, sizes: str, work: Path) -> ModelSettings:
    """The family's encoder as a local folder in its released layout (config, random weights), loaded as the
    hub snapshot would be (`from_pretrained`, the MLM head copied from the checkpoint where it has one)."""
    folder = work / "encoders" / model.encoder.replace("/", "--")
    if not (folder / "config.json").is_file():
        write_encoder_weights(folder, model.encoder, sizes, model.seed)
    # CLIP: random weights, since there are no openai weights offline (GELU instead of their QuickGELU: same FLOPs)
    return dataclasses.replace(model, encoder=str(folder), clip_pretrained="")


def write_shards(root: Path, windows: dict[str, int], max_len: int, n_blocks: int, eot: int, sot: int) -> None:
    """Full-length windows of random ids, written and described as the dual_tokenize stage does."""
    rng = np.random.default_rng(0)
    splits = {}
    for split, n in windows.items():
        bert = rng.integers(1000, VOCAB, (n, max_len), dtype=np.int64)
        bert[:, 0], bert[:, -1] = SPECIAL["cls"], SPECIAL["sep"]
        clip = rng.integers(1000, 40000, (n, n_blocks, 77), dtype=np.int64)
        clip[..., 0], clip[..., -1] = sot, eot
        writer = shards.ShardWriter(root, split, 4096, max_len, n_blocks, VOCAB)
        writer.add({"bert_ids": bert, "bert_len": np.full(n, max_len), "clip_ids": clip.reshape(n, -1),
                    "align_start": np.full((n, max_len), -1), "align_end": np.full((n, max_len), -1),
                    "doc_index": np.arange(n)})
        splits[split] = {"windows": n, "shards": writer.close()}
    manifest = shards.build_manifest(max_len=max_len, n_blocks=n_blocks, bert={"vocab_size": VOCAB},
                                     clip={"sot_id": sot, "eot_id": eot}, splits=splits)
    (root / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def measure(p: dict, family: str, variant: str, args, work: Path) -> dict:
    """One (family, variant): the stage's model, data and loop for warm-up + N steps."""
    released = ModelSettings.from_params(p, family)
    model = stand_in(released, args.sizes, work)
    s = AdaptSettings.from_params(p, variant)
    batch = args.batch or (4 if args.sizes == "tiny" else s.batch_size)
    micro = min(args.micro_batch or (2 if args.sizes == "tiny" else s.micro_batch_size), batch)
    s = dataclasses.replace(s, batch_size=batch, micro_batch_size=micro, compile=args.compile,
                            eval_windows=micro, checkpoint_every=10**9)
    max_len, n_blocks = p["tokenize"]["max_len"], p["tokenize"]["n_blocks"]
    sot, eot = clip_special_ids(model.clip)
    data = work / f"shards-{batch}"
    if not (data / "manifest.json").is_file():  # one set of windows for the runs of one batch size
        write_shards(data, {"train": (args.warmup + args.steps + 1) * batch, "valid": micro}, max_len, n_blocks, eot, sot)
    train, valid = shards.open_shards(data, "train"), shards.open_shards(data, "valid")
    clip_dir = work / "clip"
    if not clip_dir.is_dir():
        save_clip_tower(CLIPTextTower.build(model.clip, ""), clip_dir, model.clip)  # what pretrain_clip leaves
    xdbert = build_xdbert(model, s, vocab_size=VOCAB, clip_blocks=n_blocks, clip_eot_id=eot, splits=(train, valid),
                          clip_tower=clip_dir)
    make_batch = BatchMaker(s, n_blocks, vocab_size=VOCAB, special_ids=sorted(SPECIAL.values()),
                            mask_id=SPECIAL["mask"], eot_id=eot)
    sizes = {"family": family, "variant": variant, "encoder": released.encoder,
             "parameters": sum(t.numel() for t in xdbert.parameters()), "epochs": s.epochs,
             "matmul_parameters": {"encoder": matmul_parameters(xdbert.encoder), "full": matmul_parameters(xdbert)}}
    if args.finetune_only:  # the finetuning grid's projection needs the models' sizes alone
        print(json.dumps(sizes), flush=True)
        return sizes
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    one = {k: v.to(device) for k, v in make_batch(train[np.arange(micro)], torch.Generator().manual_seed(0)).items()}
    xdbert.to(device).train()
    # FLOPs do not depend on the dtype; bf16 keeps the counting pass's memory at the training step's
    with torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext():
        flops = step_flops(xdbert, lambda m: m(**one)["loss"]) * -(-batch // micro)
    del one
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    stamps, start = [], time.perf_counter()
    with profiled(args.profile, args.out / f"profile-{family}-{variant}.txt"), synced_warnings(args.sync_debug and device.type == "cuda"):
        metrics = adapt(xdbert, train, valid, make_batch, s, work / f"{family}-{variant}.pt",
                        log=lambda m, step: stamps.append(time.perf_counter()), stop_after=args.warmup + args.steps)
    steps = np.diff(stamps)[args.warmup - 1:]
    seconds = statistics.median(steps.tolist())
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else None
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if gpu and k in gpu), None)
    epoch_minutes = WIKI103_WINDOWS / batch * seconds / 60
    row = {**sizes, "batch": batch, "micro_batch": micro,
           "precision": metrics["precision"], "processes": metrics["processes"], "compiled": args.compile,
           "distributed": str(PartialState().distributed_type),  # MULTI_GPU (or MULTI_CPU) under torchrun: DDP
           "first_step_seconds": stamps[0] - start,  # with the loop's set-up and, compiled, the compiling
           "seconds_per_step": seconds, "steps_timed": len(steps), "flops_per_step": flops,
           "tflops": flops / seconds / 1e12, "mfu": flops / seconds / 1e12 / peak if peak else None,
           "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
           "wiki103_epoch_minutes": epoch_minutes,
           "adaptation_gpu_hours": epoch_minutes * s.epochs / 60, "first_mlm_loss": metrics.get("first_mlm_loss")}
    del xdbert
    if device.type == "cuda":
        torch.cuda.empty_cache()
    print(json.dumps(row), flush=True)
    return row


@contextlib.contextmanager
def synced_warnings(on: bool):
    """With `on`, every operation that makes the host wait for the GPU warns, once per line of code that
    called it: the set-up's and the loop's once-a-step reads, and any left in the model's forward."""
    if not on:
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(0)


def matmul_parameters(module: torch.nn.Module) -> int:
    """Parameters a token's forward pass multiplies with: all but embedding tables (6 FLOPs each per trained token)."""
    return sum(t.numel() for name, t in module.named_parameters() if "embedding" not in name)


# Real (non-padding) tokens of a GLUE-like training example, what the finetuning grid is costed at.
TOKENS_PER_EXAMPLE = 38.0


def finetune_tokens(p: dict, tokens_per_example: float = TOKENS_PER_EXAMPLE) -> dict[str, dict[str, float]]:
    """Real training tokens of the paper profile's finetuning grid, per family and model kind."""
    from xdbert.data.tasks.names import task_names
    from xdbert.data.tasks.registry import get_task
    from xdbert.finetuning.control.settings import FinetuneSettings

    out: dict[str, dict[str, float]] = {}
    for name in task_names(p):
        settings = FinetuneSettings.from_params(p, get_task(name))
        for run in settings.study.runs(name):
            tokens = PAPER_TRAIN_SIZES[name] * settings.epochs * len(settings.seeds_of(run)) * tokens_per_example
            kinds = out.setdefault(run.family or "clip", {})
            kinds[run.model_kind] = kinds.get(run.model_kind, 0.0) + tokens
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", choices=("paper", "tiny"), default="paper")
    ap.add_argument("--families", default="", help="comma-separated; default: every family of the paper profile")
    ap.add_argument("--variants", default="all", help="all (what the stages adapt: xdbert and baseline per family, "
                    "the ablations on adapt.family) or a comma-separated list")
    ap.add_argument("--steps", type=int, default=4, help="timed optimizer steps")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first (>= 1: compiling, cuDNN plans)")
    ap.add_argument("--batch", type=int, default=None, help="windows per step (default: the profile's)")
    ap.add_argument("--micro-batch", type=int, default=None, help="windows per forward pass (default: the profile's)")
    ap.add_argument("--compile", action="store_true", help="adapt.compile: torch.compile the training steps")
    ap.add_argument("--finetune-mfu", type=float, default=0.123, help="the grid's MFU for encoder and CLIP-T runs "
                    "(measured: 0.123, four compiled BERT-base runs sharing an H200 under MPS, each step recorded; "
                    "one run alone 0.091; bench/results/h200)")
    ap.add_argument("--full-mfu", type=float, default=0.063, help="the grid's MFU for `full` runs (measured: 0.063, "
                    "one compiled run of the whole cross-modal model on BERT-base, each step recorded, on an H200)")
    ap.add_argument("--tokens-per-example", type=float, default=TOKENS_PER_EXAMPLE, help="real tokens of a GLUE-like example")
    ap.add_argument("--finetune-only", action="store_true", help="no adaptation steps: build each model and write "
                    "the finetuning grid's projection alone (runs on a CPU)")
    ap.add_argument("--profile", action="store_true", help="write each run's kernels by GPU time (profile-*.txt)")
    ap.add_argument("--sync-debug", action="store_true", help="on a GPU, warn once at every line that makes the "
                    "host wait for the GPU (torch.cuda.set_sync_debug_mode; the warnings slow the steps)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    if args.warmup < 1 or args.steps < 1:
        ap.error("--warmup and --steps must be at least 1")
    p = values("paper")
    families = args.families.split(",") if args.families else family_names(p)
    ablated = ablation_family(p).name
    # Table 1's two adaptations of every family first, the ablations after them
    todo = [(f, v) for f in families for v in (P.PROPOSED, P.BASELINE)]
    todo += [(ablated, v) for v in P.variant_names(p) if ablated in families]
    if args.variants != "all":
        todo = [(f, v) for f, v in todo if v in args.variants.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family, variant in todo:
            same = same_step(p, family, variant, rows)
            if same:
                rows.append(same)
            else:
                torch.manual_seed(0)
                rows.append(measure(p, family, variant, args, Path(tmp)))
            write(args, p, rows)  # after every row: a run stopped by its time limit keeps what it measured


def same_step(p: dict, family: str, variant: str, rows: list[dict]) -> dict | None:
    """A variant that differs from one measured already only in its epochs (two_epochs, twenty_epochs) has the
    same step: its row is that one's, with its own epochs and GPU-hours, instead of a second measurement."""
    s = AdaptSettings.from_params(p, variant)
    for r in rows:
        if r["family"] == family and "seconds_per_step" in r and \
                dataclasses.replace(AdaptSettings.from_params(p, r["variant"]), epochs=s.epochs) == s:
            return {**r, "variant": variant, "epochs": s.epochs, "step_of": r["variant"],
                    "adaptation_gpu_hours": r["wiki103_epoch_minutes"] * s.epochs / 60}
    return None


def mfu(args, kind: str) -> float:
    """The finetuning MFU a run of `kind` is costed at: `full` runs have their own."""
    return args.full_mfu if kind == "full" else args.finetune_mfu


def write(args, p: dict, rows: list[dict]) -> None:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if gpu and k in gpu), PEAK_BF16_TFLOPS["H100"])
    families = sorted({r["family"] for r in rows}, key=[r["family"] for r in rows].index)
    tokens = finetune_tokens(p, args.tokens_per_example)
    cost = []
    for family in families:
        mine = [r for r in rows if r["family"] == family]
        sizes = next((r for r in mine if r["variant"] == P.PROPOSED), mine[0])["matmul_parameters"]
        kinds = tokens.get(family, {})
        hours = {kind: 6 * sizes[kind] * n / (mfu(args, kind) * peak * 1e12) / 3600 for kind, n in kinds.items()}
        timed = not args.finetune_only
        cost.append({"family": family, "adaptations": len(mine) if timed else None,
                     "finetune_gpu_hours": sum(hours.values()), "finetune_gpu_hours_by_kind": hours,
                     "finetune_tokens_by_kind": kinds, "matmul_parameters": sizes,
                     "adapt_gpu_hours": sum(r["adaptation_gpu_hours"] for r in mine) if timed else None})
    launcher = ["torchrun", "--nproc_per_node", os.environ["WORLD_SIZE"]] if "LOCAL_RANK" in os.environ else ["python"]
    result = {**code_version(), "command": shlex.join([*launcher, *sys.argv]), "device": gpu or "cpu", "torch": torch.__version__,
              "machine": f"{platform.processor() or platform.machine()}", "sizes": args.sizes, "rows": rows, "cost": cost,
              "finetune_mfu": args.finetune_mfu, "full_mfu": args.full_mfu, "tokens_per_example": args.tokens_per_example, "peak_tflops": peak}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "adapt_stage_speed.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    pct = lambda v: f"{v:.1%}" if v is not None else "n/a (CPU)"
    gib = lambda v: f"{v:.1f}" if v is not None else "n/a"
    title = "The paper run's finetuning cost per family" if args.finetune_only else "The adapt stage's loop"
    lines = [f"# {title}, {args.sizes} sizes, on {gpu or 'the CPU'}", "", f"`{result['command']}` (torch {torch.__version__}). {describe(result)}"]
    if not args.finetune_only:
        r0 = rows[0]
        lines += ["", f"{r0['processes']} process(es) ({r0['distributed']}), precision {r0['precision']}, "
                  f"{'compiled' if args.compile else 'eager'}; median of {args.steps} steps after {args.warmup} warm-up. "
                  f"One wiki103 epoch = {WIKI103_WINDOWS:,} windows.", "",
                  "| family | variant | parameters | windows/step (micro) | first step s | s/step | TFLOP/step | TFLOP/s "
                  "| MFU | peak GiB | wiki103 epoch | epochs | GPU-hours |", "|" + " --- |" * 13]
        lines += [f"| {r['family']} | {r['variant']} | {r['parameters']:,} | {r['batch']} ({r['micro_batch']}) | "
                  f"{r['first_step_seconds']:.1f} | {r['seconds_per_step']:.3f} | {r['flops_per_step'] / 1e12:.2f} | "
                  f"{r['tflops']:.2f} | {pct(r['mfu'])} | {gib(r['peak_memory_gib'])} | "
                  f"{r['wiki103_epoch_minutes']:.1f} min | {r['epochs']} | {r['adaptation_gpu_hours']:.2f} |" for r in rows]
        lines += [f"{r['variant']}: {r['step_of']}'s step, not measured twice." for r in rows if "step_of" in r]
    adapt_line = ("Adaptation: not measured (`--finetune-only`)." if args.finetune_only else
                  "Adaptation: the rows above (each variant's epochs).")
    lines += ["", f"## The whole paper run per family, GPU-hours ({gpu or 'projected for an H100'})", "",
              f"{adapt_line} Finetuning: the paper profile's grid (every run, seed and epoch over the real training sizes, "
              f"{args.tokens_per_example:g} real tokens an example) at 6 FLOPs per multiplying parameter and token, "
              f"{args.finetune_mfu:.1%} MFU of {peak:g} TFLOP/s for encoder runs (`--finetune-mfu`) and "
              f"{args.full_mfu:.1%} for `full` runs (`--full-mfu`; both measured rates of recorded runs), which count the whole cross-modal model per "
              f"token. CLIP-T's runs are not in a family.", "",
              "| family | adaptations | adaptation GPU-hours | finetuning: encoder runs | finetuning: `full` runs | total |",
              "|" + " --- |" * 6]
    for c in cost:
        a, f, by_kind = c["adapt_gpu_hours"], c["finetune_gpu_hours"], c["finetune_gpu_hours_by_kind"]
        total = "-" if a is None else f"{a + f:.1f}"
        lines.append(f"| {c['family']} | {c['adaptations'] or '-'} | {'-' if a is None else f'{a:.2f}'} | "
                     f"{by_kind.get('encoder', 0.0):.2f} | {by_kind.get('full', 0.0):.2f} | {total} |")
    md = "\n".join(lines) + "\n"
    (args.out / "adapt_stage_speed.md").write_text(md, encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
