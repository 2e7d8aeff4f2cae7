"""Sentence(-pair) classification and regression data for finetuning: GLUE, CSV / TSV / JSON-lines files or the
embedded tasks (20 Newsgroups, news topics, Rotten Tomatoes); their text columns, label sets, XLNet's layout
(`A <sep> B <sep> <cls>`, padded on the LEFT) and long documents: cut into segments for the Transformer-XL memory, into
head and tail, or into windows each classified alone. Every error names the file (or split) and the column."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .data import utf8_lines
from .errors import RecipeError

# GLUE column names (nyu-mll/glue).
TASK_TO_KEYS = {
    "cola": ("sentence", None),
    "sst2": ("sentence", None),
    "mrpc": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"),
    "stsb": ("sentence1", "sentence2"),
    "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
}
FILE_FORMATS = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"delimiter": "\t"}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
}


@dataclass
class Split:
    """A raw split and where it came from (named in every error message)."""

    data: object  # datasets.Dataset
    source: str


EMBEDDED_TASKS = ("newsgroups", "news_topic", "rotten_tomatoes")


def load_splits(
    *, task_name=None, train_file=None, validation_file=None, test_file=None, embedded_task="newsgroups"
) -> dict[str, Split]:
    """train, validation (validation_mismatched for MNLI) and optionally test: a GLUE task from the Hub, files, or
    an embedded task (xlnet_lite.embedded_datasets): `newsgroups` (20 Newsgroups, 20 classes), `news_topic` (the
    topic of a news article) or `rotten_tomatoes` (movie-review sentiment)."""
    if task_name:
        return _glue_splits(task_name)
    if train_file:
        files = {"train": train_file, "validation": validation_file, "test": test_file}
        return {name: Split(load_data_file(path), path) for name, path in files.items() if path}
    from . import embedded_datasets

    readers = {
        "newsgroups": (embedded_datasets.embedded_newsgroups, "embedded 20 Newsgroups"),
        "news_topic": (embedded_datasets.embedded_news_topics, "embedded news topics"),
        "rotten_tomatoes": (embedded_datasets.embedded_rotten_tomatoes, "embedded Rotten Tomatoes"),
    }
    if embedded_task not in readers:
        raise RecipeError(f"unknown embedded task {embedded_task!r}; choose one of {', '.join(EMBEDDED_TASKS)}")
    read, title = readers[embedded_task]
    ds = read()
    return {name: Split(ds[name].select_columns(["sentence", "label"]), f"{title} ({name} split)") for name in ds}


def read_task(
    splits: dict[str, Split], *, text_column=None, text_pair_column=None, mode="truncate", max_per_class=None
):
    """(splits, columns, labels): each split's text columns (`text_columns`), checked with its labels and the long
    document mode before any model is loaded, and the training split's label set (`read_labels`); with
    `max_per_class` the training split keeps the first N examples of each class (`first_per_class`)."""
    columns = {name: text_columns(split, text_column, text_pair_column) for name, split in splits.items()}
    for name, split in splits.items():
        check_split(split, columns[name], needs_label=name != "test")
        check_long_document_mode(split, mode, columns[name])
    labels = read_labels(splits["train"])
    if max_per_class:
        if labels.is_regression:
            raise RecipeError(
                f"--max_train_samples_per_class: column `label` of {splits['train'].source} "
                "holds regression targets, not classes"
            )
        splits = {**splits, "train": first_per_class(splits["train"], max_per_class)}
    return splits, columns, labels


def first_per_class(split: Split, n: int) -> Split:
    """The first `n` examples of each label, in the split's order (all of a label that has fewer)."""
    seen: dict = {}
    keep = []
    for i, label in enumerate(split.data["label"]):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] <= n:
            keep.append(i)
    return Split(split.data.select(keep), f"{split.source}, first {n} per label")


def _glue_splits(task):
    import datasets

    ds = datasets.load_dataset("nyu-mll/glue", task)
    names = {"train": "train", "validation": "validation", "test": "test"}
    if task == "mnli":
        names = {
            "train": "train",
            "validation": "validation_matched",
            "validation_mismatched": "validation_mismatched",
            "test": "test_matched",
        }
    keys = [k for k in TASK_TO_KEYS[task] if k]
    renamed = dict(zip(keys, ["sentence"] if len(keys) == 1 else ["sentence1", "sentence2"]))
    splits = {
        ours: Split(ds[theirs].rename_columns(renamed), f"nyu-mll/glue/{task} ({theirs})")
        for ours, theirs in names.items()
    }
    splits["test"].data = splits["test"].data.remove_columns("label")  # GLUE hides test labels (-1)
    return splits


