"""GLUE metrics, computed locally with scikit-learn and scipy (no metric script is fetched from a hub). Both come with
the `recipes` extra (`pip install xlnet-lite[recipes]`) and are imported when a metric that needs them is computed.

Names follow GLUE / the `evaluate` "glue" metric: CoLA `matthews_correlation`; STS-B `pearson` and
`spearmanr`; MRPC and QQP `accuracy` and `f1` (binary, positive class 1); every other task `accuracy`.
MNLI is scored separately on its matched and mismatched validation sets by the caller.
"""

import numpy as np

GLUE_TASKS = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")

# The metric a recipe selects its best checkpoint by.
PRIMARY_METRIC = {"cola": "matthews_correlation", "stsb": "pearson"}


def accuracy(predictions, references):
    predictions, references = np.asarray(predictions), np.asarray(references)
    return float((predictions == references).mean())


def binary_f1(predictions, references):
    from sklearn.metrics import f1_score

    return float(f1_score(references, predictions, pos_label=1, average="binary", zero_division=0.0))


def matthews_correlation(predictions, references):
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(references, predictions))


def pearson_spearman(predictions, references):
    from scipy.stats import pearsonr, spearmanr

    predictions = np.asarray(predictions, dtype=np.float64)
    references = np.asarray(references, dtype=np.float64)
    return {
        "pearson": float(pearsonr(predictions, references)[0]),
        "spearmanr": float(spearmanr(predictions, references)[0]),
    }


def glue_metrics(task_name, predictions, references):
    """GLUE's metrics for `task_name`; predictions are class ids (float scores for stsb)."""
    if task_name not in GLUE_TASKS:
        raise ValueError(f"task_name must be one of {list(GLUE_TASKS)}, got {task_name!r}")
    if task_name == "cola":
        return {"matthews_correlation": matthews_correlation(predictions, references)}
    if task_name == "stsb":
        return pearson_spearman(predictions, references)
    if task_name in ("mrpc", "qqp"):
        return {"accuracy": accuracy(predictions, references), "f1": binary_f1(predictions, references)}
    return {"accuracy": accuracy(predictions, references)}


def file_metrics(predictions, references, *, is_regression, num_labels):
    """Metrics for user data: regression -> pearson, spearmanr, mse; binary -> accuracy, f1; else accuracy."""
    if is_regression:
        predictions = np.asarray(predictions, dtype=np.float64)
        references = np.asarray(references, dtype=np.float64)
        return {**pearson_spearman(predictions, references), "mse": float(((predictions - references) ** 2).mean())}
    metrics = {"accuracy": accuracy(predictions, references)}
    if num_labels == 2:
        metrics["f1"] = binary_f1(predictions, references)
    return metrics


def primary_metric(task_name, *, is_regression):
    """Name of the metric that decides the best epoch (higher is better)."""
    if task_name in PRIMARY_METRIC:
        return PRIMARY_METRIC[task_name]
    return "pearson" if is_regression else "accuracy"


__all__ = [
    "GLUE_TASKS",
    "accuracy",
    "binary_f1",
    "matthews_correlation",
    "pearson_spearman",
    "glue_metrics",
    "file_metrics",
    "primary_metric",
]
