"""The heads transformers' XLNet has beyond the LM and sequence classifier (token classification, multiple choice,
question answering simple and SQuAD 2.0): equal to transformers' heads with the same weights, converted both ways,
saved and loaded through the Auto classes and remote code, finetuned, and refusing bad input by name. Also the
model-wide keyword rules: unknown keywords raise TypeError; the Trainer's num_items_in_batch scales the loss."""

import copy
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers
from model_helpers import BLOCK_XLNET_LITE, TINY, randomise, run_both, segments_and_left_padding, twins

import xlnet_lite
from xlnet_lite import (
    XLNetLiteConfig,
    XLNetLiteForMultipleChoice,
    XLNetLiteForQuestionAnswering,
    XLNetLiteForQuestionAnsweringSimple,
    XLNetLiteForTokenClassification,
)
from xlnet_lite.modeling_xlnet_lite import CACHE_NAME

B, T, C = 4, 12, 3
ATOL = 1e-4


def close(a, b):
    torch.testing.assert_close(a, b, atol=ATOL, rtol=1e-4)


def ids(seed=0, shape=(B, T)):
    return torch.randint(0, 97, shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------------------
# Equal to transformers' heads


def test_token_classification(impl):
    hf, lite = twins("XLNetForTokenClassification", num_labels=5)
    labels = torch.randint(0, 5, (B, T), generator=torch.Generator().manual_seed(1))
    labels[:, ::3] = -100  # later sub-word pieces and padding carry no label
    a, b = run_both(hf, lite, impl, input_ids=ids(), labels=labels, **segments_and_left_padding((B, T)))
    assert b.logits.shape == (B, T, 5)
    close(a.logits, b.logits)
    close(a.loss, b.loss)


def test_multiple_choice(impl):
    hf, lite = twins("XLNetForMultipleChoice")
    a, b = run_both(
        hf,
        lite,
        impl,
        input_ids=ids(shape=(B, C, T)),
        labels=torch.tensor([0, 2, 1, 2]),
        **segments_and_left_padding((B, C, T)),
    )
    assert b.logits.shape == (B, C)
    close(a.logits, b.logits)
    close(a.loss, b.loss)


def test_question_answering_simple(impl):
    hf, lite = twins("XLNetForQuestionAnsweringSimple")
    spans = dict(start_positions=torch.tensor([0, 3, 5, 11]), end_positions=torch.tensor([2, 3, 9, 11]))
    a, b = run_both(hf, lite, impl, input_ids=ids(), **spans, **segments_and_left_padding((B, T)))
    assert b.start_logits.shape == b.end_logits.shape == (B, T)
    close(a.start_logits, b.start_logits)
    close(a.end_logits, b.end_logits)
    close(a.loss, b.loss)


def squad_inputs():
    p_mask = torch.zeros(B, T)
    p_mask[:, :4] = 1  # the question
    p_mask[:, -1] = 1  # <cls>
    return dict(input_ids=ids(), p_mask=p_mask, cls_index=torch.full((B,), T - 1), **segments_and_left_padding((B, T)))


def test_squad_head_beam_search(impl):
    hf, lite = twins("XLNetForQuestionAnswering", start_n_top=3, end_n_top=2)
    a, b = run_both(hf, lite, impl, **squad_inputs())
    assert b.start_top_index.shape == (B, 3) and b.end_top_index.shape == (B, 6) and b.cls_logits.shape == (B,)
    assert torch.equal(a.start_top_index, b.start_top_index)
    assert torch.equal(a.end_top_index, b.end_top_index)
    assert (b.start_top_index >= 4).all() and (b.start_top_index < T - 1).all()  # p_mask respected
    for name in ("start_top_log_probs", "end_top_log_probs", "cls_logits"):
        close(getattr(a, name), getattr(b, name))


@pytest.mark.parametrize("with_answer_class", [False, True])
def test_squad_head_losses(impl, with_answer_class):
    hf, lite = twins("XLNetForQuestionAnswering")
    inputs = squad_inputs()
    inputs.update(start_positions=torch.tensor([4, 6, 5, 10]), end_positions=torch.tensor([5, 9, 5, 10]))
    if with_answer_class:
        inputs["is_impossible"] = torch.tensor([0.0, 1.0, 0.0, 1.0])
    else:
        del inputs["cls_index"]
    a, b = run_both(hf, lite, impl, **inputs)
    close(a.loss, b.loss)
    assert b.start_top_index is None  # training: the loss only


def test_outputs_mems_hidden_states_attentions_and_tuples():
    hf, lite = twins("XLNetForTokenClassification", num_labels=5, mem_len=6)
    with torch.no_grad():
        a = hf(ids(), use_mems=True, output_hidden_states=True, output_attentions=True)
        b = lite(ids(), use_mems=True, output_hidden_states=True, output_attentions=True)
        second = dict(input_ids=ids(1), labels=torch.zeros(B, T, dtype=torch.long), return_dict=False)
        a2, b2 = hf(**second, mems=a.mems), lite(**second, mems=b.mems)
    for x, y in zip(a.mems, b.mems, strict=True):
        close(x.transpose(0, 1), y)  # transformers' mems are time-major
    for x, y in zip(a.hidden_states, b.hidden_states, strict=True):
        close(x, y)
    for x, y in zip(a.attentions, b.attentions, strict=True):
        close(x, y)
    assert len(a2) == len(b2)  # (loss, logits, mems)
    close(a2[0], b2[0])
    close(a2[1], b2[1])


@pytest.mark.parametrize(
    "cls_name",
    [
        "XLNetForTokenClassification",
        "XLNetForMultipleChoice",
        "XLNetForQuestionAnsweringSimple",
        "XLNetForQuestionAnswering",
    ],
)
def test_round_trip_to_transformers(cls_name):
    hf, lite = twins(cls_name)
    back = xlnet_lite.to_hf_xlnet(lite).eval()
    assert type(back) is type(hf)
    for (name, p), (name2, q) in zip(hf.state_dict().items(), back.state_dict().items(), strict=True):
        assert name == name2 and torch.equal(p, q)
    x = ids(shape=(B, C, T)) if cls_name == "XLNetForMultipleChoice" else ids()
    with torch.no_grad():
        torch.testing.assert_close(hf(x)[0], back(x)[0], atol=0, rtol=0)


def test_untie_r_false_round_trip_for_a_new_head():
    lite = randomise(XLNetLiteForTokenClassification(XLNetLiteConfig(**TINY, untie_r=False, num_labels=3))).eval()
    hf = xlnet_lite.to_hf_xlnet(lite).eval()
    with torch.no_grad():
        close(hf(ids()).logits, lite(ids()).logits)


# ----------------------------------------------------------------------------------------------------------
# Auto classes and remote code

HEADS = [
    (XLNetLiteForTokenClassification, "AutoModelForTokenClassification", {"input_ids": ids()}),
    (XLNetLiteForMultipleChoice, "AutoModelForMultipleChoice", {"input_ids": ids(shape=(2, C, T))}),
    (XLNetLiteForQuestionAnsweringSimple, "AutoModelForQuestionAnswering", {"input_ids": ids()}),
    (
        XLNetLiteForQuestionAnswering,
        "AutoModelForQuestionAnswering",
        {"input_ids": ids(), "cls_index": torch.zeros(B, dtype=torch.long)},
    ),
]


# A loaded model computes with the same weights at other addresses (safetensors' are not 64-byte aligned), where
# the CPU kernels may round a single-row product differently: the last bits only, far under any wrong weight's effect.
SAME_WEIGHTS = dict(atol=1e-6, rtol=1e-6)


def save_head(folder, cls):
    model = randomise(cls(XLNetLiteConfig(**TINY, num_labels=2, start_n_top=3, end_n_top=2))).eval()
    model.save_pretrained(folder)
    return model


def test_auto_classes_in_process(tmp_path):
    for cls, auto_name, inputs in HEADS[:3]:  # the SQuAD head loads by its class, as transformers' XLNet
        model = save_head(tmp_path / cls.__name__, cls)
        config = json.loads((tmp_path / cls.__name__ / "config.json").read_text())
        assert config["auto_map"][auto_name].endswith(cls.__name__)
        loaded = getattr(transformers, auto_name).from_pretrained(tmp_path / cls.__name__).eval()
        assert type(loaded) is cls
        with torch.no_grad():
            torch.testing.assert_close(model(**inputs)[0], loaded(**inputs)[0], **SAME_WEIGHTS)
    squad = save_head(tmp_path / "squad", XLNetLiteForQuestionAnswering)
    assert type(XLNetLiteForQuestionAnswering.from_pretrained(tmp_path / "squad")) is XLNetLiteForQuestionAnswering
    assert json.loads((tmp_path / "squad" / "config.json").read_text())["auto_map"][
        "AutoModelForQuestionAnswering"
    ].endswith("XLNetLiteForQuestionAnswering")
    assert squad.config.start_n_top == 3


REMOTE = BLOCK_XLNET_LITE + textwrap.dedent(
    """
    import torch, transformers
    for folder, auto_name in zip(sys.argv[1::2], sys.argv[2::2]):
        model = getattr(transformers, auto_name).from_pretrained(folder, trust_remote_code=True).eval()
        inputs = torch.load(folder + "/inputs.pt", weights_only=True)
        with torch.no_grad():
            torch.save(model(**inputs)[0], folder + "/remote_out.pt")
        print(type(model).__module__, type(model).__name__)
    assert "xlnet_lite" not in sys.modules
    """
)


@pytest.mark.slow
def test_trust_remote_code_in_a_fresh_process(tmp_path):
    argv, expected = [], {}
    for cls, auto_name, inputs in HEADS:
        folder = tmp_path / cls.__name__
        model = save_head(folder, cls)
        torch.save(inputs, folder / "inputs.pt")
        with torch.no_grad():
            expected[cls.__name__] = model(**inputs)[0]
        argv += [str(folder), auto_name]
    workdir = tmp_path / "elsewhere"  # not the package's folder: nothing on sys.path can hide a missing file
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-c", REMOTE, *argv], cwd=workdir, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for cls, _, _ in HEADS:
        assert "transformers_modules" in result.stdout and f" {cls.__name__}\n" in result.stdout
        out = torch.load(tmp_path / cls.__name__ / "remote_out.pt", weights_only=True)
        torch.testing.assert_close(out, expected[cls.__name__], **SAME_WEIGHTS)


# ----------------------------------------------------------------------------------------------------------
# Finetuning the token classifier


def word_tagging_data(num_sentences=24, words_per_sentence=6, seed=0):
    """Sentences of made-up words, each word 1-3 sub-word pieces (ids 10..96); each word has one of 3 tags. Labels:
    the tag on a word's first piece, -100 on its other pieces."""
    gen = torch.Generator().manual_seed(seed)
    lexicon = [
        torch.randint(10, 97, (int(torch.randint(1, 4, (1,), generator=gen)),), generator=gen) for _ in range(12)
    ]
    tags = torch.randint(0, 3, (len(lexicon),), generator=gen)
    rows, labels = [], []
    for _ in range(num_sentences):
        pieces, tagged = [], []
        for w in torch.randint(0, len(lexicon), (words_per_sentence,), generator=gen).tolist():
            pieces += lexicon[w].tolist()
            tagged += [int(tags[w])] + [-100] * (len(lexicon[w]) - 1)
        rows.append(pieces)
        labels.append(tagged)
    width = max(map(len, rows))
    input_ids = torch.full((num_sentences, width), 5)
    label_ids = torch.full((num_sentences, width), -100)
    attention_mask = torch.zeros(num_sentences, width, dtype=torch.long)
    for i, (r, row_labels) in enumerate(zip(rows, labels)):  # right padding is fine for token classification
        input_ids[i, : len(r)], label_ids[i, : len(row_labels)], attention_mask[i, : len(r)] = (
            torch.tensor(r),
            torch.tensor(row_labels),
            1,
        )
    return dict(input_ids=input_ids, attention_mask=attention_mask, labels=label_ids)


@pytest.mark.slow
def test_finetune_token_classification_on_word_tags():
    torch.manual_seed(0)
    model = XLNetLiteForTokenClassification(XLNetLiteConfig(**TINY, num_labels=3))
    data = word_tagging_data()
    labelled = data["labels"] != -100
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    losses = []
    for step in range(25):
        batch = {k: v[(step % 3) * 8 : (step % 3 + 1) * 8] for k, v in data.items()}
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        out = model(**data)
    manual = torch.nn.functional.cross_entropy(out.logits[labelled], data["labels"][labelled])
    torch.testing.assert_close(out.loss, manual)  # pieces labelled -100 and padding do not count
    accuracy = (out.logits.argmax(-1)[labelled] == data["labels"][labelled]).float().mean().item()
    assert losses[0] > 0.8 and out.loss.item() < 0.25 and accuracy > 0.9, (losses[0], out.loss.item(), accuracy)


# ----------------------------------------------------------------------------------------------------------
# Bad input: ValueError naming the argument


def head(cls, **overrides):
    torch.manual_seed(0)
    return randomise(cls(XLNetLiteConfig(**{**TINY, "num_labels": 2, **overrides}))).eval()


BAD = [
    (XLNetLiteForMultipleChoice, dict(input_ids=ids()), r"input_ids must have shape \(B, C, T\)"),
    (
        XLNetLiteForMultipleChoice,
        dict(input_ids=ids(shape=(B, C, T)), attention_mask=torch.ones(B, T)),
        r"attention_mask must start with the \(B, C\)",
    ),
    (
        XLNetLiteForMultipleChoice,
        dict(input_ids=ids(shape=(B, C, T)), labels=torch.tensor([0, 1, 2, 3])),
        r"choice indices in \[0, num_choices=3\)",
    ),
    (
        XLNetLiteForMultipleChoice,
        dict(input_ids=ids(shape=(B, C, T)), labels=torch.zeros(B, C, dtype=torch.long)),
        r"labels must have shape \(B,\)",
    ),
    (
        XLNetLiteForTokenClassification,
        dict(input_ids=ids(), labels=torch.zeros(B, T + 1, dtype=torch.long)),
        r"labels must have shape \(B, T\)",
    ),
    (XLNetLiteForTokenClassification, dict(input_ids=ids(), labels=torch.full((B, T), 2)), r"\[0, num_labels=2\)"),
    (
        XLNetLiteForQuestionAnsweringSimple,
        dict(
            input_ids=ids(), start_positions=torch.tensor([0, 1, 2, T]), end_positions=torch.zeros(B, dtype=torch.long)
        ),
        r"start_positions must be positions in \[0, T=12\)",
    ),
    (
        XLNetLiteForQuestionAnsweringSimple,
        dict(input_ids=ids(), start_positions=torch.zeros(B, dtype=torch.long), end_positions=torch.full((B,), -1)),
        "end_positions must be positions",
    ),
    (
        XLNetLiteForQuestionAnsweringSimple,
        dict(
            input_ids=ids(),
            start_positions=torch.zeros(B, 2, dtype=torch.long),
            end_positions=torch.zeros(B, dtype=torch.long),
        ),
        r"start_positions must have shape \(B,\)",
    ),
    (
        XLNetLiteForQuestionAnsweringSimple,
        dict(input_ids=ids(), end_positions=torch.zeros(B, dtype=torch.long)),
        "Pass both start_positions and end_positions",
    ),
    (
        XLNetLiteForQuestionAnswering,
        dict(input_ids=ids(), p_mask=torch.zeros(B, T + 1)),
        r"p_mask must have shape \(B, T\)",
    ),
    (XLNetLiteForQuestionAnswering, dict(input_ids=ids(), p_mask=torch.full((B, T), 0.5)), "p_mask must hold 0"),
    (
        XLNetLiteForQuestionAnswering,
        dict(input_ids=ids(), cls_index=torch.full((B,), T)),
        "cls_index must be positions",
    ),
    (
        XLNetLiteForQuestionAnswering,
        dict(input_ids=ids(), start_positions=torch.zeros(B, dtype=torch.long), end_positions=torch.full((B,), 99)),
        r"end_positions must be positions in \[0, T",
    ),
    (
        XLNetLiteForQuestionAnswering,
        dict(
            input_ids=ids(),
            start_positions=torch.zeros(B, dtype=torch.long),
            end_positions=torch.zeros(B, dtype=torch.long),
            cls_index=torch.zeros(B, dtype=torch.long),
            is_impossible=torch.zeros(B, 2),
        ),
        r"is_impossible must have shape \(B,\)",
    ),
    (XLNetLiteForQuestionAnswering, dict(input_ids=ids(shape=(B, 4))), r"start_n_top \(5\).*T=4"),
]


@pytest.mark.parametrize("cls,inputs,message", BAD, ids=[f"{c.__name__[10:]}-{i}" for i, (c, _, _) in enumerate(BAD)])
def test_bad_input_names_the_argument(cls, inputs, message):
    with pytest.raises(ValueError, match=message):
        head(cls)(**inputs)


def test_simple_qa_needs_two_labels():
    with pytest.raises(ValueError, match="num_labels == 2"):
        XLNetLiteForQuestionAnsweringSimple(XLNetLiteConfig(**TINY, num_labels=3))


# ----------------------------------------------------------------------------------------------------------
# Keywords: unknown ones raise, transformers' machinery's are honoured

ALL_CLASSES = [
    xlnet_lite.XLNetLiteModel,
    xlnet_lite.XLNetLiteLMHeadModel,
    xlnet_lite.XLNetLiteForSequenceClassification,
    XLNetLiteForTokenClassification,
    XLNetLiteForMultipleChoice,
    XLNetLiteForQuestionAnsweringSimple,
    XLNetLiteForQuestionAnswering,
]


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_unknown_keyword_raises_type_error_naming_it(cls):
    model = head(cls)
    x = ids(shape=(B, C, T)) if cls is XLNetLiteForMultipleChoice else ids()
    with pytest.raises(TypeError, match="target_maping"):
        model(x, target_maping=torch.zeros(B, 1, T))


def test_generation_keywords_are_accepted():
    model = head(xlnet_lite.XLNetLiteLMHeadModel)
    with torch.no_grad():
        out = model(
            ids(),
            use_cache=True,
            cache=None,
            cache_position=torch.arange(T),
            logits_to_keep=1,
            predict_next=True,
            use_mems=False,
            output_attentions=False,
            output_hidden_states=False,
        )
    assert out.logits.shape == (B, 1, 97) and isinstance(out[CACHE_NAME], xlnet_lite.XLNetLiteCache)


def test_the_cache_is_taken_under_either_name():
    """transformers 5.24 renamed generate()'s past_key_values to cache: a step fed the cache under either name
    gives the same logits, and both at once is an error."""
    model = head(xlnet_lite.XLNetLiteLMHeadModel)
    x = ids()
    with torch.no_grad():
        steps = []
        for name in ("cache", "past_key_values"):
            cache = model(x, use_cache=True, predict_next=True, use_mems=False)[CACHE_NAME]
            steps.append(model(x[:, -2:], use_cache=True, predict_next=True, use_mems=False, **{name: cache}).logits)
        torch.testing.assert_close(steps[0], steps[1], rtol=0, atol=0)
        with pytest.raises(ValueError, match="not both"):
            model(x, use_cache=True, cache=cache, past_key_values=cache)


@pytest.mark.parametrize(
    "cls,labels",
    [
        (xlnet_lite.XLNetLiteLMHeadModel, torch.randint(0, 97, (B, T))),
        (XLNetLiteForTokenClassification, torch.randint(0, 2, (B, T))),
        (xlnet_lite.XLNetLiteForSequenceClassification, torch.tensor([0, 1, 1, 0])),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_num_items_in_batch_divides_the_summed_loss(cls, labels):
    model = head(cls)
    labels = labels.clone()
    if labels.dim() == 2:
        labels[:, :5] = -100
    with torch.no_grad():
        mean = model(ids(), labels=labels).loss
        scaled = model(ids(), labels=labels, num_items_in_batch=torch.tensor(37)).loss
    count = (labels != -100).sum()
    torch.testing.assert_close(scaled * 37, mean * count)


def test_trainer_gradient_accumulation_equals_one_big_batch(tmp_path):
    """Two micro-batches with different numbers of labelled tokens, accumulated by the Trainer, take the same SGD
    step as the whole batch at once (the mean over all labelled tokens): the Trainer passes num_items_in_batch."""
    torch.manual_seed(0)
    model = XLNetLiteForTokenClassification(XLNetLiteConfig(**TINY, num_labels=3))
    reference = copy.deepcopy(model)
    data = word_tagging_data(num_sentences=4)
    data["labels"][:2, 4:] = -100  # the first pair has far fewer labelled tokens than the second
    examples = [{k: v[i] for k, v in data.items()} for i in range(4)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=1,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=examples)
    assert trainer.model_accepts_loss_kwargs
    trainer.train()
    reference(**data).loss.backward()
    with torch.no_grad():
        for (name, p), q in zip(reference.named_parameters(), model.parameters(), strict=True):
            if p.grad is not None:
                p -= 0.5 * p.grad
            torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-5, msg=name)
