"""benchmarks.probes: a text's features are the same whatever batch it is read in (padding neither counted in the
mean nor read as the classifier's token), for XLNet-Lite (bidirectional and causal) and BERT; the probe finds what
the features hold and nothing else."""

import numpy as np
import pytest
import torch

from benchmarks import probes

TEXTS = [
    "a wonderful film",
    "great acting and a moving story that i loved from the start to the very end",
    "dull",
    "the movie was a story of time and of the people who lived in it",
    "awful",
]


def split(texts):
    import datasets

    from xlnet_lite.classification_data import Split

    return Split(datasets.Dataset.from_dict({"sentence": texts, "label": [i % 2 for i in range(len(texts))]}), "t")


def save_model(pretrained, tmp_path, kind):
    """A tiny model folder of `kind` (xlnet bi, xlnet uni, bert), weights large enough that every term matters."""
    from transformers import AutoTokenizer, BertForMaskedLM

    import xlnet_lite
    from benchmarks.baselines import bert_mlm

    tokenizer = AutoTokenizer.from_pretrained(pretrained)
    torch.manual_seed(1)  # not the seed of probes' random init
    config = xlnet_lite.XLNetLiteConfig.from_pretrained(pretrained, initializer_range=0.5)
    if kind == "bert":
        model = BertForMaskedLM(bert_mlm.bert_config_like(config, len(tokenizer), pad_token_id=tokenizer.pad_token_id))
        tokenizer = bert_mlm.bert_tokenizer(tokenizer)
    else:
        config.attn_type = kind
        model = xlnet_lite.XLNetLiteLMHeadModel(config)
    model.save_pretrained(tmp_path / kind)
    tokenizer.save_pretrained(tmp_path / kind)
    return tmp_path / kind


@pytest.mark.parametrize("kind", ["bi", "uni", "bert"])
def test_a_texts_features_do_not_depend_on_its_batch(pretrained, tmp_path, kind, one_thread):
    from transformers import AutoTokenizer

    path = save_model(pretrained, tmp_path, kind)
    model, model_kind = probes.load_model(str(path), random_init=False)
    assert model_kind == ("bert" if kind == "bert" else "xlnet")
    tokenizer = AutoTokenizer.from_pretrained(path)
    together = probes.features(model, model_kind, split(TEXTS), tokenizer, max_len=40, batch_size=len(TEXTS))
    alone = [probes.features(model, model_kind, split([t]), tokenizer, max_len=40, batch_size=1) for t in TEXTS]
    assert sorted(together) == [f"mean_layer_{i}" for i in range(3)] + ["read_token_last_layer"]
    lengths = [len(ids) for ids in tokenizer(TEXTS, truncation=True, max_length=40)["input_ids"]]
    assert min(lengths) < 10 and max(lengths) == 40  # padding and truncation both happen
    for name, values in together.items():
        assert values.shape == (len(TEXTS), model.config.hidden_size)
        np.testing.assert_allclose(values, np.concatenate([a[name] for a in alone]), rtol=1e-4, atol=1e-4)
    # the read token is the classifier's: XLNet's <cls>, the last token; BERT's <cls>, the first
    encoded = tokenizer(TEXTS[0], truncation=True, max_length=40, return_tensors="pt")
    assert encoded["input_ids"][0, -1 if model_kind == "xlnet" else 0] == tokenizer.cls_token_id
    with torch.inference_mode():
        hidden = model(**encoded, output_hidden_states=True).hidden_states[-1][0]
    read = hidden[-1 if model_kind == "xlnet" else 0].numpy()
    np.testing.assert_allclose(together["read_token_last_layer"][0], read, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(together["mean_layer_2"][0], hidden.mean(0).numpy(), rtol=1e-4, atol=1e-4)
    # a fresh architecture is not the trained one
    untrained, _ = probes.load_model(str(path), random_init=True)
    fresh = probes.features(untrained, model_kind, split(TEXTS[:1]), tokenizer, max_len=40)
    assert not np.allclose(fresh["read_token_last_layer"], together["read_token_last_layer"][:1])


def test_the_probe_finds_what_the_features_hold():
    rng = np.random.default_rng(0)

    def sets(informative):
        x = rng.normal(size=(600, 16))
        y = (x[:, 3] > 0).astype(int) if informative else rng.integers(0, 2, 600)
        return (x[:300], y[:300]), (x[300:450], y[300:450]), (x[450:], y[450:])

    held = probes.fit(*sets(True))
    assert held["test_accuracy"] > 0.9 and held["C"] in probes.C_GRID
    assert probes.fit(*sets(False))["test_accuracy"] < 0.65
