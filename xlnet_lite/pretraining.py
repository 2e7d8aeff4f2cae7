"""The pretraining recipe's steps (pretrain/run_pretraining.py): the documents (a text file, a `datasets` dataset or
stream, or an embedded corpus) with their validation part, the tokenizer (trained on the corpus once and kept in the
cache), the token store every rank and later run reads, the training stream and the fixed validation batches read from
it, the model, and the validation loss.

Training layer: the steps take the run's flags (pretrain/run_pretraining.py's `PretrainingArguments`, read by
attribute) and its accelerator, so that one process builds what the others wait for."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from . import token_store, training
from .configuration_xlnet_lite import XLNetLiteConfig
from .data import (
    PretrainingStream,
    TextFileDocuments,
    TokenizerSample,
    build_eval_batches,
    count_text_documents,
    held_out_positions,
)
from .embedded_datasets import (
    embedded_news_pretraining_texts,
    embedded_newsgroups_pretraining_texts,
    embedded_rotten_tomatoes_pretraining_texts,
)
from .model_utils import MODEL_PRESETS, load_model, model_from_config
from .modeling_xlnet_lite import XLNetLiteLMHeadModel
from .objectives import make_collator, objective_config
from .tokenization_xlnet_lite import load_tokenizer, train_tokenizer

# The embedded corpora, each without the validation and test texts of its downstream task (finetune/run_glue.py
# --embedded_task newsgroups / news_topic / rotten_tomatoes); a name joined by "+" is their union, each corpus
# holding out its own validation documents.
EMBEDDED_CORPORA = {
    "newsgroups": (embedded_newsgroups_pretraining_texts, "the embedded 20 Newsgroups training text"),
    "news": (embedded_news_pretraining_texts, "the embedded news corpus"),
    "rotten_tomatoes": (embedded_rotten_tomatoes_pretraining_texts, "the embedded Rotten Tomatoes training movies"),
}


def load_corpus(args):
    """(train, validation) documents, none of them read yet where that can wait: a --train_file is read lazily
    (TextFileDocuments), a dataset stays Arrow-backed or a stream; the embedded corpora are lists."""
    if args.train_file:
        if args.validation_file:
            return TextFileDocuments(args.train_file), TextFileDocuments(args.validation_file)
        return tuple(
            TextFileDocuments(args.train_file, hold_out=args.validation_split_percentage, part=part)
            for part in ("train", "validation")
        )
    if args.dataset_name:
        import datasets

        raw = datasets.load_dataset(args.dataset_name, args.dataset_config_name, streaming=args.streaming)
        if "train" not in raw:
            raise training.RecipeError(f"--dataset_name {args.dataset_name}: no 'train' split (has {list(raw)})")
        if args.text_column not in (raw["train"].column_names or [args.text_column]):
            raise training.RecipeError(
                f"--dataset_name {args.dataset_name}: no column {args.text_column!r} (--text_column); "
                f"has {raw['train'].column_names}"
            )
        if "validation" in raw:
            return raw["train"], raw["validation"]
        if args.streaming:  # hold out the first documents of the stream
            return raw["train"].skip(200), raw["train"].take(200)
        return split_off_validation(
            raw["train"], args.validation_split_percentage, f"--dataset_name {args.dataset_name}"
        )
    # the embedded news without the validation and test articles of the news-topic task (finetune/run_glue.py)
    train, validation = [], []
    for name in args.embedded_corpus.split("+"):
        texts, source = EMBEDDED_CORPORA[name]
        parts = split_off_validation(texts(), args.validation_split_percentage, source)
        train, validation = train + parts[0], validation + parts[1]
    return train, validation


def split_off_validation(documents, percentage, source):
    """(train, validation): `percentage` percent of the documents (a list of texts, its blank ones dropped, or a
    `datasets.Dataset`) held out for validation, spread over the corpus (`held_out_positions`), each part in order."""
    if isinstance(documents, list):
        documents = [t for t in documents if t.strip()]
    n = len(documents)
    with training.bad_input(source):  # fewer than two (non-empty) documents
        held_out = held_out_positions(n, percentage)
    keep = np.ones(n, dtype=bool)
    keep[held_out] = False
    if isinstance(documents, list):
        return [t for t, k in zip(documents, keep) if k], [documents[i] for i in held_out]
    return documents.select(np.flatnonzero(keep)), documents.select(held_out)


def check_text_files(args):
    """Read --train_file and --validation_file through once (UTF-8, not empty, enough documents to hold some out)
    before the tokenizer or the store is built from them."""
    for flag, path in (("--train_file", args.train_file), ("--validation_file", args.validation_file)):
        if path:
            with training.bad_input(flag):
                n = count_text_documents(path)
                if flag == "--train_file" and not args.validation_file and n < 2:
                    raise ValueError(f"{path}: needs at least two documents (one for validation), has {n}")


def corpus_fingerprint(args, documents, part):
    """What identifies documents without reading them (a stream: the flags that name it)."""
    known = token_store.documents_fingerprint(documents, args.text_column)
    if known is not None:
        return known
    return {
        "dataset": args.dataset_name,
        "config": args.dataset_config_name,
        "streaming": args.streaming,
        "part": part,
        "text_column": args.text_column,
    }


def cache_dir(args) -> Path:
    return Path(args.token_store_cache_dir) if args.token_store_cache_dir else token_store.default_cache_dir()


def characters(n: int) -> str:
    """'12.3M characters', or '4,210 characters' below 100,000."""
    return f"{n / 1e6:.1f}M characters" if n >= 100_000 else f"{n:,} characters"


def get_tokenizer(args, train_docs, accelerator):
    """The run's tokenizer, also saved as output_dir/tokenizer (which a resumed run loads): that of --token_store,
    --tokenizer_name, the tokenizer of --model_name_or_path, or a Unigram tokenizer trained on at most
    --tokenizer_train_characters of text spread over the corpus (`TokenizerSample`: read as the trainer asks, never
    held whole), by the main process, once per corpus and settings: kept in the cache."""
    path = Path(args.output_dir, "tokenizer")
    if Path(path, "tokenizer.json").is_file():
        return load_tokenizer(path)
    if args.token_store:
        return token_store.TokenStore(args.token_store).tokenizer()
    if args.tokenizer_name:
        return load_tokenizer(args.tokenizer_name)
    if args.model_name_or_path and Path(args.model_name_or_path, "tokenizer.json").is_file():
        return load_tokenizer(args.model_name_or_path)
    sample = TokenizerSample(
        train_docs,
        args.tokenizer_train_characters,
        max_documents=args.tokenizer_train_documents,
        text_column=args.text_column,
    )
    key = {
        "corpus": corpus_fingerprint(args, train_docs, "train"),
        "vocab_size": args.vocab_size,
        "documents": args.tokenizer_train_documents,
        "spread": True,
        "text_column": args.text_column,
    }
    if not sample.whole_corpus_fits():  # a corpus under the character cap keeps its key: the cap took nothing from it
        key["characters"] = args.tokenizer_train_characters

    def train(final: Path):
        check_text_files(args)
        where = f"spread evenly over the corpus's {characters(sample.measure()[1])}" if sample.spread else "the first"
        accelerator.print(
            f"training a {args.vocab_size}-piece Unigram tokenizer on at most "
            f"{characters(args.tokenizer_train_characters)} of text, {where}"
        )
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        tokenizer = train_tokenizer(sample, vocab_size=args.vocab_size)
        accelerator.print(
            f"tokenizer trained on {sample.documents:,} training documents "
            + ("spread evenly over the corpus" if sample.spread else "(the first of the stream)")
            + f": {characters(sample.characters)} of text"
        )
        training.crash_point("tokenizer_trained")
        tokenizer.save_pretrained(tmp)
        training.replace_folder(tmp, final)

    with accelerator.main_process_first():
        cached = token_store.cached_folder(
            cache_dir(args),
            f"tokenizer-{token_store.fingerprint(key)}",
            train,
            is_complete=lambda p: Path(p, "tokenizer.json").is_file(),
            log=accelerator.print,
        )
    if accelerator.is_main_process:
        tmp = Path(args.output_dir, ".tokenizer.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(cached, tmp)
        training.replace_folder(tmp, path)
    accelerator.wait_for_everyone()
    return load_tokenizer(path)


def get_token_store(args, tokenizer, train_docs, valid_docs, accelerator) -> token_store.TokenStore:
    """--token_store, or the store of this corpus and tokenizer in the cache, built by the main process while the
    others wait (and by one run while another run on the same corpus waits). Every byte is checked against the
    store's hashes first: a damaged --token_store stops the run (one line naming the file), a damaged cached store is
    built again; a token id the tokenizer does not have is damage too."""
    if args.token_store:
        store = token_store.TokenStore(args.token_store)
        try:
            store.verify()
            store.check_vocab(len(tokenizer))
        except token_store.StoreDamage as error:
            raise training.RecipeError(f"--token_store {args.token_store}: {error}; build it again") from None
        return store
    key = {
        "format": token_store.FORMAT,
        "train": corpus_fingerprint(args, train_docs, "train"),
        "validation": corpus_fingerprint(args, valid_docs, "validation"),
        "tokenizer": token_store.tokenizer_fingerprint(tokenizer),
        "text_column": args.text_column,
    }
    workers = args.preprocessing_num_workers

    def build(final: Path):
        check_text_files(args)
        if args.streaming:
            accelerator.print(
                "--streaming: the stream is read once, in chunks, into a token store on disk (rows need "
                "the corpus's length); later runs on it read the store"
            )
        accelerator.print(f"tokenizing the corpus into {final} ({workers} process{'es' if workers > 1 else ''})")
        with training.bad_input(f"the corpus ({corpus_name(args)})"):
            token_store.write_token_store(
                final,
                {"train": train_docs, "validation": valid_docs},
                tokenizer,
                text_column=args.text_column,
                num_proc=workers,
                source=key,
                log=accelerator.print if accelerator.is_local_main_process else None,
            )

    with accelerator.main_process_first():
        path = token_store.cached_folder(
            cache_dir(args),
            f"store-{token_store.fingerprint(key)}",
            build,
            is_complete=token_store.is_token_store,
            verify=lambda folder: token_store.TokenStore(folder).verify(),
            log=accelerator.print,
        )
    store = token_store.TokenStore(path)
    store.check_vocab(len(tokenizer))  # a StoreDamage: one line
    return store


def corpus_name(args, *, validation=False) -> str:
    """Where the (validation) documents came from, as the flags that chose them."""
    if validation and args.validation_file:
        return f"--validation_file {args.validation_file}"
    source = (
        f"--train_file {args.train_file}"
        if args.train_file
        else f"--dataset_name {args.dataset_name}"
        if args.dataset_name
        else f"--embedded_corpus {args.embedded_corpus}"
    )
    if not validation or args.dataset_name:  # a dataset's own validation split, or the documents held out of it
        return source
    return f"{source}, held out by --validation_split_percentage {args.validation_split_percentage}"


def build_data(args, tokenizer, store, accelerator):
    """The training stream, the collator of --objective and the fixed validation batches, read from the token store."""
    stream_kw = dict(
        seq_len=args.seq_len,
        reuse_len=args.reuse_len,
        bi_data=args.bi_data,
        rank=accelerator.process_index,
        world_size=accelerator.num_processes,
    )
    with training.bad_input(f"the training corpus ({corpus_name(args)})"):
        stream = PretrainingStream(
            store.split("train"), tokenizer, batch_size=args.per_device_train_batch_size, seed=args.seed, **stream_kw
        )
    collator = make_collator(
        args.objective,
        tokenizer,
        mlm_probability=args.mlm_probability,
        plm_probability=args.plm_probability,
        max_span_length=args.max_span_length,
        reuse_len=args.reuse_len,
        perm_size=args.perm_size or args.reuse_len,
        seed=args.seed * 1000 + accelerator.process_index,
    )
    eval_collator = dataclasses.replace(collator, seed=args.seed + 1)  # the same targets at every evaluation
    with training.bad_input(
        f"the validation corpus ({corpus_name(args, validation=True)}; --per_device_eval_batch_size "
        f"{args.per_device_eval_batch_size})"
    ):
        eval_batches = [
            eval_collator(b)
            for b in build_eval_batches(
                store.split("validation"),
                tokenizer,
                batch_size=args.per_device_eval_batch_size,
                max_batches=args.eval_batches,
                seed=args.seed + 1,
                **stream_kw,
            )
        ]
    return stream, collator, eval_batches


def build_model(args, tokenizer):
    """XLNetLiteLMHeadModel: --model_name_or_path (converted if it is transformers' XLNet), --config_name or the
    --model_size preset; --dropout, the pretraining data settings and --objective's attention on its config (a loaded
    model's own dropout is replaced by --dropout, as the finetuning recipe does)."""
    # mem_len 0 is no memory here; the model itself (as transformers' XLNet) would keep every step's states
    data_fields = dict(
        mem_len=args.mem_len, reuse_len=args.reuse_len, bi_data=args.bi_data, use_mems_train=args.mem_len > 0
    )
    if args.model_name_or_path:
        model = load_model(args.model_name_or_path, XLNetLiteLMHeadModel, dropout=args.dropout)
    elif args.config_name:
        model = model_from_config(args.config_name, XLNetLiteLMHeadModel, dropout=args.dropout)
    else:
        model = XLNetLiteLMHeadModel(
            XLNetLiteConfig(
                **MODEL_PRESETS[args.model_size],
                vocab_size=len(tokenizer),
                dropout=args.dropout,
                pad_token_id=tokenizer.pad_token_id,
                bos_token_id=None,
                eos_token_id=tokenizer.sep_token_id,
            )
        )
    for key, value in {**data_fields, **objective_config(args.objective)}.items():
        setattr(model.config, key, value)
    model.config.check_fields()
    if model.config.vocab_size < len(tokenizer):
        raise training.RecipeError(
            f"the model's vocab_size {model.config.vocab_size} is smaller than the tokenizer's {len(tokenizer)}"
        )
    return model


@torch.no_grad()
def evaluate(model, eval_batches, accelerator, *, with_memory):
    """Validation loss of the objective over consecutive batches, carrying the mems from one to the next or not."""
    model.eval()
    total, count, mems = torch.zeros((), device=accelerator.device), torch.zeros((), device=accelerator.device), None
    for batch in eval_batches:
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        with accelerator.autocast():
            out = model(**batch, mems=mems if with_memory else None, use_mems=with_memory)
        n = (batch["labels"] != -100).sum()
        total, count, mems = total + out.loss.float() * n, count + n, out.mems
    model.train()
    total, count = accelerator.reduce(total, "sum"), accelerator.reduce(count, "sum")
    return (total / count.clamp(min=1)).item()
