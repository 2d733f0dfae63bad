"""XDBERT: distil visual knowledge from CLIP's text encoder into a language encoder, as a DVC pipeline."""
from xdbert.numerics import fix_cpu_numerics

fix_cpu_numerics()  # before anything imports torch: the same commit computes the same bytes on any x86-64 CPU
