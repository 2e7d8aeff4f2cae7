"""Sequence classification with XLNet-Lite, as the finetuning recipe (finetune/run_glue.py) runs it: the classifier
from a checkpoint (a head sized for the data's labels) or a config, one batch's forward (earlier segments read into
the Transformer-XL memory first), predictions in the split's row order (windows pooled per text), and their metrics.

Data layer: the model and the classification data, never xlnet_lite.training; the accelerator is passed in."""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoConfig

from .classification_data import Labels, pool_windows, text_labels
from .errors import RecipeError
from .glue_metrics import file_metrics, glue_metrics
from .model_utils import load_model, model_from_config, read_segments, reinit_top_layers
from .modeling_xlnet_lite import XLNetLiteForSequenceClassification
from .tokenization_xlnet_lite import load_tokenizer


def load_model_and_tokenizer(args, labels: Labels, train_source):
    """(model, tokenizer): the classifier from a checkpoint (a head sized for `labels`) or from a config."""
    path = args.model_name_or_path or args.config_name
    remote = {"trust_remote_code": args.trust_remote_code}
    tokenizer = load_tokenizer(args.tokenizer_name or path, **remote)
    tokenizer.padding_side = "left"
    cls = XLNetLiteForSequenceClassification
    if args.config_name:
        model = model_from_config(args.config_name, cls, **remote, **labels.model_kwargs(), **head_kwargs(args))
    else:
        config = AutoConfig.from_pretrained(path, **remote)
        kwargs = {**checkpoint_label_kwargs(config, labels, path, train_source), **head_kwargs(args)}
        model = load_model(path, cls, **remote, **kwargs)
        if args.reinit_layers > model.config.n_layer:
            raise RecipeError(f"--reinit_layers {args.reinit_layers}: {path} has {model.config.n_layer} layers")
        reinit_top_layers(model, args.reinit_layers)
    if len(tokenizer) > model.config.vocab_size:
        raise RecipeError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {model.config.vocab_size}"
        )
    if args.mem_len is not None:
        model.config.mem_len = args.mem_len
    # classification never runs the query stream (and DDP needs every trained parameter used)
    model.transformer.mask_emb.requires_grad_(False)
    return model, tokenizer


def head_kwargs(args) -> dict:
    """Config fields the finetuning flags set on the loaded model (the model's own where a flag is unset)."""
    chosen = {name: getattr(args, name) for name in ("summary_type", "attn_type")}
    return {"dropout": args.dropout, **{name: value for name, value in chosen.items() if value}}


def checkpoint_label_kwargs(config, labels: Labels, path, train_source):
    """Head arguments for from_pretrained. A checkpoint that already has a classifier must have as many outputs as
    the data has labels (its label order is kept when the names match)."""
    kwargs = labels.model_kwargs()
    if not any(arch.endswith("ForSequenceClassification") for arch in (config.architectures or [])):
        return kwargs  # a pretraining output: the head is newly initialised
    if config.num_labels != labels.num_labels:
        raise RecipeError(
            f"{path} has a classification head with {config.num_labels} labels ({list(config.id2label.values())}), "
            f"but column `label` of {train_source} has {labels.num_labels} ({labels.names or 'regression'}); "
            f"start from a checkpoint without a classification head (a pretraining output) or use matching data"
        )
    if not labels.is_regression and set(config.label2id) == set(labels.names):
        labels.names[:] = sorted(labels.names, key=config.label2id.get)
        kwargs = labels.model_kwargs()
    return kwargs


def classify(model, batch, accelerator, *, labels=None, backprop_all=False):
    """Read the prefix segments in order, carrying the memory, then classify the last segment from its <cls>. The
    prefix runs without gradient unless `backprop_all` (then gradient flows through every segment)."""
    mems = None
    if batch["prefix_input_ids"].shape[1]:
        core = accelerator.unwrap_model(model).transformer
        with torch.set_grad_enabled(backprop_all and torch.is_grad_enabled()), accelerator.autocast():
            mems = read_segments(
                core,
                batch["prefix_input_ids"],
                batch["prefix_token_type_ids"],
                mem_len=core.config.mem_len,
                keep_graph=backprop_all,
            )
    return model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"],
        mems=mems,
        use_mems=False,
        labels=labels,
    )


@torch.no_grad()
def predict(model, loader, accelerator, *, is_regression):
    """Predictions for every text of the loader's dataset (class ids or scores), in the split's row order whatever
    order the batches came in: rows are put back in the order of the `index` column (as tokenize_split numbers them),
    and in windows mode a text's windows are pooled (pool_windows)."""
    model.eval()
    outputs, indices = [], []
    for batch in tqdm(loader, desc="eval", leave=False, disable=not accelerator.is_local_main_process):
        logits = classify(model, batch, accelerator).logits.float()
        # the processes' batches of one round may differ in size (a segment count's last batch is short): pad to
        # gather, index -1 marking the padding
        outputs.append(accelerator.gather(accelerator.pad_across_processes(logits, pad_index=-1)).cpu())
        indices.append(accelerator.gather(accelerator.pad_across_processes(batch["index"], pad_index=-1)).cpu())
    outputs, indices = torch.cat(outputs).numpy(), torch.cat(indices).numpy()
    real = indices >= 0
    outputs, indices = outputs[real], indices[real]
    _, first = np.unique(indices, return_index=True)  # sorts, and drops duplicates added for even batches
    outputs = outputs[first][:, 0] if is_regression else outputs[first]
    dataset = loader.dataset
    if "text_index" in dataset.column_names:
        return pool_windows(outputs, dataset["text_index"], is_regression=is_regression)
    return outputs if is_regression else outputs.argmax(-1)


def compute_metrics(task_name, predictions, references, labels: Labels):
    """The GLUE task's metrics, or those of a file's labels (accuracy and F1; regression: correlations)."""
    if task_name:
        return glue_metrics(task_name, predictions, references)
    return file_metrics(predictions, references, is_regression=labels.is_regression, num_labels=labels.num_labels)


def labelled_eval_sets(loaders: dict, datasets: dict) -> dict:
    """{name: (loader, references)} for the validation splits that have labels, as `evaluate` takes them."""
    return {
        name: (loaders[name], text_labels(datasets[name]))
        for name in ("validation", "validation_mismatched")
        if name in loaders and "labels" in datasets[name].column_names
    }


def evaluate(model, eval_sets, accelerator, labels: Labels, *, task_name=None):
    """{"accuracy": ..., "accuracy_mm": ...}: every labelled validation split, {name: (loader, references)} (suffix
    _mm for MNLI mismatched)."""
    metrics = {}
    for name, (loader, references) in eval_sets.items():
        suffix = "_mm" if name == "validation_mismatched" else ""
        predictions = predict(model, loader, accelerator, is_regression=labels.is_regression)
        scores = compute_metrics(task_name, predictions, references, labels)
        metrics.update({k + suffix: v for k, v in scores.items()})
    return metrics


def predictions_tsv(predictions, labels: Labels) -> str:
    """predict_results.tsv: `index <tab> prediction` per text, a class by its label name or a score."""
    rows = [
        f"{i}\t{p:.6f}" if labels.is_regression else f"{i}\t{labels.names[int(p)]}" for i, p in enumerate(predictions)
    ]
    return "index\tprediction\n" + "".join(row + "\n" for row in rows)
