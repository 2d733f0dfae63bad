"""Dual tokenization: cleaning, the fast CLIP BPE, windows, blocks, alignment and the `dual_tokenize` stage.

Every id the pipeline produces is compared with the reference tokenizers: transformers' tokenizer
called on the window text and open_clip's SimpleTokenizer.encode.
"""
from __future__ import annotations

import dataclasses
import io as stdio
import random
import re
import shutil
import subprocess
import sys
import unicodedata
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import ftfy
import ftfy.badness
import numpy as np
import pandas as pd
import pytest
import yaml
from open_clip.tokenizer import _clean_whitespace

from conftest import load_stage
from xdbert.data.tokenization.build import Settings
from xdbert.data.tokenization.cleaning import _BADNESS_REACH, _looks_bad, clean_text, fix_text
from xdbert.data.tokenization.clip_bpe import clip_fast_tokenizer
from xdbert.data.tokenization.dual import DualTokenizer
from xdbert.data.tokenization.pool import tokenize_docs
from xdbert.data.tokenization.vocab import (BERT_SPECIALS, check_positions, check_shared_vocabulary, encoder_positions,
                                            load_encoder_tokenizer, train_wordpiece, vocab_hash)
from xdbert.data.tokenization.windows import (Layout, alignment_problem, clip_blocks, clip_content,
                                              concat_windows)
from xdbert.errors import PipelineError
from xdbert.profiles import values

ROOT = Path(__file__).resolve().parents[1]
CLIP = "xdbert-tiny"

# Real-world English written for these tests: accents, curly and straight apostrophes, dashes,
# long words, parentheses, quotes, a URL and numbers such as 1,234.5.
REAL_TEXT = [
    "The café on Zürich’s Bahnhofstrasse opened in 1891 — long before the naïve tourists arrived — "
    "and by 1923 it served 1,234.5 litres of coffee a week (according to the owner’s ledger).",
    "“It’s not a museum,” said Mrs. O'Brien, who has run the place since 2004; \"it's a living room "
    "for the neighbourhood.\" Her grandmother's recipe for crème brûlée is still on the menu.",
    "Internationalization and electroencephalography are words that tokenizers split into many pieces; "
    "antidisestablishmentarianism, famously, even more so. Don't forget Dvořák, Łódź or São Paulo.",
    "Prices rose by 3.5% in Q3 2021, to €1,250.75 per tonne — see https://example.org/report?id=42&lang=en "
    "for details — while the déjà vu of 2008 (when prices fell 40%) haunted traders.",
    "Ångström, Gödel and Beyoncé walk into a bar... The bartender asks: \"What'll it be?\" They say "
    "'the usual' — a piña colada, two jalapeño poppers and a façade of calm.",
]

MOJIBAKE = ["cafÃ©", "donâ€™t", "Ã  la carte", "&amp;amp;lt;b&gt;", "\x1b[31mred\x1b[0m", "line\r\nbreak",
            "ﬁne ﬂour", "ＦＵＬＬ　ｗｉｄｔｈ", "\x93quoted\x94", "soft\u00adhyphen", "e\u0301tude", "ΟΔΟΣ İstanbul",
            "<start_of_text>hello<END_OF_TEXT>", "tab\tand\u2028sep", "a\u0345b", "'ſ", "&#147;hi&#148;", "\ufeffbom"]


def cleaned_corpus() -> list[str]:
    return [clean_text(t) for t in REAL_TEXT]


@pytest.fixture(scope="module")
def clip_ref():
    from xdbert.clip import clip_tokenizer

    return clip_tokenizer(CLIP)


