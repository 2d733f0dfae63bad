"""Dual tokenization: the corpus as BERT WordPiece windows and the same text as CLIP BPE blocks.

One text, two tokenizers, aligned by character spans. One concern per module:

    cleaning.py   `clean_text`: CLIP's cleaning, once per document; both tokenizers read its output
    vocab.py      the BERT side: a WordPiece vocabulary trained on the corpus or a hub tokenizer, the
                  encoder's positions, the vocabulary hashes the shards' manifest records
    clip_bpe.py   the CLIP side: open_clip's BPE as a fast (Rust) tokenizer
    windows.py    the row layout: BERT windows, CLIP blocks and the alignment between them
    dual.py       `DualTokenizer`: documents to aligned windows in one process
    pool.py       `DualPool`: the same over a process pool, in document order
    saving.py     `save_tokenizer`: a tokenizer folder without how the tokenizer was loaded
    build.py      the `dual_tokenize` stage's work: settings, tokenizer, shards, validation, manifest

Speed (bench/tokenize_speed.py): documents go in chunks to a process pool of `tokenize.workers`, each
worker cleaning, tokenizing and laying out its chunk. Cleaning skips lines ftfy provably leaves alone
(`fix_text`); tokenization runs the Rust tokenizers on each distinct space-separated piece once
(`PieceMemo`); windows, blocks and alignment are numpy over the chunk.
"""
