"""Analyses of the paper beyond the result tables: PWCCA of word embeddings (Table 2), the visually
grounded ratio of improved and worsened dev examples (Figure 4, Appendix D) and cross-attention maps
(Table 9) with a per-head alignment score (in the spirit of "What does BERT with vision look at?").

The modules here are numpy/matplotlib code without any knowledge of the pipeline's files; the stages
`stages/pwcca.py`, `stages/grounding.py` and `stages/attention.py` read the inputs and call them.
"""