@pytest.fixture(scope="module")
def clip_fast():
    return clip_fast_tokenizer(CLIP)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A WordPiece vocabulary trained on the test text, saved the way the stage saves it."""
    folder = tmp_path_factory.mktemp("tok") / "tokenizer"
    train_wordpiece(cleaned_corpus() * 3, 300, 512).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def bert_ref(bert_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(bert_dir))


def make_dual(bert_ref, clip_ref, clip_fast, max_len=24, n_blocks=2) -> DualTokenizer:
    layout = Layout(max_len=max_len, n_blocks=n_blocks, cls_id=bert_ref.cls_token_id, sep_id=bert_ref.sep_token_id,
                    pad_id=bert_ref.pad_token_id, sot_id=clip_ref.sot_token_id, eot_id=clip_ref.eot_token_id,
                    bert_vocab_size=len(bert_ref))
    return DualTokenizer(bert_ref.backend_tokenizer.to_str(), clip_fast.to_str(), layout)


def fast_clip_ids(clip_fast, text: str) -> list[int]:
    return clip_fast.encode(text.lower(), add_special_tokens=False).ids


# ---------------------------------------------------------------------------------------------
# Cleaning

def random_strings(seed: int, n: int, pool: list[str]) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = "".join(rng.choice(pool) for _ in range(rng.randint(0, 40)))
        if rng.random() < 0.3:
            s += "\n" + s[::-1]
        out.append(s)
    return out


def test_fix_text_is_exactly_ftfy():
    pool = [chr(c) for c in range(0x20, 0x7F)] + list("éüöàçñßøÃÂ©®€£—–‘’“”…ﬁ　Ａ\xa0\u0301\x85\u2028\r\x1b&<>;#×²") + MOJIBAKE
    texts = REAL_TEXT + MOJIBAKE + ["\n".join(REAL_TEXT)] + random_strings(0, 3000, pool)
    for t in texts:
        assert fix_text(t) == ftfy.fix_text(t), t


def test_ftfy_badness_patterns_are_short_and_need_non_ascii():
    # `_looks_bad` searches only near non-ASCII runs; that is exact while ftfy's mojibake patterns
    # need a non-ASCII character and span fewer characters than _BADNESS_REACH.
    for name, chars in ftfy.badness.MOJIBAKE_CATEGORIES.items():
        assert not any(re.match(f"[{chars}]", chr(c)) for c in range(128)), name
    rng = random.Random(1)
    ascii_chars = [chr(c) for c in range(128)]
    assert not any(ftfy.badness.is_bad("".join(rng.choices(ascii_chars, k=12))) for _ in range(20000))
    alphabet = "".join(ftfy.badness.MOJIBAKE_CATEGORIES.values()) + "ÂÃÎÐØÙ×à√≈‚вЂВГРСΒΓΞΟβ€ā Ab.,"
    alphabet = [c for c in alphabet if c not in "-\\"]
    longest = max((len(m.group()) for _ in range(3000)
                   for m in ftfy.badness.BADNESS_RE.finditer("".join(rng.choices(alphabet, k=40)))), default=0)
    assert 0 < longest < _BADNESS_REACH
    for s in random_strings(2, 2000, alphabet + ascii_chars):
        assert _looks_bad(s) or not ftfy.badness.is_bad(s), s


def test_clean_text_rule_and_idempotence():
    assert clean_text("  a \n\n b\t c  ") == "a b c"
    assert clean_text("&amp;amp;amp;lt;b&gt;") == "<b>"  # unescaped until nothing is left
    assert clean_text("x <start_of_text>y<END_OF_TEXT> z") == "x y z"
    assert clean_text("<end_<end_of_text>of_text>") == "<end_ of_text>"  # replaced by a space: nothing new forms
    assert clean_text("“It’s” ﬁne") == "\"It's\" fine"
    for t in REAL_TEXT + MOJIBAKE:
        c = clean_text(t)
        assert clean_text(c) == c
        assert _clean_whitespace(c) == c  # what open_clip's SimpleTokenizer does before splitting gives the text back


# ---------------------------------------------------------------------------------------------
# The fast CLIP BPE

def test_clip_fast_equals_simple_tokenizer_on_real_text(clip_ref, clip_fast):
    for para in cleaned_corpus():
        assert fast_clip_ids(clip_fast, para) == clip_ref.encode(para)
        for sentence in re.split(r"(?<=[.;?!]) ", para):
            assert fast_clip_ids(clip_fast, sentence) == clip_ref.encode(sentence), sentence


def test_clip_fast_equals_simple_tokenizer_on_hard_unicode(clip_ref, clip_fast):
    rng = random.Random(3)
    blocks = [(0x20, 0x7F), (0xA0, 0x250), (0x300, 0x370), (0x370, 0x500), (0x590, 0x700), (0x900, 0x980),
              (0x1E00, 0x1F00), (0x2000, 0x2070), (0x2100, 0x2200), (0x3040, 0x3100), (0x4E00, 0x4E80),
              (0xAC00, 0xAC80), (0xFF00, 0xFF60), (0x1F300, 0x1F650), (0x10000, 0x10100)]
    texts = MOJIBAKE + ["ΟΔΟΣ ΣΟΦΙΑΣ", "İSTANBUL İzmir", "'ſ 'S 'T", "ẗ̈ T\u0308", "a\u0345b\u0345"]
    for _ in range(1500):
        texts.append("".join(chr(rng.randrange(*rng.choice(blocks))) if rng.random() < 0.7 else rng.choice(" abc'sT.,ſ")
                             for _ in range(rng.randint(1, 30))))
    for raw in texts:
        text = clean_text(raw)
        assert fast_clip_ids(clip_fast, text) == clip_ref.encode(text), repr(text)


# ---------------------------------------------------------------------------------------------
# Windows, blocks, alignment

@pytest.fixture(scope="module")
def corpus_windows(bert_ref, clip_ref, clip_fast):
    dual = make_dual(bert_ref, clip_ref, clip_fast, max_len=24, n_blocks=1)
    docs = cleaned_corpus() + [" ".join(cleaned_corpus())]
    return dual, docs, dual.encode(docs, clean=False)


def window_text(docs, win, i) -> str:
    a, b = win.char_span[i]
    return docs[win.doc_index[i]][a:b]


def test_every_window_matches_the_reference_tokenizers(corpus_windows, bert_ref, clip_ref):
    dual, docs, win = corpus_windows
    assert len(win) > 20 and win.overflow.sum() == 0
    for i in range(len(win)):
        text = window_text(docs, win, i)
        k = win.bert_len[i]
        assert win.bert_ids[i, :k].tolist() == bert_ref(text)["input_ids"], text
        assert (win.bert_ids[i, k:] == bert_ref.pad_token_id).all()
        ref = clip_ref.encode(text)
        assert clip_content(win.clip_ids[i], clip_ref.eot_token_id) == ref, text
        assert np.array_equal(win.clip_ids[i], clip_blocks(ref, dual.layout)[0])
        assert alignment_problem(win.align_start[i], win.align_end[i], k, False, dual.layout) is None


def test_windows_cut_only_at_word_starts(corpus_windows, bert_ref):
    dual, docs, win = corpus_windows
    assert win.dropped_words == 0
    for d, doc in enumerate(docs):
        rows = np.flatnonzero(win.doc_index == d)
        assert len(rows) >= 1 and all(win.bert_len[rows] <= dual.layout.max_len)
        # the windows' tokens, in order, are exactly the whole document's tokens
        pieces = [t for r in rows for t in win.bert_ids[r, 1:win.bert_len[r] - 1].tolist()]
        assert pieces == bert_ref(doc, add_special_tokens=False)["input_ids"]
        for r in rows:
            first = bert_ref.convert_ids_to_tokens(int(win.bert_ids[r, 1]))
            assert not first.startswith("##")
            a, b = win.char_span[r]
            assert doc[a:b] == doc[a:b].strip() and (a == 0 or not doc[a - 1].isalnum() or not doc[a].isalnum())


def test_memo_and_whole_text_paths_agree(corpus_windows, bert_ref, clip_ref, clip_fast, monkeypatch):
    """Piece by piece (memoized) equals tokenizing whole documents; windows cut inside a space-free
    piece ("(1,234.5)", "don't") are among them; a full memo is emptied without changing results."""
    dual, docs, win = corpus_windows
    cut_inside = [i for i in range(len(win)) if win.char_span[i, 0] > 0 and docs[win.doc_index[i]][win.char_span[i, 0] - 1] != " "]
    assert len(cut_inside) >= 3
    monkeypatch.setattr("xdbert.data.tokenization.dual.PIECE_MEMO_SIZE", 40)
    other = make_dual(bert_ref, clip_ref, clip_fast, max_len=24, n_blocks=1)
    other.bert_memo = other.continuation = None  # the path for tokenizers that are not BERT's
    again = other.encode(docs, clean=False)
    assert len(other.clip_memo.table) < len(set(" ".join(docs).split(" ")))  # it was emptied on the way
    for k in ("bert_ids", "clip_ids", "align_start", "align_end", "doc_index", "char_span", "clip_tokens"):
        assert np.array_equal(getattr(win, k), getattr(again, k)), k


def test_a_word_longer_than_a_window_is_skipped_and_counted(bert_ref, clip_ref, clip_fast):
    dual = make_dual(bert_ref, clip_ref, clip_fast, max_len=8)
    long_word = "antidisestablishmentarianism"
    assert len(bert_ref.tokenize(long_word)) > 6
    doc = f"the café {long_word} and the naïve owner"
    win = dual.encode([doc], clean=False)
    assert win.dropped_words == 1
    texts = [window_text([doc], win, i) for i in range(len(win))]
    assert texts[0] == "the café" and long_word not in " ".join(texts)
    pieces = [t for r in range(len(win)) for t in win.bert_ids[r, 1:win.bert_len[r] - 1].tolist()]
    assert pieces == bert_ref("the café and the naïve owner", add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def hand_vocab_tokenizer(tmp_path_factory):
    from transformers import BertTokenizer

    words = ["the", "kids", "were", "play", "##ing", "in", "cafe", "near", "zur", "##ich", "."]
    vocab = {t: i for i, t in enumerate(BERT_SPECIALS + words)}
    folder = tmp_path_factory.mktemp("hand") / "tok"
    BertTokenizer(vocab=vocab, do_lower_case=True).save_pretrained(str(folder))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def test_alignment_on_a_hand_checked_sentence(hand_vocab_tokenizer, clip_ref, clip_fast):
    dual = make_dual(hand_vocab_tokenizer, clip_ref, clip_fast, max_len=16, n_blocks=1)
    text = "The kids were playing in the café near Zürich."
    win = dual.encode([text])
    tokens = hand_vocab_tokenizer.convert_ids_to_tokens(win.bert_ids[0, :win.bert_len[0]].tolist())
    assert tokens == ["[CLS]", "the", "kids", "were", "play", "##ing", "in", "the", "cafe", "near", "zur", "##ich", ".", "[SEP]"]
    clip = [clip_ref.decoder[i] for i in clip_content(win.clip_ids[0], clip_ref.eot_token_id)]
    assert clip == ["the</w>", "kids</w>", "were</w>", "playing</w>", "in</w>", "the</w>", "cafÃ©</w>", "near</w>",
                    "z", "Ã¼", "rich</w>", ".</w>"]  # CLIP's byte-level pieces: café, z ü rich
    ranges = list(zip(win.align_start[0].tolist(), win.align_end[0].tolist()))[:win.bert_len[0]]
    # flat CLIP position = 1 + content index in block 0; "play" and "##ing" both map to "playing</w>";
    # "Zür" covers z, ü and rich; "##ich" only rich.
    assert ranges == [(-1, -1), (1, 2), (2, 3), (3, 4), (4, 5), (4, 5), (5, 6), (6, 7), (7, 8), (8, 9), (9, 12),
                      (11, 12), (12, 13), (-1, -1)]
    assert (win.align_start[0, win.bert_len[0]:] == -1).all()


def strip_marks(s: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", s.lower()) if not unicodedata.combining(c))


def test_aligned_clip_tokens_spell_the_bert_token(corpus_windows, bert_ref, clip_ref):
    """Independent of the offsets: the CLIP tokens in a BERT token's range, decoded, contain its text."""
    dual, docs, win = corpus_windows
    checked = 0
    for i in range(len(win)):
        row = win.clip_ids[i]
        for p in range(1, win.bert_len[i] - 1):
            piece = bert_ref.convert_ids_to_tokens(int(win.bert_ids[i, p]))
            if piece == "[UNK]":
                continue
            s, e = win.align_start[i, p], win.align_end[i, p]
            decoded = clip_ref.decode([int(x) for x in row[s:e] if x < clip_ref.sot_token_id]).replace(" ", "")
            assert strip_marks(piece.removeprefix("##")) in strip_marks(decoded), (piece, decoded)
            checked += 1
    assert checked > 200


