"""The masked and causal LM objectives (xlnet_lite.objectives): their targets, corruption and attention, the model's
sparse prediction, and that neither lets a prediction see its own token."""

import pytest
import torch

from xlnet_lite import XLNetLiteConfig, XLNetLiteLMHeadModel
from xlnet_lite.data import PretrainingStream
from xlnet_lite.objectives import (
    DataCollatorForXLNetCausalLM,
    DataCollatorForXLNetMaskedLM,
    make_collator,
    objective_config,
)
from xlnet_lite.tokenization_xlnet_lite import special_token_ids, train_tokenizer

TEXTS = [
    f"document {i}: the quick brown fox {i} jumps over the lazy dog near river {i % 7}. "
    f"another sentence about topic {i % 5} follows here, and one more closes it."
    for i in range(60)
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, vocab_size=200)


def stream_examples(tokenizer, *, batch_size=4, seq_len=32, reuse_len=16, steps=3, seed=0):
    stream = PretrainingStream(TEXTS, tokenizer, batch_size=batch_size, seq_len=seq_len, reuse_len=reuse_len, seed=seed)
    return [stream.next_batch() for _ in range(steps)]


def text_positions(tokenizer, ids):
    ids_ = special_token_ids(tokenizer)
    return (ids != ids_["<sep>"]) & (ids != ids_["<cls>"]) & (ids != ids_["<pad>"])


def test_masked_lm_targets_a_fixed_share_of_the_text_and_corrupts_only_them(tokenizer):
    collator = DataCollatorForXLNetMaskedLM(tokenizer, mlm_probability=0.3, reuse_len=16, seed=3)
    mask_id = special_token_ids(tokenizer)["<mask>"]
    counts = {"mask": 0, "random": 0, "kept": 0}
    for examples in stream_examples(tokenizer, steps=40):
        original = torch.stack([torch.as_tensor(e["input_ids"]) for e in examples])
        batch = collator(examples)
        targets = batch["labels"] != -100
        text = text_positions(tokenizer, original)
        assert not (targets & ~text).any()  # never <sep>, <cls>, <pad>
        assert (targets.sum(1) == torch.ceil(text.sum(1) * 0.3)).all()
        assert torch.equal(batch["labels"][targets], original[targets])
        assert torch.equal(batch["input_ids"][~targets], original[~targets])  # only targets are corrupted
        inputs = batch["input_ids"][targets]
        counts["mask"] += int((inputs == mask_id).sum())
        counts["kept"] += int((inputs == original[targets]).sum())
        counts["random"] += int(((inputs != mask_id) & (inputs != original[targets])).sum())
        assert (
            not torch.isin(batch["input_ids"], torch.tensor(sorted(tokenizer.all_special_ids)))
            .logical_and(targets & (batch["input_ids"] != mask_id))
            .any()
        )  # random replacements are never special tokens
    total = sum(counts.values())
    # BERT's 80 / 10 / 10 (a random draw may hit the original piece: "kept" is a little above 10%)
    assert counts["mask"] / total == pytest.approx(0.8, abs=0.04)
    assert counts["random"] / total == pytest.approx(0.1, abs=0.03)
    assert counts["kept"] / total == pytest.approx(0.1, abs=0.03)


def test_masked_lm_keeps_the_reused_part_blind_to_the_new_part(tokenizer):
    """The next step's memory is the reused part's states: they must not have seen this step's new part, which the
    next step predicts."""
    batch = DataCollatorForXLNetMaskedLM(tokenizer, reuse_len=16, seed=0)(stream_examples(tokenizer, steps=1)[0])
    expected = torch.zeros(32, 32)
    expected[:16, 16:] = 1
    assert torch.equal(batch["perm_mask"], expected.expand(4, 32, 32))
    torch.manual_seed(0)
    config = XLNetLiteConfig(vocab_size=len(tokenizer), d_model=32, n_layer=2, n_head=4, d_inner=64)
    model = XLNetLiteLMHeadModel(config).eval()
    other = batch["input_ids"].clone()
    other[:, 16:] = torch.randint(len(tokenizer), (4, 16))
    with torch.no_grad():
        a = model.transformer(batch["input_ids"], perm_mask=batch["perm_mask"]).last_hidden_state
        b = model.transformer(other, perm_mask=batch["perm_mask"]).last_hidden_state
        c = model.transformer(other).last_hidden_state
    torch.testing.assert_close(a[:, :16], b[:, :16])
    assert not torch.allclose(b[:, :16], c[:, :16], atol=1e-4)  # without the block it would see them


