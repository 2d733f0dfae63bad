"""What decides float results on a CPU, fixed before torch is imported, so a commit writes the same bytes
on every x86-64 machine: the kernels' instruction set and the threads per process.

torch (ATen), MKL and oneDNN each pick their kernels by the CPU's instruction set, and AVX-512 kernels sum
in another order than AVX2 ones: the same commit wrote other models on AMD EPYC family 26 (AVX-512) than on
family 23 (AVX2). Capping all three at AVX2, which every x86-64 CPU of the last decade has, made family 26
write family 23's bytes, and cost no speed there (docs/notebook/embedded-profile.md). MKL's cap is
`MKL_ENABLE_INSTRUCTIONS`; its `MKL_CBWR` reproducibility mode gave yet another result and is not used.

numpy and scipy bring their own OpenBLAS, which picks its kernels by CPU model: on family 25 the SkylakeX
ones, on family 23 the Zen ones (Haswell's), on a CPU it does not know a fallback chosen by features.
Every float64 dot product and matrix product of the analyses and metrics (PWCCA's SVDs, Pearson's r) goes
through it, and the last bits differ between those kernels. `OPENBLAS_CORETYPE=Haswell` is its AVX2 cap.

The caps do not make MKL pick the same GEMM kernel on every vendor: on AMD Zen it runs a Zen kernel, on
an Intel CPU Intel's AVX2 one, and the two sum in another order. xdbert/mkl_dispatch.c gives MKL AMD
Zen's answers to its two questions about the CPU, so an Intel Xeon writes the bytes AMD EPYCs write; it
is loaded here, before torch, where the install built it.

The number of threads decides how a sum is split, so it changes the bytes too (the cross-machine check in
tests/test_reproducibility.py gives three results for 1, 2 and 4 threads): every process computes with
`THREADS` threads, whatever the machine has, and a finetuning run with one (xdbert.finetuning.control.grid).

`import xdbert` applies all of this, so every stage, test and benchmark runs with it; torch reads the
thread count, and its MKL finds its answers, when torch is imported, so `xdbert` must be imported first
(the grid's Ray workers import it by a setup hook: xdbert.finetuning.control.engine). The values are set, not defaulted:
a shell that exported others would change the bytes silently. The caps are x86-64 instruction sets, so
they are set on x86-64 only: an ARM OpenBLAS told to use Haswell's kernels would fall back to generic ones.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import platform
import sys

CPU_KERNEL_CAPS = {
    "ATEN_CPU_CAPABILITY": "avx2",      # torch's own vectorised kernels (softmax, GELU, LayerNorm, ...)
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # MKL's GEMMs (every Linear layer)
    "ONEDNN_MAX_CPU_ISA": "AVX2",       # oneDNN primitives
    "OPENBLAS_CORETYPE": "Haswell",     # numpy's and scipy's BLAS and LAPACK (PWCCA, correlations)
}
X86_64 = platform.machine().lower() in ("x86_64", "amd64")  # where the caps mean something
THREADS = 2             # per process: the 2-core machines the embedded profile's dvc.lock was computed on
FINETUNING_THREADS = 1  # per finetuning run: the grid runs several one-thread runs side by side
THREAD_COUNTS = {"OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS)}
MKL_ZEN = False  # whether this process loaded xdbert/mkl_dispatch.c's library before torch


def fix_cpu_numerics() -> None:
    """Set the caps (on x86-64) and thread counts in this process's environment; child processes inherit
    them, and take MKL's AMD Zen kernels as every process that imports xdbert does."""
    if X86_64:
        os.environ.update(CPU_KERNEL_CAPS)
        take_mkl_zen_path()
    os.environ.update(THREAD_COUNTS)


def mkl_library() -> str | None:
    """The library the install built from xdbert/mkl_dispatch.c (None without a C compiler)."""
    spec = importlib.util.find_spec("xdbert._mkl_dispatch")
    return spec.origin if spec is not None else None


def take_mkl_zen_path() -> bool:
    """Load xdbert/mkl_dispatch.c's library with its symbols global: torch, imported later, then finds
    them before MKL's own. Only before torch: once torch is loaded, MKL's own answers come first (a Ray
    worker that unpickled its actor's torch before xdbert ran Intel's kernels: xdbert.finetuning.control.engine).
    False where that was too late or the install could not build the library."""
    global MKL_ZEN
    library = mkl_library()
    if library is not None and "torch" not in sys.modules:
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
        MKL_ZEN = True
    return MKL_ZEN


def mkl_path() -> str:
    """Which of MKL's GEMM paths this process takes: "zen" (every vendor's: the library came before torch)
    or "vendor" (MKL's own choice: Intel's kernels on an Intel CPU)."""
    return "zen" if MKL_ZEN else "vendor"


def cpu_description() -> dict[str, str]:
    """The CPU this process runs on, as /proc/cpuinfo names it (empty where there is none), and the
    kernel level torch uses."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("vendor_id", "cpu family", "model", "model name") and key not in info:
                    info[key] = value.strip()
                if not line.strip() and info:
                    break
    except OSError:
        pass
    import torch

    info["torch capability"] = torch.backends.cpu.get_cpu_capability()
    info["mkl path"] = mkl_path()
    info["torch threads"] = str(torch.get_num_threads())
    return info