def test_block_layout_and_mask():
    layout = Layout(max_len=16, n_blocks=3, cls_id=2, sep_id=3, pad_id=0, sot_id=49406, eot_id=49407, bert_vocab_size=100)
    content = list(range(1, 80)) + [0]  # 80 tokens, the last one id 0 = "!"
    row, kept = clip_blocks(content, layout)
    assert kept == 80 and row.dtype == np.uint16 and row.shape == (231,)
    assert row[0] == 49406 and row[1:76].tolist() == content[:75] and row[76] == 49407
    assert row[77] == 49406 and row[78:83].tolist() == content[75:] and row[83] == 49407
    assert (row[84:] == 0).all()
    from xdbert.clip import clip_block_mask
    import torch

    mask = clip_block_mask(torch.as_tensor(row.astype(np.int64)).reshape(3, 77), 49407)
    assert mask.shape == (3, 77)
    assert mask[0].all() and mask[1, :7].all() and not mask[1, 7:].any() and not mask[2].any()
    assert clip_content(row, 49407) == content
    full, kept = clip_blocks(list(range(300)), layout)
    assert kept == 225 and full[76] == full[153] == full[230] == 49407


def test_overflow_is_counted_and_cut_tokens_are_unaligned(bert_ref, clip_ref, clip_fast):
    dual = make_dual(bert_ref, clip_ref, clip_fast, max_len=128, n_blocks=1)
    text = "In 1891 the café sold 1,234.5 litres; in 1923 it sold 2,345.6 litres, and 3,456.7 in 1955 " * 3
    win = dual.encode([text])
    assert win.overflow[0] and win.clip_tokens[0] > 75 and win.bert_len[0] == 128
    ref = clip_ref.encode(window_text([clean_text(text)], win, 0))
    assert clip_content(win.clip_ids[0], clip_ref.eot_token_id) == ref[:75]
    k = win.bert_len[0]
    start = win.align_start[0, 1:k - 1]
    assert (start[:5] > 0).all() and (start[-5:] == -1).all()
    assert alignment_problem(win.align_start[0], win.align_end[0], k, True, dual.layout) is None
    assert alignment_problem(win.align_start[0], win.align_end[0], k, False, dual.layout) is not None