def load_data_file(path):
    """A CSV / TSV / JSON lines file as a datasets.Dataset; ValueError for a missing or empty file."""
    import datasets

    suffix = Path(path).suffix.lower()
    if suffix not in FILE_FORMATS:
        raise RecipeError(f"{path}: unsupported file type {suffix!r}; use one of {sorted(FILE_FORMATS)}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    if os.path.getsize(path) == 0:
        raise RecipeError(f"{path}: the file is empty")
    builder, kwargs = FILE_FORMATS[suffix]
    if _count_lines(path, limit=2) < (2 if builder == "csv" else 1):
        raise RecipeError(f"{path}: the file holds no rows (header only?)")
    _check_utf8(path)
    try:
        data = datasets.load_dataset(builder, data_files={"data": str(path)}, split="data", **kwargs)
    except datasets.exceptions.DatasetGenerationError as error:  # a malformed row: say which file and why
        cause = error.__cause__ or error
        raise RecipeError(f"{path}: not a readable {suffix[1:]} file ({type(cause).__name__}: {cause})") from error
    if len(data) == 0:
        raise RecipeError(f"{path}: the file holds no rows (header only?)")
    return data


def _check_utf8(path):
    """RecipeError naming the first line that is not valid UTF-8."""
    try:
        for _ in utf8_lines(path):
            pass
    except ValueError as error:
        raise RecipeError(str(error)) from None


def _count_lines(path, *, limit):
    """Non-blank lines of a text file, counting up to `limit`."""
    count = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            count += bool(line.strip())
            if count >= limit:
                break
    return count


def text_columns(split: Split, text_column=None, text_pair_column=None):
    """(first, second or None): the split's text columns. The columns named (--text_column, --text_pair_column),
    else `sentence1` and `sentence2`, `sentence` or `text`, else, as transformers' run_glue, the columns other than
    `label`: the first two as a pair, or the only one."""
    columns = split.data.column_names
    if text_column:
        for flag, name in (("--text_column", text_column), ("--text_pair_column", text_pair_column)):
            if name and name not in columns:
                raise RecipeError(f"{split.source}: no column `{name}` ({flag}); the file has columns {columns}")
        return text_column, text_pair_column
    if "sentence1" in columns and "sentence2" in columns:
        return "sentence1", "sentence2"
    for name in ("sentence", "text"):
        if name in columns:
            return name, None
    others = [name for name in columns if name != "label"]
    if not others:
        raise RecipeError(
            f"{split.source}: no text column: expected `sentence`, `text`, or `sentence1` and `sentence2` (or name "
            f"one with --text_column); found columns {columns}"
        )
    return others[0], (others[1] if len(others) > 1 else None)


def check_split(split: Split, columns, *, needs_label):
    for column in columns:
        if column is None:
            continue
        bad = [i for i, text in enumerate(split.data[column]) if not isinstance(text, str)]
        if bad:
            raise RecipeError(
                f"{split.source}: column `{column}` has a missing or non-text value in row {bad[0]} (the text "
                "columns: --text_column, --text_pair_column)"
            )
    if needs_label and "label" not in split.data.column_names:
        raise RecipeError(f"{split.source}: no `label` column (found columns {split.data.column_names})")
    if "label" in split.data.column_names and needs_label:
        missing = [i for i, v in enumerate(split.data["label"]) if v is None]
        if missing:
            raise RecipeError(f"{split.source}: column `label` is empty in row {missing[0]}")


@dataclass
class Labels:
    """The label set, read from the training split: names for classification, or regression."""

    names: list[str]  # [] for regression
    is_regression: bool

    @property
    def num_labels(self):
        return 1 if self.is_regression else len(self.names)

    def model_kwargs(self):
        if self.is_regression:
            return {"num_labels": 1, "problem_type": "regression"}
        return {
            "num_labels": self.num_labels,
            "id2label": dict(enumerate(self.names)),
            "label2id": {name: i for i, name in enumerate(self.names)},
            "problem_type": "single_label_classification",
        }


def read_labels(train: Split) -> Labels:
    """ClassLabel -> its names; floats -> regression; ints or strings -> their sorted distinct values."""
    import datasets

    feature = train.data.features["label"]
    if isinstance(feature, datasets.ClassLabel):
        return Labels(list(feature.names), False)
    if isinstance(feature, datasets.Value) and feature.dtype.startswith("float"):
        return Labels([], True)
    values = sorted(set(train.data["label"]), key=lambda v: (isinstance(v, str), v))
    if len(values) < 2:
        raise RecipeError(f"{train.source}: column `label` has a single value {values}: nothing to classify")
    return Labels([str(v) for v in values], False)


def label_ids(split: Split, labels: Labels, train_source):
    """Label values of a split as model targets (class ids or floats); None where the split has no labels."""
    import datasets

    if "label" not in split.data.column_names:
        return None
    values = list(split.data["label"])
    if labels.is_regression:
        return [float(v) for v in values]
    if isinstance(split.data.features["label"], datasets.ClassLabel):
        ids = list(values)
        if all(i < 0 for i in ids):  # GLUE test splits: -1
            return None
        return ids
    index = {name: i for i, name in enumerate(labels.names)}
    unseen = sorted({str(v) for v in values} - set(index))
    if unseen:
        raise RecipeError(
            f"{split.source}: column `label` has values {unseen} that the training data ({train_source}) never has; "
            f"known labels: {labels.names}"
        )
    return [index[str(v)] for v in values]


LONG_DOCUMENT_MODES = ("truncate", "head_tail", "windows", "mems")
ONE_TEXT_MODES = ("head_tail", "windows")


def check_long_document_mode(split: Split, mode, columns=None):
    """head_tail and windows cut one text; a pair of texts would lose the <sep> between them."""
    first, second = columns or text_columns(split)
    if mode in ONE_TEXT_MODES and second:
        raise RecipeError(
            f"--long_document_mode {mode} reads one text column; {split.source} has two "
            f"(`{first}`, `{second}`): use truncate or mems"
        )


def layout_problems(mode, max_len, head_len=None, max_windows=None) -> list[str]:
    """What is wrong with a long-document layout, named by flag (empty when all is well)."""
    problems = []
    if head_len is not None and mode != "head_tail":
        problems.append(f"--head_len is for --long_document_mode head_tail, not {mode}")
    elif head_len is not None and not 0 <= head_len <= max_len - 2:
        problems.append(
            f"--head_len must be in [0, max_seq_length - 2 = {max_len - 2}] (the tail keeps <sep> <cls>), "
            f"got {head_len}"
        )
    if max_windows is not None and mode != "windows":
        problems.append(f"--max_windows is for --long_document_mode windows, not {mode}")
    elif max_windows is not None and max_windows < 1:
        problems.append(f"--max_windows must be >= 1, got {max_windows}")
    return problems


def default_head_len(max_len):
    """head_tail mode's tokens from the start unless given: a quarter of max_len (Sun et al. 2019: 128 of 512)."""
    return max_len // 4


def head_and_tail(ids, max_len, head_len):
    """The first `head_len` and the last `max_len - head_len` items of a sequence longer than `max_len` (the tail
    keeps the closing <sep> <cls>); a shorter one whole. Sun et al. (2019, "How to fine-tune BERT for text
    classification") found the head and the tail of a long review to classify better than either alone."""
    if len(ids) <= max_len:
        return list(ids)
    return list(ids[:head_len]) + list(ids[len(ids) - (max_len - head_len) :])


def windows(ids, max_len, max_windows=None):
    """A tokenized text ending in <sep> <cls> as consecutive windows of at most max_len items: its body cut every
    max_len - 2 items, each window closed with the text's own last two (<sep> <cls>, or their token types). The first
    window is what truncation to max_len keeps; the first `max_windows` are returned (all when None)."""
    body, end = list(ids[:-2]), list(ids[-2:])
    step = max_len - 2
    return [body[i : i + step] + end for i in range(0, max(len(body), 1), step)[:max_windows]]


def tokenize_split(
    split: Split,
    tokenizer,
    labels: Labels,
    train_source,
    *,
    max_len,
    mode,
    max_samples,
    head_len=None,
    max_windows=None,
    columns=None,
):
    """input_ids / token_type_ids (whole texts in mems mode; the first max_len tokens in truncate mode; the first
    head_len (default: default_head_len) and the last max_len - head_len in head_tail mode), labels, index, n_segments.
    In windows mode a row per window (the text's first `max_windows` windows, all when None), each with its text's
    label and row number (`text_index`); `index` then numbers the windows. `columns`: the text columns (default:
    `text_columns`)."""
    import datasets

    data = split.data if max_samples is None else split.data.select(range(min(max_samples, len(split.data))))
    split = Split(data, split.source)
    first, second = columns = columns or text_columns(split)
    check_long_document_mode(split, mode, columns)
    targets = label_ids(split, labels, train_source)
    texts = [list(data[c]) for c in (first, second) if c]
    truncate = mode == "truncate"  # windows mode cuts the whole tokenized text below
    enc = tokenizer(*texts, truncation=truncate, max_length=max_len if truncate else None, add_special_tokens=True)
    input_ids, token_type_ids = enc["input_ids"], enc["token_type_ids"]
    if mode == "head_tail":
        head_len = default_head_len(max_len) if head_len is None else head_len
        input_ids = [head_and_tail(ids, max_len, head_len) for ids in input_ids]
        token_type_ids = [head_and_tail(types, max_len, head_len) for types in token_type_ids]
    text_index = list(range(len(data)))
    if mode == "windows":
        cut = [windows(ids, max_len, max_windows) for ids in input_ids]
        text_index = [i for i, pieces in enumerate(cut) for _ in pieces]
        input_ids = [piece for pieces in cut for piece in pieces]
        token_type_ids = [piece for types in token_type_ids for piece in windows(types, max_len, max_windows)]
        targets = None if targets is None else [targets[i] for i in text_index]
    features = {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "index": list(range(len(input_ids))),
        "n_segments": [math.ceil(len(ids) / max_len) for ids in input_ids],
    }
    if mode == "windows":
        features["text_index"] = text_index
    if targets is not None:
        features["labels"] = targets
    return datasets.Dataset.from_dict(features)


def tokenize_splits(splits: dict[str, Split], columns, tokenizer, labels: Labels, *, max_samples, **layout):
    """{name: tokenized dataset}: every split through `tokenize_split` with its own text columns (`columns`: {name:
    (first, second)}) and the layout (max_len, mode, head_len, max_windows); `max_samples`: {name: N or None}."""
    source = splits["train"].source
    return {
        name: tokenize_split(
            split, tokenizer, labels, source, columns=columns[name], max_samples=max_samples[name], **layout
        )
        for name, split in splits.items()
    }


def text_labels(dataset):
    """The labels of a tokenized split, one per text (in windows mode each text's rows share its label)."""
    if "text_index" not in dataset.column_names:
        return dataset["labels"]
    labels, texts = dataset["labels"], dataset["text_index"]
    return [label for k, label in enumerate(labels) if k == 0 or texts[k] != texts[k - 1]]


def pool_windows(scores, text_index, *, is_regression):
    """Per text, from its windows' outputs (rows in dataset order): the mean score (regression), or the class of the
    highest mean probability over the windows."""
    text_index = np.asarray(text_index)
    n_texts = int(text_index.max()) + 1 if len(text_index) else 0
    if not is_regression:  # class probabilities
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores = scores / scores.sum(-1, keepdims=True)
    total = np.zeros((n_texts,) + scores.shape[1:])
    np.add.at(total, text_index, scores)
    counts = np.bincount(text_index, minlength=n_texts)
    mean = total / counts.reshape((-1,) + (1,) * (scores.ndim - 1))
    return mean if is_regression else mean.argmax(-1)


class SegmentCountBatchSampler:
    """Batches of examples with the same number of segments (always 1 when truncating), so every segment
    but the last is full and the memory never holds padding. Shuffled from (seed, epoch) when training; with
    `lengths` (evaluation), longest first within each segment count: a batch then holds texts of similar length
    and pads its last segments to about their own length, not to the longest of a random mix (often the full
    segment). The padding is masked, so the predictions are the same up to rounding (identical on 20 Newsgroups'
    test split in fp32; benchmarks/RESULTS.md).

    Batches hold up to `batch_size` examples, and each segment count's last one fewer, so the sampler tells
    accelerate its batch size is not fixed (`batch_size` None): with several processes accelerate then deals whole
    batches out, a process short of one at the end repeating an early batch, where with a fixed size it would skip
    a round that ends in a short batch and top the last one up with examples of other segment counts. (accelerate's
    split_batches mode needs a fixed size, so it is not available with this sampler.)"""

    def __init__(self, n_segments, batch_size, *, shuffle, seed=0, lengths=None):
        if shuffle and lengths is not None:
            raise ValueError("lengths orders evaluation batches; a shuffled sampler takes none")
        self.n_segments = np.asarray(n_segments)
        self.lengths = None if lengths is None else np.asarray(lengths)
        self.max_batch_size, self.shuffle, self.seed, self.epoch = batch_size, shuffle, seed, 0
        self.batch_size = None  # for accelerate's BatchSamplerShard: batches of varying size

    def set_epoch(self, epoch):
        self.epoch = epoch

    def batches(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        batches = []
        for n in np.unique(self.n_segments):
            idx = np.flatnonzero(self.n_segments == n)
            if self.shuffle:
                idx = rng.permutation(idx)
            elif self.lengths is not None:
                idx = idx[np.argsort(-self.lengths[idx], kind="stable")]
            batches += [idx[i : i + self.max_batch_size].tolist() for i in range(0, len(idx), self.max_batch_size)]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def __iter__(self):
        return iter(self.batches())

    def __len__(self):
        _, counts = np.unique(self.n_segments, return_counts=True)
        return int(sum(math.ceil(c / self.max_batch_size) for c in counts))


@dataclass
class SegmentCollator:
    """Cuts each example into segments of `segment_len` tokens from the start: full segments first
    (prefix_*: (B, S-1, T)), then the last segment, which ends with <sep> <cls>, padded on the left."""

    pad_token_id: int
    pad_token_type_id: int
    segment_len: int

    def __call__(self, examples):
        counts = {ex["n_segments"] for ex in examples}
        if len(counts) != 1:
            raise RecipeError(
                f"a batch mixes documents of {sorted(counts)} segments; batches must come from SegmentCountBatchSampler"
            )
        n_prefix = (counts.pop() - 1) * self.segment_len
        prefix_ids = torch.tensor([ex["input_ids"][:n_prefix] for ex in examples], dtype=torch.long)
        prefix_types = torch.tensor([ex["token_type_ids"][:n_prefix] for ex in examples], dtype=torch.long)
        batch = {
            "prefix_input_ids": prefix_ids.view(len(examples), -1, self.segment_len),  # (B, S-1, T)
            "prefix_token_type_ids": prefix_types.view(len(examples), -1, self.segment_len),
            **self.pad_left(
                [ex["input_ids"][n_prefix:] for ex in examples], [ex["token_type_ids"][n_prefix:] for ex in examples]
            ),
            "index": torch.tensor([ex["index"] for ex in examples], dtype=torch.long),
        }
        if "labels" in examples[0]:
            batch["labels"] = torch.tensor([ex["labels"] for ex in examples])
        return batch

    def pad_left(self, ids, types):
        width = max(len(x) for x in ids)
        pad = [width - len(x) for x in ids]
        return {
            "input_ids": torch.tensor([[self.pad_token_id] * p + x for p, x in zip(pad, ids)]),  # (B, T)
            "token_type_ids": torch.tensor([[self.pad_token_type_id] * p + x for p, x in zip(pad, types)]),
            "attention_mask": torch.tensor([[0] * p + [1] * len(x) for p, x in zip(pad, ids)]),
        }


def make_loader(dataset, collator, *, batch_size, shuffle, seed):
    """Shuffled batches for training; for evaluation, batches of similar length (inference.predict puts the
    predictions back in the order of the `index` column)."""
    import pyarrow.compute as pc

    lengths = None
    if not shuffle and len(dataset):
        lengths = pc.list_value_length(dataset.with_format("arrow")["input_ids"]).to_numpy()
    sampler = SegmentCountBatchSampler(dataset["n_segments"], batch_size, shuffle=shuffle, seed=seed, lengths=lengths)
    # Its own generator: starting an iterator draws a seed, which must not move the global RNG (dropout),
    # or a resumed run would drift from the uninterrupted one.
    generator = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collator, generator=generator)
    return loader, sampler


def make_loaders(train_set, eval_sets: dict, collator, *, train_batch_size, eval_batch_size, seed):
    """(training loader, its sampler, {name: evaluation loader}) from `make_loader`, the training batches shuffled
    from `seed`."""
    train_loader, sampler = make_loader(train_set, collator, batch_size=train_batch_size, shuffle=True, seed=seed)
    loaders = {
        name: make_loader(dataset, collator, batch_size=eval_batch_size, shuffle=False, seed=0)[0]
        for name, dataset in eval_sets.items()
    }
    return train_loader, sampler, loaders
