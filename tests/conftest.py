"""Tests never reach the Hugging Face Hub and never write into the user's cache."""

import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="xlnet_lite_hf_home_"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(params=["eager", "sdpa"])
def impl(request):
    """Both attention kernels of XLNet-Lite, for the equivalence tests."""
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
