"""A BERT masked-LM baseline for XLNet-Lite's permutation-LM pretraining, built from transformers' own classes.

`pretrain_mlm` trains a `BertForMaskedLM` of an XLNet-Lite preset's size (`bert_config_like`) on the same documents
and tokenizer, under the same wall-clock rule as `pretrain/run_pretraining.py --max_train_minutes`: the clock counts
the seconds inside training steps (batch, forward, backward, optimizer), the learning rate warms up and then decays
linearly to zero at the deadline (`training.TimeBudget`), AdamW with `training.parameter_groups`, gradients clipped at
1.0, the LM bias started at the unigram log-probabilities. `finetune_bert_classifier` finetunes the result (or a
random initialisation) as `finetune/run_glue.py` does XLNet-Lite: the same batches in the same order for a seed, best
epoch on validation accuracy, test accuracy with it.

Inputs use BERT's layout, `<cls> A <sep>`, padded on the RIGHT, with the XLNet-Lite tokenizer's `<cls>`, `<sep>`,
`<pad>` and `<mask>`; token type ids are all 0.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import numpy as np
import torch

from xlnet_lite import training
from xlnet_lite.model_utils import MODEL_PRESETS, init_lm_bias_at_unigram, unigram_cross_entropy, unigram_log_probs
from xlnet_lite.tokenization_xlnet_lite import special_token_ids


def _autocast(device, mixed_precision):
    """bf16 autocast as accelerate's `mixed_precision="bf16"` (the XLNet-Lite recipes' on a machine with fast bf16),
    or nothing ("no": fp32)."""
    if mixed_precision not in ("no", "bf16"):
        raise ValueError(f"mixed_precision must be 'no' or 'bf16', got {mixed_precision!r}")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=mixed_precision == "bf16")


def _device(device):
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def _ids(tokenizer):
    """(cls, sep, pad) ids; ValueError when the tokenizer lacks one."""
    ids = special_token_ids(tokenizer)
    missing = [t for t in ("<cls>", "<sep>", "<pad>") if ids[t] is None]
    if missing:
        raise ValueError(f"tokenizer lacks {missing}")
    return ids["<cls>"], ids["<sep>"], ids["<pad>"]


# ---------------------------------------------------------------------------------------------------------
# Config


def bert_config_like(
    xlnet_config_or_preset, vocab_size, max_position_embeddings=512, *, dropout=0.0, pad_token_id=None
):
    """A `BertConfig` of the size of an XLNet-Lite model: hidden_size = d_model, num_hidden_layers = n_layer,
    num_attention_heads = n_head, intermediate_size = d_inner, the same activation (gelu), initializer range and
    LayerNorm epsilon; `dropout` on hidden states and attention probabilities (0.0: XLNet-Lite's pretraining
    default). `xlnet_config_or_preset`: a name of `MODEL_PRESETS`, a dict of such fields, an XLNet-Lite or
    transformers XLNet config, or a folder holding one. BERT adds absolute position embeddings
    (`max_position_embeddings`), two token types and the MLM head's dense + LayerNorm, which XLNet lacks."""
    from transformers import AutoConfig, BertConfig

    source = xlnet_config_or_preset
    if isinstance(source, str) and source in MODEL_PRESETS:
        source = MODEL_PRESETS[source]
    elif isinstance(source, (str, Path)):
        source = AutoConfig.from_pretrained(source)
    get = source.get if isinstance(source, dict) else lambda key, default=None: getattr(source, key, default)
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=get("d_model"),
        num_hidden_layers=get("n_layer"),
        num_attention_heads=get("n_head"),
        intermediate_size=get("d_inner"),
        hidden_act=get("ff_activation", "gelu"),
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        max_position_embeddings=max_position_embeddings,
        type_vocab_size=2,
        initializer_range=get("initializer_range", 0.02),
        layer_norm_eps=get("layer_norm_eps", 1e-12),
        pad_token_id=pad_token_id,
    )