def test_masked_lm_is_reproducible_and_resumable(tokenizer):
    examples = stream_examples(tokenizer, steps=2)
    straight = DataCollatorForXLNetMaskedLM(tokenizer, reuse_len=16, seed=5)
    batches = [straight(e) for e in examples]
    again = DataCollatorForXLNetMaskedLM(tokenizer, reuse_len=16, seed=5)
    again(examples[0])
    resumed = DataCollatorForXLNetMaskedLM(tokenizer, reuse_len=16, seed=99)
    resumed.load_state_dict(again.state_dict())
    for name, tensor in resumed(examples[1]).items():
        assert torch.equal(tensor, batches[1][name]), name
    assert not torch.equal(batches[0]["labels"], batches[1]["labels"])


def test_causal_lm_labels_are_the_next_text_token(tokenizer):
    examples = stream_examples(tokenizer, steps=1)[0]
    batch = DataCollatorForXLNetCausalLM(tokenizer, reuse_len=16)(examples)
    ids, labels = batch["input_ids"], batch["labels"]
    text = text_positions(tokenizer, ids)
    assert "perm_mask" not in batch and "target_mapping" not in batch
    assert (labels[:, -1] == -100).all()
    for b in range(ids.shape[0]):
        for i in range(ids.shape[1] - 1):
            assert labels[b, i] == (ids[b, i + 1] if text[b, i + 1] else -100)
    with pytest.raises(ValueError, match="reversed rows"):
        DataCollatorForXLNetCausalLM(tokenizer)([{**examples[0], "is_reversed": True}])


def test_a_causal_lm_prediction_never_sees_its_target(tokenizer):
    """Change the token a position is scored on (the next one): that position's logits and every earlier one's stay,
    the changed position's own move."""
    torch.manual_seed(1)
    config = XLNetLiteConfig(vocab_size=len(tokenizer), d_model=32, n_layer=2, n_head=4, d_inner=64, dropout=0.0)
    config.attn_type = objective_config("clm")["attn_type"]
    model = XLNetLiteLMHeadModel(config).eval()
    batch = DataCollatorForXLNetCausalLM(tokenizer, reuse_len=16)(stream_examples(tokenizer, steps=1)[0])
    b, i = 1, 20
    assert batch["labels"][b, i] != -100
    other = batch["input_ids"].clone()
    other[b, i + 1] = (int(other[b, i + 1]) + 1) % len(tokenizer)
    with torch.no_grad():
        a = model(batch["input_ids"], token_type_ids=batch["token_type_ids"]).logits[b]
        c = model(other, token_type_ids=batch["token_type_ids"]).logits[b]
    torch.testing.assert_close(a[: i + 1], c[: i + 1])
    assert not torch.allclose(a[i + 1], c[i + 1], atol=1e-4)


@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_sparse_prediction_gives_the_dense_loss_and_gradients(tokenizer, objective):
    torch.manual_seed(2)
    config = XLNetLiteConfig(vocab_size=len(tokenizer), d_model=32, n_layer=2, n_head=4, d_inner=64, dropout=0.0)
    for key, value in objective_config(objective).items():
        setattr(config, key, value)
    sparse = XLNetLiteLMHeadModel(config)
    dense_config = XLNetLiteConfig(**{**config.to_dict(), "sparse_prediction": False})
    dense = XLNetLiteLMHeadModel(dense_config)
    dense.load_state_dict(sparse.state_dict())
    batch = make_collator(objective, tokenizer, reuse_len=16, seed=0)(stream_examples(tokenizer, steps=1)[0])
    out_sparse, out_dense = sparse(**batch), dense(**batch)
    n = int((batch["labels"] != -100).sum())
    assert out_sparse.logits.shape == (1, n, len(tokenizer))
    assert out_dense.logits.shape == (4, 32, len(tokenizer))
    torch.testing.assert_close(out_sparse.loss, out_dense.loss)
    out_sparse.loss.backward()
    out_dense.loss.backward()
    for (name, p), q in zip(sparse.named_parameters(), dense.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    with pytest.raises(ValueError, match=r"labels must have shape \(B, T\)"):
        sparse(batch["input_ids"], labels=batch["labels"][:, :5])


def test_objective_names_and_configs(tokenizer):
    assert objective_config("plm") == {}
    assert objective_config("clm")["attn_type"] == "uni"
    with pytest.raises(ValueError, match="objective must be one of"):
        objective_config("bert")
    with pytest.raises(ValueError, match="mlm_probability"):
        make_collator("mlm", tokenizer, mlm_probability=1.0)
    assert type(make_collator("plm", tokenizer)).__name__ == "DataCollatorForXLNetPretraining"
