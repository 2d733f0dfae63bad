"""3. Pretraining stand-ins and adaptation.

`settings` (the `pretrain` and `adapt` sections, nothing heavy imported), `masking` (the targets of the
adaptation losses), `pretraining` (the embedded profile's stand-ins for a pretrained encoder and CLIP tower),
`loop` (the adaptation loop).
"""
