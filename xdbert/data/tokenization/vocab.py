"""The BERT side: the language encoder's tokenizer, its positions, and the vocabulary hashes.

`model.encoder: random:<type>` gets a WordPiece vocabulary trained on the corpus (`train_wordpiece`);
a hub id or folder brings its own tokenizer (`load_encoder_tokenizer`). The shards' manifest records
`vocab_hash` and `clip_vocab_hash`, which later stages compare before reading the shards.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from xdbert.errors import PipelineError
from xdbert.hub import hub_request, source
from xdbert.random_encoder import RANDOM_PREFIX, random_default_config

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # the trained vocabulary's ids 0..4
_MARK = 0xF0000  # plane-15 private use: where a word's non-initial characters go during training


def _mark(word: str) -> str | None:
    """A word with every character but the first moved to the private-use planes.

    None (the word is left out of training) if it has a character at or above U+20000, which could
    not be moved (U+F0000 + c must stay a code point) or could be taken for a moved one.
    """
    if any(ord(c) >= 0x20000 for c in word):
        return None
    return word[0] + "".join(chr(_MARK + ord(c)) for c in word[1:])


def _unmark(token: str) -> str:
    """Back from `_mark`: a piece that starts inside a word becomes a "##" continuation piece."""
    plain = "".join(chr(ord(c) - _MARK) if ord(c) >= _MARK else c for c in token)
    return "##" + plain if ord(token[0]) >= _MARK else plain


def train_wordpiece(texts: Iterable[str], vocab_size: int, model_max_length: int):
    """A BERT-uncased WordPiece vocabulary trained on `texts`, as a transformers `BertTokenizer`.

    [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4; BERT's normalizer (lowercase, strip accents, CJK
    spacing, control characters) and pre-tokenizer (whitespace and punctuation). `save_pretrained`
    writes a folder that `BertTokenizerFast`/`AutoTokenizer.from_pretrained` load.

    The vocabulary is learned as `tokenizers`' WordPieceTrainer does (BPE merges, "##" pieces inside
    words), but deterministically: that trainer numbers its "##" pieces in hash-map order and breaks
    ties between equally frequent merges by those numbers, so two runs on the same text can give two
    vocabularies (huggingface/tokenizers#1794), and DVC would see a new `models/tokenizer` each time.
    Here a word's inner characters are moved to private-use code points instead of getting a "##"
    prefix; the plain BPE trainer numbers its alphabet in sorted order and is deterministic; the pieces
    are moved back and prefixed afterwards.
    """
    from transformers import BertTokenizer

    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()

    def marked_docs() -> Iterator[str]:
        for text in texts:
            words = (_mark(w) for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(text)))
            yield " ".join(w for w in words if w)

    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    bpe.train_from_iterator(marked_docs(), trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=BERT_SPECIALS,
                                                                show_progress=False))
    vocab = {(t if t in BERT_SPECIALS else _unmark(t)): i for t, i in bpe.get_vocab().items()}
    # Rebuilt through BertTokenizer so the saved folder is a standard BERT tokenizer, not a bare one.
    return BertTokenizer(vocab=vocab, do_lower_case=True, model_max_length=model_max_length)


def _from_hub(load: Callable[[str], Any], name: str, what: str) -> Any:
    """`load(name)` for a hub id or a local folder; offline, missing or unreadable -> one PipelineError."""
    try:
        with hub_request(what):
            return load(name)
    except PipelineError:
        raise
    except (OSError, ValueError) as e:
        raise PipelineError(f"could not load {what}: {e}") from e


# What a tokenizer folder needs: a fast tokenizer's file, or the WordPiece vocabulary one is built from.
# Without either, transformers builds a tokenizer of the special tokens alone, and every word reads as [UNK].
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")


def check_tokenizer_folder(folder: str | Path) -> None:
    """A local tokenizer folder holds its vocabulary (a hub id is left to its loader)."""
    folder = Path(folder)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise PipelineError(f"{folder} holds no vocabulary (neither {' nor '.join(TOKENIZER_FILES)}), so every word would "
                            "read as [UNK]: rerun the stage that writes it (`dvc repro`)")


def load_encoder_tokenizer(name: str):
    """`AutoTokenizer.from_pretrained(name)` (a hub id or a local folder); offline -> PipelineError."""
    from transformers import AutoTokenizer

    check_tokenizer_folder(name)
    tok = _from_hub(lambda n: AutoTokenizer.from_pretrained(source(n)), name, f"the tokenizer of the encoder `{name}`")
    if getattr(tok, "backend_tokenizer", None) is None:
        raise PipelineError(f"the tokenizer of the encoder `{name}` has no fast (Rust) backend; the pipeline needs one")
    return tok


def check_shared_vocabulary(encoder: str, family: str, tokenizer_dir) -> None:
    """A family's pretrained encoder reads the token shards, which `model.encoder`'s tokenizer wrote: the two
    vocabularies must be the same (BERT-uncased's and ELECTRA's are), id for id."""
    if encoder.startswith(RANDOM_PREFIX):
        return  # built on the trained vocabulary itself
    own = load_encoder_tokenizer(encoder).get_vocab()
    shards = load_encoder_tokenizer(str(tokenizer_dir)).get_vocab()
    if own != shards:
        raise PipelineError(f"family {family!r}'s encoder `{encoder}` has its own vocabulary ({len(own)} tokens), not the one "
                            f"the token shards were written with ({tokenizer_dir}, {len(shards)} tokens, from `model.encoder`): "
                            f"the study's families must share one WordPiece vocabulary")


def vocab_hash(vocab: dict[str, int]) -> str:
    """sha256 of a vocabulary in id order: two tokenizers with the same hash give the same ids."""
    items = sorted(vocab.items(), key=lambda kv: (kv[1], kv[0]))
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode("utf-8")).hexdigest()


def clip_vocab_hash(simple_tokenizer) -> str:
    """sha256 over CLIP's vocabulary and merges (open_clip SimpleTokenizer)."""
    merges = sorted(simple_tokenizer.bpe_ranks, key=simple_tokenizer.bpe_ranks.get)
    h = hashlib.sha256(vocab_hash(simple_tokenizer.encoder).encode())
    h.update(json.dumps(merges, ensure_ascii=False).encode("utf-8"))
    return h.hexdigest()


def check_positions(key: str, max_len: int, positions: int | None, encoder: str) -> None:
    """Param `key`, a sequence length, fits the `positions` of encoder `encoder` (None: nothing states a limit)."""
    if positions is not None and max_len > positions:
        raise PipelineError(f"`{key}` = {max_len} is above the {positions} positions of the encoder `{encoder}`; use at "
                            f"most {positions}")


def encoder_positions(encoder: str, encoder_config: dict | None = None, tokenizer=None) -> int | None:
    """How many positions the language encoder has (the upper bound of `tokenize.max_len`).

    `random:<model_type>`: `encoder_config.max_position_embeddings`, else the model type's default (both
    checked by `random_default_config`). Pretrained: its config's max_position_embeddings (a
    folder without config.json: the tokenizer's `model_max_length`). None when nothing states a limit.
    """
    if encoder.startswith(RANDOM_PREFIX):
        default = random_default_config(encoder, encoder_config)
        n = (encoder_config or {}).get("max_position_embeddings")
        return int(n) if n else getattr(default, "max_position_embeddings", None)
    limits = []
    if not Path(encoder).is_dir() or (Path(encoder) / "config.json").is_file():
        from transformers import AutoConfig

        config = _from_hub(lambda n: AutoConfig.from_pretrained(source(n)), encoder, f"the config of the encoder `{encoder}`")
        if getattr(config, "max_position_embeddings", None):
            limits.append(int(config.max_position_embeddings))
    if tokenizer is not None and 0 < getattr(tokenizer, "model_max_length", 0) < 10**9:
        limits.append(int(tokenizer.model_max_length))
    return min(limits) if limits else None
