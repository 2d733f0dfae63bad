"""Adaptation speed: one optimizer step of the cross-modal model against a plain `BertForMaskedLM`.

Both take AdamW steps (forward, backward, clip, step) on the same batch of windows of the same length:

- xdbert:    `XDBertModel` with the adapt stage's losses (MLM + MATCH + CLIPTC), the CLIP text tower on
             `n_blocks` x 77 CLIP tokens per window and the cross layers; vocabulary logits only at targets.
- reference: transformers' `BertForMaskedLM` with the same encoder config and the same MLM labels (it
             computes logits at every position, as it does out of the box).

Sizes:
- `--sizes embedded` (default): params.yaml's model, max_len and n_blocks (the embedded profile), fp32 on CPU.
- `--sizes paper`: BERT-base (random weights, vocabulary 30,522), ViT-B-32's text tower, 2 cross layers,
  8 CLIP heads, max_len 512, 9 CLIP blocks; bf16 autocast when a GPU is present.

Reported: language tokens per second of both, the overhead ratio, model FLOPs per step (counted with
torch's FlopCounterMode) and, on a GPU, model FLOPs utilization and the projected time of one wiki103
epoch (~800 optimizer steps of 256 windows, the paper's figures) against the paper's 35 minutes on 8 V100s.

    python bench/adapt_speed.py [--sizes embedded|paper] [--batch 32] [--steps 5] [--threads 2] [--compile]

`--compile` runs both models through torch.compile (the adapt stage itself runs eagerly).

Writes bench/results/adapt_speed.md and .json.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import xdbert  # noqa: F401  (first: it fixes the CPU kernels and threads before torch and numpy load)
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoConfig, BertForMaskedLM

from xdbert import params, training
from xdbert.adaptation import masking
from xdbert.adaptation.settings import AdaptSettings
from xdbert.model.modeling import XDBertConfig, XDBertModel, locate
from xdbert.model.settings import ModelSettings
from xdbert.clip import clip_special_ids
from provenance import code_version, describe

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 77
WIKI103_WINDOWS = 800 * 256  # the paper: ~800 optimizer steps of 256 windows per wiki103 epoch
PAPER_EPOCH_MINUTES = 35     # the paper: one epoch on 8 V100s for BERT-base
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense, per GPU
# Training examples of the real tasks (the hubs' train splits; SWAG counts its 4 endings as 4 sequences).
PAPER_TRAIN_SIZES = {"rte": 2490, "mrpc": 3668, "stsb": 5749, "cola": 8551, "sst2": 67349, "qnli": 104743,
                     "qqp": 363846, "mnli": 392702, "swag": 73546 * 4, "read": 2834}


@contextlib.contextmanager
def profiled(on: bool, path: Path):
    """`--profile`: torch.profiler over the run's steps, its kernels by GPU time written to `path` (where an
    MFU goes: matmuls, attention, elementwise, copies). Profiling slows the steps it watches."""
    if not on:
        yield
        return
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        yield
    path.parent.mkdir(parents=True, exist_ok=True)
    averages = prof.key_averages()
    # by GPU time: where the kernels' time goes; by the host's own time: launches, copies and waits
    # (cudaStreamSynchronize, cudaGraphLaunch) that leave the GPU idle between kernels
    path.write_text(averages.table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70) + "\n"
                    + averages.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70),
                    encoding="utf-8")


def sizes(name: str) -> dict:
    if name == "paper":
        return {"encoder_config": {}, "vocab_size": 30522, "clip": "ViT-B-32", "clip_heads": 8, "max_len": 512, "n_blocks": 9}
    p = params.load(ROOT / "params.yaml")
    model, adapt = ModelSettings.from_params(p), AdaptSettings.from_params(p, "xdbert")
    return {"encoder_config": model.encoder_config, "vocab_size": p["tokenize"]["vocab_size"], "clip": model.clip,
            "clip_heads": adapt.clip_heads, "max_len": p["tokenize"]["max_len"], "n_blocks": p["tokenize"]["n_blocks"]}


def synthetic_batch(s: dict, batch: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Full windows of random tokens: [CLS] ... [SEP] and CLIP blocks filled to 75 content tokens each."""
    bert = torch.randint(1000, s["vocab_size"], (batch, s["max_len"]), generator=gen)
    bert[:, 0], bert[:, -1] = 101 % s["vocab_size"], 102 % s["vocab_size"]
    sot, eot = clip_special_ids(s["clip"])
    clip = torch.randint(1000, 40000, (batch, s["n_blocks"], CONTEXT), generator=gen)
    clip[..., 0], clip[..., -1] = sot, eot
    return {"bert_ids": bert, "bert_mask": torch.ones_like(bert), "clip_ids": clip}