def test_pool_gives_the_same_windows_as_one_process(bert_ref, clip_ref, clip_fast, monkeypatch):
    monkeypatch.setattr("xdbert.data.tokenization.pool.CHUNK_CHARS", 300)  # several chunks for two workers
    dual = make_dual(bert_ref, clip_ref, clip_fast)
    docs = REAL_TEXT * 2
    one = concat_windows(list(tokenize_docs(docs, dual.bert.to_str(), dual.clip.to_str(), dual.layout, workers=1)))
    two = concat_windows(list(tokenize_docs(docs, dual.bert.to_str(), dual.clip.to_str(), dual.layout, workers=2)))
    for k in ("bert_ids", "clip_ids", "align_start", "align_end", "doc_index", "char_span"):
        assert np.array_equal(getattr(one, k), getattr(two, k)), k
    assert sorted(set(one.doc_index.tolist())) == list(range(len(docs)))


# ---------------------------------------------------------------------------------------------
# BERT tokenizers: trained and from the hub

def test_trained_vocabulary_is_a_bert_folder(bert_dir, bert_ref):
    from transformers import BertTokenizerFast

    tok = BertTokenizerFast.from_pretrained(str(bert_dir))
    assert tok.convert_ids_to_tokens([0, 1, 2, 3, 4]) == BERT_SPECIALS
    text = cleaned_corpus()[0]
    assert tok(text)["input_ids"] == bert_ref(text)["input_ids"]
    assert bert_ref.tokenize("Café NAÏVE")[:1] == bert_ref.tokenize("cafe naive")[:1]  # uncased, accents stripped
    again = train_wordpiece(cleaned_corpus() * 3, 300, 512)
    assert vocab_hash(again.get_vocab()) == vocab_hash(bert_ref.get_vocab())  # deterministic


