"""A tiny random BERT with a WordPiece tokenizer trained on the test's own sentences, for the analyses' tests."""
from pathlib import Path

import torch


def tiny_bert(folder: Path, texts: list[str], vocab_size: int):
    """(BertModel, tokenizer): the tokenizer trained on `texts` and loaded back from `folder` the way the pipeline
    loads models/tokenizer (AutoTokenizer: the fast tokenizer); the model 2 layers of width 32, seeded."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from xdbert.data.tokenization.vocab import train_wordpiece

    train_wordpiece(texts, vocab_size, 64).save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=64))
    return model, tok