def time_steps(model: torch.nn.Module, loss_of, steps: int, warmup: int, device: torch.device, bf16: bool) -> float:
    """Median seconds of one optimizer step (after `warmup` untimed steps)."""
    optimizer, _ = training.optimizer_and_schedule(model, 1e-4, 0.01, 0.0, steps + warmup)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    times = []
    for i in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with autocast:
            loss = loss_of(model)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def step_flops(model: torch.nn.Module, loss_of) -> int:
    """FLOPs of one forward and backward pass (matmuls and attention, as torch counts them)."""
    counter = FlopCounterMode(display=False)
    with counter:
        loss_of(model).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", choices=("embedded", "paper"), default="embedded")
    ap.add_argument("--batch", type=int, default=None, help="windows per step (default: 32 embedded, 32 paper)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="torch.compile both models")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = device.type == "cuda"
    s = sizes(args.sizes)
    batch_size = args.batch or 32
    gen = torch.Generator().manual_seed(0)
    sot, eot = clip_special_ids(s["clip"])
    raw = synthetic_batch(s, batch_size, gen)
    inputs = masking.adaptation_inputs(raw, ["mlm", "match", "cliptc"], gen, vocab_size=s["vocab_size"],
                                       special_ids=[0, 100, 101, 102, 103], mask_id=103 % s["vocab_size"], eot_id=eot)
    inputs = {**inputs, **locate(inputs, eot)}  # found on the host, as the adapt stage's batches are
    inputs = {k: v.to(device) for k, v in inputs.items()}

    torch.manual_seed(0)
    config = XDBertConfig(encoder="random:bert", encoder_config=dict(s["encoder_config"]), vocab_size=s["vocab_size"],
                          clip=s["clip"], clip_heads=s["clip_heads"], clip_blocks=s["n_blocks"], clip_eot_id=eot)
    xdbert = XDBertModel.build(config).to(device).train()
    bert_config = AutoConfig.for_model("bert", **{**s["encoder_config"], "vocab_size": s["vocab_size"]})
    reference = BertForMaskedLM(bert_config).to(device).train()

    def xdbert_loss(m):
        return m(**inputs)["loss"]

    def reference_loss(m):
        return m(input_ids=inputs["bert_ids"], attention_mask=inputs["bert_mask"], labels=inputs["mlm_labels"]).loss

    results = {}
    for name, model, loss_of in (("xdbert", xdbert, xdbert_loss), ("reference", reference, reference_loss)):
        flops = step_flops(model, loss_of)  # counted eagerly: compiled graphs hide their ops from the counter
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        timed = torch.compile(model) if args.compile else model
        seconds = time_steps(timed, loss_of, args.steps, args.warmup, device, bf16)
        results[name] = {"seconds_per_step": seconds, "tokens_per_second": batch_size * s["max_len"] / seconds,
                         "windows_per_second": batch_size / seconds, "flops_per_step": flops,
                         "parameters": sum(p.numel() for p in model.parameters()),
                         "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None}
        del timed
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(name, results[name], flush=True)
    overhead = results["xdbert"]["seconds_per_step"] / results["reference"]["seconds_per_step"]

    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else None
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if gpu and k in gpu), None)
    for r in results.values():
        r["achieved_tflops"] = r["flops_per_step"] / r["seconds_per_step"] / 1e12
        r["mfu"] = r["achieved_tflops"] / peak if peak else None
        r["wiki103_epoch_minutes"] = WIKI103_WINDOWS / r["windows_per_second"] / 60
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result = {
        **code_version(), "sizes": args.sizes, **s, "batch": batch_size, "steps_timed": args.steps, "device": gpu or "cpu",
        "precision": "bf16 autocast" if bf16 else "fp32", "compiled": args.compile, "threads": args.threads, "load_average_1min": load,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "xdbert": results["xdbert"], "reference": results["reference"], "overhead": overhead,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "adapt_speed.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")

    x, r = results["xdbert"], results["reference"]
    mfu = lambda v: f"{v:.1%}" if v is not None else "n/a (CPU)"
    gib = lambda r: f"{r['peak_memory_gib']:.1f} GiB" if r["peak_memory_gib"] is not None else "n/a (CPU)"
    md = f"""# Adaptation speed: XDBERT step vs BertForMaskedLM step

Sizes `{args.sizes}`: encoder {s['encoder_config'] or 'BERT-base'} (vocabulary {s['vocab_size']}), CLIP `{s['clip']}`,
max_len {s['max_len']}, {s['n_blocks']} CLIP blocks of 77, batch {batch_size} windows; {result['precision']}{', torch.compile' if args.compile else ', eager'} on
{result['device']} ({result['machine']}, {args.threads} threads, 1-minute load average {load:.2f}); median of {args.steps} steps.

| model | parameters | s/step | language tokens/s | model TFLOP/step | achieved TFLOP/s | MFU | peak GPU memory | one wiki103 epoch |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
| XDBERT (MLM+MATCH+CLIPTC, CLIP tower, 2 cross layers) | {x['parameters']:,} | {x['seconds_per_step']:.3f} | {x['tokens_per_second']:,.0f} | {x['flops_per_step'] / 1e12:.3f} | {x['achieved_tflops']:.2f} | {mfu(x['mfu'])} | {gib(x)} | {x['wiki103_epoch_minutes']:.1f} min |
| BertForMaskedLM (reference) | {r['parameters']:,} | {r['seconds_per_step']:.3f} | {r['tokens_per_second']:,.0f} | {r['flops_per_step'] / 1e12:.3f} | {r['achieved_tflops']:.2f} | {mfu(r['mfu'])} | {gib(r)} | {r['wiki103_epoch_minutes']:.1f} min |

**Overhead: {overhead:.2f}x** the reference's time per step (the CLIP tower on {s['n_blocks'] * 77} CLIP positions and
the cross layers come on top of the same encoder). One wiki103 epoch = {WIKI103_WINDOWS:,} windows (the paper's ~800
steps of 256); the paper took {PAPER_EPOCH_MINUTES} minutes on 8 V100s (goal on one H100: under 10 minutes).
Timings on a shared machine vary from run to run; rerun with `{shlex.join(['python', *sys.argv])}`.
{describe(result)}
"""
    (args.out / "adapt_speed.md").write_text(md, encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