def test_hub_loader_reads_a_folder_in_the_hub_format(bert_dir, tmp_path):
    folder = tmp_path / "org-model"
    shutil.copytree(bert_dir, folder)
    tok = load_encoder_tokenizer(str(folder))
    assert tok.cls_token_id == 2 and tok.backend_tokenizer is not None
    assert encoder_positions(str(folder), None, tok) == 512  # no config.json: the tokenizer's limit


def test_offline_hub_request_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PipelineError, match="not in this machine's hub cache, and the hub is switched off"):
        load_encoder_tokenizer("xdbert-tests/no-such-model")


def test_settings_are_checked():
    good = values("embedded")["tokenize"]
    assert Settings.from_params(good).max_len == good["max_len"]
    for key, value, msg in [("max_len", 4, "tokenize.max_len"), ("n_blocks", 0, "tokenize.n_blocks"),
                            ("n_blocks", 1000, "tokenize.n_blocks"), ("max_overflow", 2, "tokenize.max_overflow"),
                            ("workers", 0, "tokenize.workers"), ("validate_windows", -1, "tokenize.validate_windows")]:
        with pytest.raises(PipelineError, match=re.escape(msg)):
            Settings.from_params({**good, key: value})
    with pytest.raises(PipelineError, match="above the 128 positions"):
        check_positions("tokenize.max_len", Settings.from_params({**good, "max_len": 256}).max_len,
                        encoder_positions("random:bert", {"max_position_embeddings": 128}), "random:bert")
    assert encoder_positions("random:bert", None) == 512
    with pytest.raises(PipelineError, match="unknown encoder model type `nosuchmodel`"):
        encoder_positions("random:nosuchmodel", None)
    # transformers keeps a misspelled key as a stray attribute and builds the default size: refused
    with pytest.raises(PipelineError, match=r"`hiden_size` in the encoder_config of `random:bert` is not a setting of "
                                            r"transformers' BertConfig \(did you mean `hidden_size`\?\)"):
        encoder_positions("random:bert", {"hiden_size": 32})


