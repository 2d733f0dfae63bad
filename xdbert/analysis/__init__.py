"""5. Analyses of the paper beyond the result tables: PWCCA of word embeddings (Table 2), the visually
grounded ratio of improved and worsened dev examples (Figure 4, Appendix D) and cross-attention maps
(Table 9) with a per-head alignment score (in the spirit of "What does BERT with vision look at?").

Each module holds its params section's settings (`PwccaSettings`, `AttentionSettings`; `GroundingSettings`
is in `grounding_settings`, apart from the analysis, whose comparison of two runs the mechanism study uses),
the computation and its report; `figure4` draws and writes Figure 4, and `cca` is the CCA and PWCCA math
alone, in numpy. The mechanism study (../shared/MECHANISM.md) has three modules
without params or paths: `representations`, what the probe reads (a CLIP tower's or an encoder's state of
each object word, with torch) and gate C's model-free baselines (corpus context counts, a bag-of-words
model); then two in numpy alone, `probe`, the representation probe, and `mechanism_stats`, its cells,
intervals and gates. `vicomte_probe` is the visual-knowledge probes' math (ViComTe's linear probe and
cloze, CoDa's correlations, a paired bootstrap over subjects; issue 56), also without params or paths; `probe_rows`
the probes study's rows and their loading, and `probes` the study itself and its results dict. The stages
`stages/pwcca.py`, `stages/grounding.py`, `stages/attention.py` and `stages/probes.py` load the inputs and call them.
"""
