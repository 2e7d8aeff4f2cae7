"""Tests never reach the Hugging Face Hub and never write into the user's cache."""

import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="xlnet_lite_hf_home_"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    # the fused Triton kernels run in Triton's interpreter here (tests/model/test_triton_attention.py); it must be
    # chosen before Triton is first imported, which torch.compile and transformers may do in any test
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(params=["eager", "sdpa"])
def impl(request):
    """Both attention kernels of XLNet-Lite, for the equivalence tests."""
    return request.param


@pytest.fixture(params=["eager", "sdpa", "flex_attention"])
def forward_impl(request):
    """Every attention kernel, for the forward-only equivalence tests (flex_attention has no backward on the CPU:
    its training steps are checked on a GPU, tests/model/test_gpu.py)."""
    return request.param


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Each test's in-process recipe run builds its Accelerator from scratch (accelerate keeps one process-wide
    state, which refuses a second precision: `--mixed_precision auto` picks bf16 or fp32 by machine, a test may pin
    one)."""
    yield
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A tiny pretraining corpus (train.txt, valid.txt: embedded news articles) and a 400-piece tokenizer."""
    from xlnet_lite.embedded_datasets import embedded_news_texts
    from xlnet_lite.tokenization_xlnet_lite import train_tokenizer

    root = tmp_path_factory.mktemp("corpus")
    texts = [t for t in embedded_news_texts() if t.strip()]
    (root / "train.txt").write_text("\n\n".join(t.replace("\n\n", "\n") for t in texts[:40]), encoding="utf-8")
    (root / "valid.txt").write_text("\n\n".join(t.replace("\n\n", "\n") for t in texts[40:46]), encoding="utf-8")
    train_tokenizer(texts[:40], vocab_size=400).save_pretrained(root / "tokenizer")
    return root


@pytest.fixture(scope="module")
def straight_run(corpus, tmp_path_factory):
    """The tiny pretraining run, uninterrupted, in this process: (output_dir, results)."""
    from recipe_helpers import tiny_args

    from pretrain import run_pretraining

    out = tmp_path_factory.mktemp("straight")
    results = run_pretraining.main(tiny_args(corpus, out))
    return out, results


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny 'pretraining output': LM-head model + tokenizer, no classification head."""
    from recipe_helpers import BAD, CLASSIFIER_TINY, GOOD

    import xlnet_lite
    from xlnet_lite.tokenization_xlnet_lite import train_tokenizer

    path = tmp_path_factory.mktemp("pretrain")
    tokenizer = train_tokenizer(GOOD + BAD + ["the movie was a story of time"] * 3, vocab_size=60)
    torch.manual_seed(0)
    config = xlnet_lite.XLNetLiteConfig(vocab_size=len(tokenizer), **{**CLASSIFIER_TINY, "dropout": 0.1})
    xlnet_lite.XLNetLiteLMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run faster on one thread, above all on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SLOW_FOLDERS = ("training", "recipes", "results")  # whole runs, kills, subprocesses: the integration tier


def pytest_collection_modifyitems(config, items):
    """Mark every test of the integration folders `slow`, so `-m "not slow"` is the fast inner loop."""
    for item in items:
        if item.path.parent.name in SLOW_FOLDERS and item.path.parent.parent.name == "tests":
            item.add_marker(pytest.mark.slow)