# ---------------------------------------------------------------------------------------------
# The stage

STAGE = ROOT / "stages" / "dual_tokenize.py"


EMBEDDED = values("embedded")
PARAMS = {  # the embedded profile with what these tests rely on
    **EMBEDDED,
    "model": {**EMBEDDED["model"], "encoder": "random:bert", "clip": CLIP,
              "encoder_config": {**EMBEDDED["model"]["encoder_config"], "max_position_embeddings": 64}},
    "tokenize": {**EMBEDDED["tokenize"], "vocab_size": 400, "max_len": 32, "n_blocks": 1, "shard_windows": 16,
                 "max_overflow": 0.01, "validate_windows": 8, "workers": 2},
}


def write_workdir(root: Path, params: dict, train: list[str] | None = None, valid: list[str] | None = None) -> Path:
    (root / "data" / "corpus").mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    docs = {"train": train if train is not None else [" ".join(REAL_TEXT[i:] + REAL_TEXT[:i]) for i in range(5)] * 2,
            "valid": valid if valid is not None else REAL_TEXT[:2]}
    for split, texts in docs.items():
        pd.DataFrame({"doc_id": [f"{split}-{i}" for i in range(len(texts))], "text": texts}).to_parquet(
            root / "data" / "corpus" / f"{split}.parquet")
    return root