def bert_tokenizer(tokenizer):
    """A copy of an XLNet-Lite tokenizer that encodes as BERT does: `<cls> A <sep>` (a pair: `<cls> A <sep> B <sep>`,
    token types 0 then 1), padded on the right with token type 0. Saved next to the BERT models."""
    from tokenizers import processors

    cls_id, sep_id, _ = _ids(tokenizer)
    bert = copy.deepcopy(tokenizer)
    bert.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{tokenizer.cls_token}:0 $A:0 {tokenizer.sep_token}:0",
        pair=f"{tokenizer.cls_token}:0 $A:0 {tokenizer.sep_token}:0 $B:1 {tokenizer.sep_token}:1",
        special_tokens=[(tokenizer.cls_token, cls_id), (tokenizer.sep_token, sep_id)],
    )
    bert.padding_side = "right"
    bert._pad_token_type_id = 0
    return bert


# ---------------------------------------------------------------------------------------------------------
# Pretraining


def mlm_blocks(texts, tokenizer, seq_len=128):
    """The documents as MLM inputs: tokenized without special tokens (`data.tokenize_documents`, as XLNet-Lite's
    pretraining reads them; empty documents dropped), concatenated with `<sep>` between documents, and cut into
    consecutive pieces of seq_len - 2 tokens, each wrapped as `<cls> ... <sep>` (the remainder is dropped).
    Returns a LongTensor (n_blocks, seq_len); the same texts give the same blocks."""
    from xlnet_lite.data import tokenize_documents

    if seq_len < 3:
        raise ValueError(f"seq_len must be at least 3 (<cls>, a token, <sep>), got {seq_len}")
    cls_id, sep_id, _ = _ids(tokenizer)
    docs = [np.asarray(ids, dtype=np.int64) for ids in tokenize_documents(texts, tokenizer)["input_ids"]]
    pieces = []
    for k, doc in enumerate(docs):
        if k:
            pieces.append(np.array([sep_id], dtype=np.int64))
        pieces.append(doc)
    stream = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    body = seq_len - 2
    n_blocks = len(stream) // body
    blocks = np.empty((n_blocks, seq_len), dtype=np.int64)
    blocks[:, 0], blocks[:, -1] = cls_id, sep_id
    blocks[:, 1:-1] = stream[: n_blocks * body].reshape(n_blocks, body)
    return torch.from_numpy(blocks)


def _mlm_collator(tokenizer, mlm_probability, seed):
    """transformers' DataCollatorForLanguageModeling (80% <mask>, 10% random token, 10% unchanged) with its own
    generator. It never masks the tokenizer's `all_special_ids`; `<cls>`, `<sep>` and `<pad>` must be among them."""
    from transformers import DataCollatorForLanguageModeling

    specials = set(tokenizer.all_special_ids)
    absent = [t for t, i in zip(("<cls>", "<sep>", "<pad>"), _ids(tokenizer)) if i not in specials]
    if absent or tokenizer.mask_token is None:
        raise ValueError(f"tokenizer: {absent or '<mask>'} not among its special tokens; the collator would mask them")
    return DataCollatorForLanguageModeling(tokenizer, mlm_probability=mlm_probability, seed=seed)


def _block_order(n_blocks, batch_size, seed):
    """Batches of block indices: a seeded permutation per epoch, read consecutively (every batch full)."""
    rng = np.random.default_rng(seed)
    pending = np.zeros(0, dtype=np.int64)
    while True:
        while len(pending) < batch_size:
            pending = np.concatenate([pending, rng.permutation(n_blocks)])
        yield pending[:batch_size]
        pending = pending[batch_size:]


@torch.no_grad()
def _mlm_eval(model, blocks, tokenizer, *, mlm_probability, seed, batch_size, device):
    """Mean MLM loss (nats per masked token) of `blocks` under fixed masks, and the masked targets."""
    collator = _mlm_collator(tokenizer, mlm_probability, seed)
    model.eval()
    total, count, labels = 0.0, 0, []
    for i in range(0, len(blocks), batch_size):
        batch = collator(list(blocks[i : i + batch_size]))
        n = int((batch["labels"] != -100).sum())
        if n:
            out = model(input_ids=batch["input_ids"].to(device), labels=batch["labels"].to(device))
            total, count = total + out.loss.item() * n, count + n
        labels.append(batch["labels"])
    model.train()
    return total / max(count, 1), torch.cat(labels)


