"""What the real hub assets of the paper profile hold, each fact with its source: the layouts the rehearsal's
mirror (xdbert.mirror) writes.

Written from a reading of the hub's pages, the `datasets` 2.0.0 loading scripts, open_clip v3.3.0 and
transformers' sources (the project's shared HUB_LAYOUTS.md), never from the loaders' constants: were the
mirror built from those, it would only show that the code agrees with itself. tests/test_mirror.py holds
the loaders' constants (hub ids, configs, splits, columns, label orders, file names) against this record.

Feature types: "string", "int32", "float32", a tuple of ClassLabel names in label order, or ("float",) for a list of
floats.
"""
from __future__ import annotations

# Weight formats: "safetensors", or "torch-legacy" (torch.save's pickle, not zip: torch before 1.6, 2020).
# `layer_norm`: the names of a LayerNorm's scale and shift in the checkpoint's keys.
_BERT = {"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
         "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
         "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0, "type_vocab_size": 2, "vocab_size": 30522}
_ENCODER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt")

MODELS: dict[str, dict] = {
    "bert-base-uncased": {
        # main, less the flax/tf/rust/onnx/coreml files (no loader here reads them)
        "files": (*_ENCODER_FILES, "model.safetensors", "pytorch_model.bin"),
        "weights": "model.safetensors", "format": "safetensors", "layer_norm": ("gamma", "beta"),
        # the pretraining model: `bert.` body, `cls.predictions` MLM head, `cls.seq_relationship` NSP head
        "checkpoint_class": "BertForPreTraining",
        "config": {**_BERT, "architectures": ["BertForMaskedLM"], "model_type": "bert", "gradient_checkpointing": False,
                   "position_embedding_type": "absolute", "use_cache": True},
        "source": "files: https://huggingface.co/google-bert/bert-base-uncased/tree/main (the id bert-base-uncased "
                  "resolves there); gamma/beta under a `bert.` prefix: huggingface/transformers#11809, huggingface/candle "
                  "PR #1888; config.json: https://huggingface.co/rayTest/bert-base-uncased/blob/main/config.json "
                  "(a verbatim copy, 570 bytes)",
    },
    "bert-base-cased": {  # the probes' reference row (`probes.reference`)
        "files": (*_ENCODER_FILES, "model.safetensors", "pytorch_model.bin"),
        "weights": "model.safetensors", "format": "safetensors", "layer_norm": ("gamma", "beta"),
        "checkpoint_class": "BertForPreTraining",
        "config": {**_BERT, "architectures": ["BertForMaskedLM"], "model_type": "bert", "gradient_checkpointing": False,
                   "position_embedding_type": "absolute", "use_cache": True, "vocab_size": 28996},
        # 49 bytes: bert-base-uncased's 48-byte file with `false` for `true`
        "tokenizer_config": {"do_lower_case": False, "model_max_length": 512},
        "source": "files at cd5ef92 (\"Updates the tokenizer configuration file (#10)\"): https://huggingface.co/google-bert/"
                  "bert-base-cased/tree/cd5ef92a9fb2f889e972770a36d4ed042daf221e (config.json 570 bytes like uncased's, "
                  "vocab.txt 213 kB: 28,996 tokens, tokenizer_config.json 49 bytes; model.safetensors converted from "
                  "pytorch_model.bin in PR #1). Its config beside uncased's but vocab_size, and gamma/beta key names, are "
                  "inferred from bert-base-uncased's (the same release and conversions), not seen",
    },
    "google/electra-base-discriminator": {
        "files": (*_ENCODER_FILES, "pytorch_model.bin"),
        "weights": "pytorch_model.bin", "format": "torch-legacy", "layer_norm": ("weight", "bias"),
        "checkpoint_class": "ElectraForPreTraining",
        "config": {**_BERT, "architectures": ["ElectraForPreTraining"], "model_type": "electra", "embedding_size": 768},
        "source": "files at 1ae76a9 (no safetensors outside the unmerged refs/pr/4): https://huggingface.co/google/"
                  "electra-base-discriminator/tree/1ae76a97c7e84a4e640876a07453fccd636f0667; config: https://huggingface"
                  ".co/cross-encoder/qnli-electra-base/blame/main/config.json. Legacy pickle and weight/bias key names "
                  "are inferred (2020 files), not seen",
    },
    "google/electra-large-discriminator": {
        "files": (*_ENCODER_FILES, "pytorch_model.bin"),
        "weights": "pytorch_model.bin", "format": "torch-legacy", "layer_norm": ("weight", "bias"),
        "checkpoint_class": "ElectraForPreTraining",
        "config": {**_BERT, "architectures": ["ElectraForPreTraining"], "model_type": "electra", "embedding_size": 1024,
                   "hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 24},
        "source": "files at c13c3df: https://huggingface.co/google/electra-large-discriminator/tree/"
                  "c13c3df7efadc2162f42588bd28eb4e187d602a5; config: https://huggingface.co/naver/"
                  "trecdl22-crossencoder-electra/blame/main/config.json. Legacy pickle and key names inferred, as for base",
    },
    "timm/vit_base_patch32_clip_224.openai": {
        # open_clip's two files, timm's own weights and two configs (its tokenizer files are not listed by any source)
        "files": ("open_clip_model.safetensors", "open_clip_pytorch_model.bin", "pytorch_model.bin",
                  "open_clip_config.json", "config.json"),
        "weights": "open_clip_model.safetensors", "format": "safetensors", "dtype": "float32",
        "clip": ("ViT-B-32", "openai"),  # open_clip's model name and pretrained tag served from this repository
        "source": "files at ab5b8ef: https://huggingface.co/timm/vit_base_patch32_clip_224.openai/tree/"
                  "ab5b8ef490e86faa07d3523926b842c765de1de5 (605 MB safetensors for ~151M parameters: float32); "
                  "repository and file names: open_clip v3.3.0 pretrained.py (_VITB32 openai hf_hub) and constants.py",
    },
}

_TEST = ("test", "test_matched", "test_mismatched")
DATASETS: dict[str, dict] = {
    "Salesforce/wikitext": {
        # config -> split -> number of parquet shards; every split: one raw line per `text` row
        "configs": {"wikitext-103-raw-v1": {"features": (("text", "string"),),
                                            "splits": {"train": 2, "validation": 1, "test": 1}}},
        "unlabeled": (),
        "title": " = Homarus gammarus = \n",        # an article's first line
        "heading": " = = Description = = \n",       # a section heading inside one
        # number escapes, as the raw lines have them
        "escaped": (" The gold one @-@ dollar piece . \n", " It weighs 0 @.@ 7 – 2 @.@ 2 kg . \n"),
        "source": "shards: https://huggingface.co/datasets/Salesforce/wikitext/tree/b08601e04326c79dfdd32d625aee71d232d685c3"
                  "/wikitext-103-raw-v1; splits and `text` rows: datasets 2.0.0 datasets/wikitext/wikitext.py; lines: the "
                  "datasets wikitext README (\"one @-@ dollar\") and the Homarus gammarus article of the dataset",
    },
    "nyu-mll/glue": {
        # every config has one shard per split; the mirror writes those the profile's tasks use
        "configs": {
            "cola": {"features": (("sentence", "string"), ("label", ("unacceptable", "acceptable")), ("idx", "int32")),
                     "splits": {"train": 1, "validation": 1, "test": 1}},
            "sst2": {"features": (("sentence", "string"), ("label", ("negative", "positive")), ("idx", "int32")),
                     "splits": {"train": 1, "validation": 1, "test": 1}},
            "mrpc": {"features": (("sentence1", "string"), ("sentence2", "string"),
                                  ("label", ("not_equivalent", "equivalent")), ("idx", "int32")),
                     "splits": {"train": 1, "validation": 1, "test": 1}},
            "qqp": {"features": (("question1", "string"), ("question2", "string"),
                                 ("label", ("not_duplicate", "duplicate")), ("idx", "int32")),
                    "splits": {"train": 1, "validation": 1, "test": 1}},
            "stsb": {"features": (("sentence1", "string"), ("sentence2", "string"), ("label", "float32"), ("idx", "int32")),
                     "splits": {"train": 1, "validation": 1, "test": 1}},
            "mnli": {"features": (("premise", "string"), ("hypothesis", "string"),
                                  ("label", ("entailment", "neutral", "contradiction")), ("idx", "int32")),
                     "splits": {"train": 1, "validation_matched": 1, "validation_mismatched": 1,
                                "test_matched": 1, "test_mismatched": 1}},
            "qnli": {"features": (("question", "string"), ("sentence", "string"),
                                  ("label", ("entailment", "not_entailment")), ("idx", "int32")),
                     "splits": {"train": 1, "validation": 1, "test": 1}},
            "rte": {"features": (("sentence1", "string"), ("sentence2", "string"),
                                 ("label", ("entailment", "not_entailment")), ("idx", "int32")),
                    "splits": {"train": 1, "validation": 1, "test": 1}},
        },
        # test splits hold label -1
        "unlabeled": _TEST,
        "source": "datasets 2.0.0 datasets/glue/glue.py (text_features, label_classes, float32 STS-B, idx int32, -1 "
                  "test labels, split generators); shards: https://huggingface.co/datasets/nyu-mll/glue/tree/main/stsb; "
                  "card (dataset_info, glob paths): nyu-mll/glue commit c234b36",
    },
    "allenai/swag": {
        "configs": {"regular": {"features": (("video-id", "string"), ("fold-ind", "string"), ("startphrase", "string"),
                                             ("sent1", "string"), ("sent2", "string"), ("gold-source", "string"),
                                             ("ending0", "string"), ("ending1", "string"), ("ending2", "string"),
                                             ("ending3", "string"), ("label", ("0", "1", "2", "3"))),
                                "splits": {"train": 1, "validation": 1, "test": 1}}},
        "unlabeled": ("test",),
        "source": "datasets 2.0.0 datasets/swag/swag.py (`regular` features and splits, test label -1); shard: "
                  "https://huggingface.co/datasets/allenai/swag/commits/main/regular/train-00000-of-00001.parquet",
    },
    "corypaik/coda": {
        # not parquet: a loading script (which the pinned `datasets` refuses) beside JSON-lines files, one per split,
        # read with the `json` builder; the two ClassLabel columns hold ids, as `Dataset.to_json` writes them
        "format": "jsonl",
        "data_files": {"train": "data/default_train.jsonl", "validation": "data/default_validation.jsonl",
                       "test": "data/default_test.jsonl"},
        "files": ("README.md", "coda.py", "dataset_infos.json"),  # beside the data files; no loader here reads them
        "features": (("class_id", "string"), ("display_name", "string"), ("ngram", "string"), ("label", ("float",)),
                     ("object_group", ("Single", "Multi", "Any")), ("text", "string"),
                     ("template_group", ("clip-imagenet", "text-masked")), ("template_idx", "int32")),
        # `label`: the human distribution over these colours, in this order
        "colors": ("black", "blue", "brown", "gray", "green", "orange", "pink", "purple", "red", "white", "yellow"),
        "objects": {"train": 311, "validation": 103, "test": 107},
        "templates": {"clip-imagenet": 10, "text-masked": 10},  # per object, before templates.yaml's empty fills are dropped
        "mask": "[MASK]",  # in every text-masked template
        "source": "files: https://huggingface.co/datasets/corypaik/coda/tree/main (9f47e7e: README.md, coda.py, "
                  "dataset_infos.json, data/) and .../tree/refs%2Fpr%2F3/data (default_train.jsonl 1.71 MB, "
                  "default_validation.jsonl 574 kB, default_test.jsonl 589 kB, added in dee0883); features, ClassLabel "
                  "names, colours, templates and the `to_json(orient='records', lines=True)` export: github nala-cub/coda "
                  "projects/coda/probing/dataset/dataset.py, _src/constants.py (COLORS), data/coda/templates.yaml "
                  "(10 templates per group; rows ordered by template text, `template_idx` counting over both groups). "
                  "Objects per split: PROBES.md. That the ClassLabel columns hold ids is inferred from the export, not seen",
    },
}