def run_stage(root: Path, monkeypatch) -> tuple[int, str, str]:
    """Run the stage's main in `root` as `python stages/dual_tokenize.py` would: (exit code, stdout, stderr)."""
    from xdbert.stage import run

    monkeypatch.chdir(root)
    monkeypatch.setattr(sys, "argv", ["stages/dual_tokenize.py"])
    out, err = stdio.StringIO(), stdio.StringIO()
    code = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            run(load_stage("dual_tokenize").main)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def test_stage_writes_shards_manifest_and_tokenizer(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from xdbert.data.shards import open_shards, read_manifest

    root = write_workdir(tmp_path, PARAMS)
    code, out, err = run_stage(root, monkeypatch)
    assert code == 0, err
    assert out.count("\n") == 1 and out.startswith("dual_tokenize: ") and "MB/s" in out
    m = read_manifest(root / "data" / "shards")
    assert m["max_len"] == 32 and m["n_blocks"] == 1
    assert m["bert_tokenizer"]["name"] == "random:bert" and m["bert_tokenizer"]["path"] == "models/tokenizer"
    tok = AutoTokenizer.from_pretrained(str(root / "models" / "tokenizer"))
    assert m["bert_tokenizer"]["vocab_sha256"] == vocab_hash(tok.get_vocab()) and m["bert_tokenizer"]["vocab_size"] == len(tok)
    assert m["clip_tokenizer"]["model"] == CLIP and len(m["clip_tokenizer"]["vocab_sha256"]) == 64
    train = open_shards(root / "data" / "shards", "train", verify=True)
    assert len(train) == m["splits"]["train"]["windows"] > 16
    assert [s["file"] for s in m["splits"]["train"]["shards"]][:2] == ["train/shard-00000.arrow", "train/shard-00001.arrow"]
    assert m["splits"]["train"]["overflow_share"] == 0 and m["validated_windows"]["train"] == 8
    row = train[0]
    assert row["bert_ids"][0] == tok.cls_token_id and row["bert_ids"].dtype == np.uint16 and row["clip_ids"].shape == (77,)
    assert not list(root.glob("data/.shards.*")) and not list(root.glob("models/.tokenizer.*"))  # no temp dirs left
    from xdbert.data.shards import check_matches

    check_matches(m, root / "models" / "tokenizer", CLIP)  # what the adapt stage checks before training


def test_stage_with_a_pretrained_tokenizer_folder(tmp_path, monkeypatch, bert_dir):
    """The hub path of the stage, pointed at a local folder in the hub's format."""
    from xdbert.data.shards import check_matches, open_shards, read_manifest

    folder = tmp_path / "hub-bert"
    shutil.copytree(bert_dir, folder)
    params = {**PARAMS, "model": {**PARAMS["model"], "encoder": str(folder)}}
    root = write_workdir(tmp_path / "work", params)
    code, out, err = run_stage(root, monkeypatch)
    assert code == 0, err
    m = read_manifest(root / "data" / "shards")
    assert m["bert_tokenizer"]["name"] == str(folder) and m["bert_tokenizer"]["vocab_size"] == 300
    assert (root / "models" / "tokenizer" / "tokenizer.json").read_text() == (folder / "tokenizer.json").read_text()
    assert len(open_shards(root / "data" / "shards", "valid")) == m["splits"]["valid"]["windows"] > 0
    with pytest.raises(PipelineError, match="another vocabulary"):
        check_matches(m, _other_tokenizer(tmp_path), CLIP)


def _other_tokenizer(tmp_path: Path) -> Path:
    folder = tmp_path / "other"
    train_wordpiece(["completely different words here"] * 5, 60, 64).save_pretrained(str(folder))
    return folder


def stage_error(root: Path, monkeypatch) -> str:
    sentinel = root / "data" / "shards" / "manifest.json"
    sentinel.parent.mkdir(parents=True, exist_ok=True)
    sentinel.write_text("previous output\n")
    (root / "models" / "tokenizer").mkdir(parents=True, exist_ok=True)
    (root / "models" / "tokenizer" / "keep.txt").write_text("previous tokenizer\n")
    code, out, err = run_stage(root, monkeypatch)
    assert code == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert sentinel.read_text() == "previous output\n"  # the old outputs are untouched
    assert sorted(p.name for p in (root / "data" / "shards").iterdir()) == ["manifest.json"]
    assert (root / "models" / "tokenizer" / "keep.txt").read_text() == "previous tokenizer\n"
    assert not list(root.glob("data/.shards.*")) and not list(root.glob("models/.tokenizer.*"))  # no temp dirs left
    return err


def with_tokenize(**kw) -> dict:
    return {**PARAMS, "tokenize": {**PARAMS["tokenize"], **kw}}


@pytest.mark.parametrize("params, message", [
    (with_tokenize(max_len=4), "tokenize.max_len"),
    (with_tokenize(max_len=128), "above the 64 positions"),
    (with_tokenize(n_blocks=0), "tokenize.n_blocks"),
    ({**PARAMS, "model": {**PARAMS["model"], "clip": "no-such-clip"}}, "unknown CLIP model"),
])
def test_stage_rejects_bad_params(tmp_path, monkeypatch, params, message):
    assert message in stage_error(write_workdir(tmp_path, params), monkeypatch)


def test_stage_fails_on_clip_overflow(tmp_path, monkeypatch):
    numbers = " ".join(f"{i},{i * 7 % 1000:03d}.{i % 10}" for i in range(400))  # ~7 CLIP tokens per BERT word
    root = write_workdir(tmp_path, with_tokenize(max_len=64), train=[numbers] * 2)
    err = stage_error(root, monkeypatch)
    assert "raise tokenize.n_blocks or lower tokenize.max_len" in err and "% of the train windows" in err


def test_overflow_lower_bound_is_exact_and_one_sided():
    """Clopper-Pearson: the 99% lower bound of k in n is the share p at which seeing k or more has
    probability 1%; it lies below k / n, and is 0 for no overflow."""
    from scipy.stats import binom

    from xdbert.data.tokenization.build import overflow_lower_bound

    bound = overflow_lower_bound(100, 5000)
    assert 0.0150 < bound < 0.0160 < 100 / 5000
    assert binom.sf(99, 5000, bound) == pytest.approx(0.01, rel=1e-6)
    assert overflow_lower_bound(0, 5000) == 0.0


def test_overflow_stops_early_only_when_surely_above_the_limit():
    from xdbert.data.tokenization.build import SplitResult, check_overflow_early

    settings = dataclasses.replace(Settings.from_params(PARAMS["tokenize"]), max_overflow=0.01)
    res = SplitResult(windows=4999, overflow=4999)
    check_overflow_early("train", res, settings)  # under 5,000 windows: never
    check_overflow_early("train", SplitResult(windows=5000, overflow=60), settings)  # 1.2%, but it may be chance
    with pytest.raises(PipelineError, match=r"2\.00% of the train windows \(100 of 5000\).*stopped early: its 99% lower bound is 1\.5"):
        check_overflow_early("train", SplitResult(windows=5000, overflow=100), settings)


def test_stage_stops_early_on_clip_overflow(tmp_path, monkeypatch):
    """The stage stops at the first batch past the minimum, leaving the earlier outputs as they were."""
    from xdbert.data.tokenization import build

    monkeypatch.setattr(build, "EARLY_MIN_WINDOWS", 1)
    numbers = " ".join(f"{i},{i * 7 % 1000:03d}.{i % 10}" for i in range(400))  # ~7 CLIP tokens per BERT word
    err = stage_error(write_workdir(tmp_path, with_tokenize(max_len=64), train=[numbers] * 2), monkeypatch)
    assert "stopped early" in err and "of the train windows" in err


def test_stage_fails_on_an_empty_corpus(tmp_path, monkeypatch):
    err = stage_error(write_workdir(tmp_path, PARAMS, train=["", "   "]), monkeypatch)
    assert "gives no windows" in err


def test_stage_fails_on_a_missing_corpus_file(tmp_path, monkeypatch):
    root = write_workdir(tmp_path, PARAMS)
    (root / "data" / "corpus" / "valid.parquet").unlink()
    assert "missing corpus file data/corpus/valid.parquet" in stage_error(root, monkeypatch)


def test_stage_fails_offline_for_a_hub_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    params = {**PARAMS, "model": {**PARAMS["model"], "encoder": "xdbert-tests/no-such-bert"}}
    assert "not in this machine's hub cache" in stage_error(write_workdir(tmp_path, params), monkeypatch)


def test_stage_script_exits_2_with_one_line(tmp_path):
    root = write_workdir(tmp_path, with_tokenize(max_len=4))
    r = subprocess.run([sys.executable, str(STAGE)], cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert r.stderr.startswith("error: `tokenize.max_len`") and r.stderr.count("\n") == 1, r.stderr
    assert not (root / "data" / "shards").exists()


def test_a_family_must_share_the_shards_vocabulary(tmp_path):
    """ELECTRA reads BERT-uncased's shards because its vocabulary is BERT-uncased's, id for id; an encoder
    with a vocabulary of its own would read other words out of every id, so the adaptation refuses it."""
    texts = ["the river runs past the quiet stone table"] * 5
    train_wordpiece(texts, 60, 64).save_pretrained(str(tmp_path / "shards"))
    train_wordpiece(texts, 60, 64).save_pretrained(str(tmp_path / "same"))
    train_wordpiece(["completely different words for another vocabulary"] * 5, 60, 64).save_pretrained(str(tmp_path / "other"))
    check_shared_vocabulary(str(tmp_path / "same"), "electra", tmp_path / "shards")
    check_shared_vocabulary("random:electra", "electra", tmp_path / "shards")  # built on the shards' own vocabulary
    with pytest.raises(PipelineError, match=r"family 'electra''s encoder `.*other` has its own vocabulary .* must share one"):
        check_shared_vocabulary(str(tmp_path / "other"), "electra", tmp_path / "shards")