def pretrain_mlm(
    texts,
    tokenizer,
    *,
    minutes=None,
    max_steps=None,
    lr_scheduler_type="linear",
    learning_rate,
    output_dir,
    batch_size=16,
    seq_len=128,
    warmup_steps=100,
    weight_decay=0.01,
    mlm_probability=0.15,
    seed=0,
    eval_texts=None,
    model_size="small",
    dropout=0.0,
    adam_epsilon=1e-8,
    max_grad_norm=1.0,
    logging_steps=50,
    device=None,
    mixed_precision="no",
    log=print,
) -> dict:
    """Train a BertForMaskedLM of `model_size` (a preset name, or anything `bert_config_like` takes) on `texts` for
    `minutes` of training steps, or for `max_steps` steps under transformers' `lr_scheduler_type` schedule (as
    `run_pretraining.py --max_steps`; the equal-compute comparison of benchmarks.objectives), save it and a BERT-layout
    copy of the tokenizer (`bert_tokenizer`) in `output_dir`, and return what happened (steps, train_seconds,
    tokens_seen, losses, parameters, tokens_per_second).

    Blocks (`mlm_blocks`) are visited in a seeded random order, epoch after epoch; masking is transformers'
    DataCollatorForLanguageModeling (seeded by `seed`); the clock is that of
    `run_pretraining.py --max_train_minutes` (`training.TimeBudget`), with its linear schedule (warmup `warmup_steps`);
    the LM bias starts at the unigram log-probabilities of the maskable training tokens. `eval_texts`: MLM loss of their
    blocks at the end, under fixed masks (seed + 1), with the unigram baseline on the same targets. `mixed_precision`
    "bf16": forward passes under bf16 autocast (weights, gradients and optimizer in fp32), as accelerate's."""
    from accelerate.utils import set_seed
    from transformers import BertForMaskedLM, get_scheduler

    if (minutes is None) == (max_steps is None):
        raise ValueError("pass one of minutes (a wall-clock budget) or max_steps")
    device = _device(device)
    autocast = _autocast(device, mixed_precision)
    blocks = mlm_blocks(texts, tokenizer, seq_len)
    if len(blocks) == 0:
        raise ValueError(f"texts: fewer than seq_len - 2 = {seq_len - 2} tokens, not one block")
    eval_blocks = None
    if eval_texts is not None:
        eval_blocks = mlm_blocks(eval_texts, tokenizer, seq_len)
        if len(eval_blocks) == 0:
            raise ValueError(f"eval_texts: fewer than seq_len - 2 = {seq_len - 2} tokens, not one block")
    collator = _mlm_collator(tokenizer, mlm_probability, seed)
    vocab_size = len(tokenizer)

    set_seed(seed)
    config = bert_config_like(
        model_size, vocab_size, max(512, seq_len), dropout=dropout, pad_token_id=tokenizer.pad_token_id
    )
    model = BertForMaskedLM(config)
    counts = np.bincount(blocks.flatten().numpy(), minlength=vocab_size)
    counts[list(tokenizer.all_special_ids)] = 0  # never targets
    log_probs = unigram_log_probs(counts, vocab_size)
    init_lm_bias_at_unigram(model, log_probs)  # decoder.bias, tied to cls.predictions.bias
    model.to(device).train()
    parameters = model.num_parameters()
    log(
        f"mlm baseline: BERT {parameters / 1e6:.2f}M parameters ({config.num_hidden_layers} layers, hidden "
        f"{config.hidden_size}); {len(blocks)} blocks of {seq_len} tokens; vocab {vocab_size}; "
        + (f"{minutes} minutes" if max_steps is None else f"{max_steps} steps")
    )

    optimizer = training.make_adamw(model, learning_rate=learning_rate, weight_decay=weight_decay, eps=adam_epsilon)
    if max_steps is None:
        budget = training.TimeBudget(minutes, warmup_steps=warmup_steps, schedule="linear")
        scheduler = training.make_budget_scheduler(optimizer, budget, num_processes=1)
    else:
        budget = None
        scheduler = get_scheduler(
            lr_scheduler_type, optimizer, num_warmup_steps=warmup_steps, num_training_steps=max_steps
        )
    order = _block_order(len(blocks), batch_size, seed)

    def done():
        return budget.expired() if budget is not None else step >= max_steps

    step, elapsed, losses, learning_rates = 0, 0.0, [], []
    while not done():
        start = time.perf_counter()  # the step: batch, forward, backward, optimizer (as TrainLoop.elapsed)
        batch = collator(list(blocks[next(order)]))
        with autocast:
            out = model(input_ids=batch["input_ids"].to(device), labels=batch["labels"].to(device))
        loss = out.loss.item()
        if not math.isfinite(loss):
            raise FloatingPointError(f"non-finite MLM loss ({loss}) at step {step + 1}; lower learning_rate")
        out.loss.backward()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        learning_rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed += time.perf_counter() - start
        if budget is not None:
            budget.elapsed = elapsed
        step += 1
        losses.append(loss)
        if step % logging_steps == 0 or done():
            log(
                f"step {step}: loss {np.mean(losses[-logging_steps:]):.3f}, lr {learning_rates[-1]:.2e}, {elapsed:.1f}s"
            )

    results = {
        "steps": step,
        "train_seconds": elapsed,
        "tokens_seen": step * batch_size * seq_len,
        "first_train_loss": losses[0],
        "final_train_loss": float(np.mean(losses[-20:])),
        "eval_mlm_loss": None,
        "unigram_baseline_loss": None,
        "learning_rate": learning_rate,
        "last_step_learning_rate": learning_rates[-1],
        "minutes": minutes,
        "parameters": parameters,
        "tokens_per_second": step * batch_size * seq_len / elapsed,
        "train_blocks": len(blocks),
        "mixed_precision": mixed_precision,
    }
    if eval_blocks is not None:
        with autocast:
            results["eval_mlm_loss"], labels = _mlm_eval(
                model,
                eval_blocks,
                tokenizer,
                mlm_probability=mlm_probability,
                seed=seed + 1,
                batch_size=batch_size,
                device=device,
            )
        results["unigram_baseline_loss"] = unigram_cross_entropy(log_probs, labels)
        log(
            f"eval MLM loss {results['eval_mlm_loss']:.3f} nats (unigram baseline "
            f"{results['unigram_baseline_loss']:.3f}) on {len(eval_blocks)} blocks"
        )
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    bert_tokenizer(tokenizer).save_pretrained(output_dir)
    return results


