"""XDBERT: distil visual knowledge from CLIP's text encoder into a language encoder, as a DVC pipeline."""