# ---------------------------------------------------------------------------------------------------------
# Finetuning


def _encode(split, tokenizer, *, max_seq_length, targets, max_samples=None):
    """[(input_ids, label)] of a split: `<cls> sentence <sep>`, the sentence cut to max_seq_length - 2 tokens."""
    from xlnet_lite.classification_data import Split, text_columns

    first, second = text_columns(split)
    if second is not None:
        raise ValueError(f"{split.source}: sentence pairs are not supported; expected a `sentence` column")
    data = split.data if max_samples is None else split.data.select(range(min(max_samples, len(split.data))))
    cls_id, sep_id, _ = _ids(tokenizer)
    encoded = tokenizer(list(data[first]), add_special_tokens=False)["input_ids"]
    labels = targets(Split(data, split.source))
    return [
        ([cls_id, *ids[: max_seq_length - 2], sep_id], None if labels is None else labels[i])
        for i, ids in enumerate(encoded)
    ]


def _collate(examples, pad_id, device):
    """Right-padded input_ids, attention_mask and labels (None without labels)."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.tensor([ids + [pad_id] * (width - len(ids)) for ids, _ in examples], device=device)
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in examples], device=device)
    labels = None if examples[0][1] is None else torch.tensor([label for _, label in examples], device=device)
    return input_ids, mask, labels


@torch.no_grad()
def _accuracy(model, examples, pad_id, batch_size, device):
    if not examples or examples[0][1] is None:
        return None
    model.eval()
    correct = 0
    for i in range(0, len(examples), batch_size):
        input_ids, mask, labels = _collate(examples[i : i + batch_size], pad_id, device)
        correct += int((model(input_ids=input_ids, attention_mask=mask).logits.argmax(-1) == labels).sum())
    model.train()
    return correct / len(examples)


def finetune_bert_classifier(
    model_path_or_config,
    tokenizer,
    splits,
    *,
    seed,
    epochs=3,
    learning_rate=3e-4,
    max_seq_length=128,
    batch_size=16,
    eval_batch_size=64,
    dropout=0.1,
    weight_decay=0.0,
    warmup_steps=0,
    adam_epsilon=1e-6,
    max_grad_norm=1.0,
    max_train_samples=None,
    keep_last_epoch=False,
    device=None,
    mixed_precision="no",
) -> dict:
    """Finetune a BertForSequenceClassification from a `pretrain_mlm` folder (or a random one from a BertConfig) on
    `splits` (`classification_data.load_splits`: train, validation, test; a `sentence` column and a `label`
    column, ints, strings or ClassLabel, mapped as `read_labels` does). As `finetune/run_glue.py`: AdamW over
    `training.make_adamw` (eps 1e-6), linear schedule over epochs * steps, gradients clipped at 1.0, the
    batches of `SegmentCountBatchSampler` (the same batches, in the same order, as run_glue.py with this seed), the
    validation accuracy after each epoch, the best epoch's weights (kept in memory; the first on ties; the last with
    `keep_last_epoch`, as run_glue.py's --eval_strategy no) for the test accuracy. `train_seconds` counts the training
    steps only. `mixed_precision` "bf16": forward passes under bf16 autocast, as accelerate's."""
    from accelerate.utils import set_seed
    from transformers import BertConfig, BertForSequenceClassification, get_scheduler

    from xlnet_lite.classification_data import SegmentCountBatchSampler, label_ids, read_labels

    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be at least 3 (<cls>, a token, <sep>), got {max_seq_length}")
    device = _device(device)
    autocast = _autocast(device, mixed_precision)
    labels = read_labels(splits["train"])
    if labels.is_regression:
        raise ValueError(f"{splits['train'].source}: column `label` holds floats; only classification is supported")
    source = splits["train"].source

    def targets(split):
        return label_ids(split, labels, source)

    encode = dict(tokenizer=tokenizer, max_seq_length=max_seq_length, targets=targets)
    train = _encode(splits["train"], max_samples=max_train_samples, **encode)
    validation = _encode(splits["validation"], **encode) if "validation" in splits else []
    test = _encode(splits["test"], **encode) if "test" in splits else []
    _, _, pad_id = _ids(tokenizer)

    set_seed(seed)
    head = dict(labels.model_kwargs(), hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    if isinstance(model_path_or_config, BertConfig):
        config = copy.deepcopy(model_path_or_config)
        for key, value in head.items():
            setattr(config, key, value)
        model = BertForSequenceClassification(config)
    else:
        model = BertForSequenceClassification.from_pretrained(model_path_or_config, **head)
    if len(tokenizer) > model.config.vocab_size or max_seq_length > model.config.max_position_embeddings:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens and max_seq_length is {max_seq_length}; the model "
            f"has {model.config.vocab_size} and {model.config.max_position_embeddings} positions"
        )
    model.to(device).train()

    sampler = SegmentCountBatchSampler(np.ones(len(train), dtype=np.int64), batch_size, shuffle=True, seed=seed)
    steps_per_epoch = len(sampler)
    optimizer = training.make_adamw(model, learning_rate=learning_rate, weight_decay=weight_decay, eps=adam_epsilon)
    scheduler = get_scheduler(
        "linear", optimizer, num_warmup_steps=warmup_steps, num_training_steps=max(epochs * steps_per_epoch, 1)
    )

    elapsed, best, history = 0.0, None, []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        losses = []
        for indices in sampler:
            start = time.perf_counter()
            input_ids, mask, batch_labels = _collate([train[i] for i in indices], pad_id, device)
            with autocast:
                loss = model(input_ids=input_ids, attention_mask=mask, labels=batch_labels).loss
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite training loss ({loss.item()}) in epoch {epoch + 1}")
            loss.backward()
            if max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            elapsed += time.perf_counter() - start
        with autocast:
            score = _accuracy(model, validation, pad_id, eval_batch_size, device)
        history.append(
            {"epoch": epoch + 1, "train_loss": float(np.mean(losses)) if losses else None, "eval_accuracy": score}
        )
        if best is None or score is None or keep_last_epoch or score > best["score"]:  # no validation: the latest
            best = {
                "epoch": epoch + 1,
                "score": score,
                "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
            }
    if best is not None:
        model.load_state_dict(best["weights"])
    with autocast:
        eval_accuracy = best["score"] if best else _accuracy(model, validation, pad_id, eval_batch_size, device)
        test_accuracy = _accuracy(model, test, pad_id, eval_batch_size, device)
    return {
        "eval_accuracy": eval_accuracy,
        "test_accuracy": test_accuracy,
        "best_epoch": best["epoch"] if best else 0,
        "train_seconds": elapsed,
        "seed": seed,
        "history": history,
        "train_examples": len(train),
        "mixed_precision": mixed_precision,
    }
