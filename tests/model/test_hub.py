"""transformers plumbing: save/load, the Auto classes, and trust_remote_code loading in a fresh process where
xlnet_lite cannot be imported."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from fake_hub import FakeHub
from model_helpers import BLOCK_XLNET_LITE, TINY, randomise
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

import xlnet_lite
from xlnet_lite.collator import random_factorization_masks as xlnet_masks

CLASSES = [
    (xlnet_lite.XLNetLiteModel, AutoModel, "AutoModel"),
    (xlnet_lite.XLNetLiteLMHeadModel, AutoModelForCausalLM, "AutoModelForCausalLM"),
    (
        xlnet_lite.XLNetLiteForSequenceClassification,
        AutoModelForSequenceClassification,
        "AutoModelForSequenceClassification",
    ),
]


def saved(tmp_path, cls, **overrides):
    model = randomise(cls(xlnet_lite.XLNetLiteConfig(**{**TINY, "num_labels": 3, **overrides}))).eval()
    model.save_pretrained(tmp_path)
    return model


@pytest.mark.parametrize("cls,auto,auto_name", CLASSES)
def test_save_and_load_through_auto_classes(tmp_path, cls, auto, auto_name):
    model = saved(tmp_path, cls, mem_len=7, bi_data=True, clamp_len=5)
    files = set(os.listdir(tmp_path))
    assert {"config.json", "model.safetensors", "modeling_xlnet_lite.py", "configuration_xlnet_lite.py"} <= files
    assert not any(f.endswith((".bin", ".pt")) for f in files)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "xlnet_lite" and config["auto_map"][auto_name].endswith(cls.__name__)
    assert type(AutoConfig.from_pretrained(tmp_path)) is xlnet_lite.XLNetLiteConfig
    loaded = auto.from_pretrained(tmp_path).eval()
    assert type(loaded) is cls and loaded.config.mem_len == 7 and loaded.config.bi_data
    x = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], loaded(x)[0], atol=0, rtol=0)


def test_tied_lm_head_survives_save_and_load(tmp_path):
    model = saved(tmp_path, xlnet_lite.XLNetLiteLMHeadModel)
    loaded = xlnet_lite.XLNetLiteLMHeadModel.from_pretrained(tmp_path)
    assert loaded.lm_loss.weight.data_ptr() == loaded.transformer.word_embedding.weight.data_ptr()
    torch.testing.assert_close(loaded.lm_loss.weight, model.transformer.word_embedding.weight)


REMOTE = BLOCK_XLNET_LITE + textwrap.dedent(
    """
    import sys, json
    import torch, transformers
    folder, auto_name = sys.argv[1], sys.argv[2]
    model = getattr(transformers, auto_name).from_pretrained(folder, trust_remote_code=True).eval()
    assert "xlnet_lite" not in sys.modules
    x = torch.load(folder + "/inputs.pt", weights_only=True)
    with torch.no_grad():
        out = model(**x)[0]
    torch.save(out, folder + "/remote_out.pt")
    print(type(model).__module__, type(model).__name__)
    """
)


@pytest.mark.parametrize("cls,auto,auto_name", CLASSES[1:])
@pytest.mark.slow
def test_trust_remote_code_in_a_fresh_process(tmp_path, cls, auto, auto_name):
    folder = tmp_path / "model"
    model = saved(folder, cls)
    perm_mask, target_mapping = xlnet_masks(2, 9, 3)
    inputs = {"input_ids": torch.randint(0, 97, (2, 9))}
    if cls is xlnet_lite.XLNetLiteLMHeadModel:
        inputs.update(perm_mask=perm_mask, target_mapping=target_mapping)
    torch.save(inputs, folder / "inputs.pt")
    workdir = tmp_path / "elsewhere"  # not the package's folder: nothing on sys.path can hide a missing file
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-c", REMOTE, str(folder), auto_name],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "transformers_modules" in result.stdout and cls.__name__ in result.stdout
    with torch.no_grad():
        expected = model(**inputs)[0]
    torch.testing.assert_close(torch.load(folder / "remote_out.pt", weights_only=True), expected, atol=0, rtol=0)


PUSH = textwrap.dedent(
    """
    import sys, torch, xlnet_lite
    config = xlnet_lite.XLNetLiteConfig(vocab_size=97, d_model=32, n_layer=2, n_head=4, d_inner=48, num_labels=3)
    torch.manual_seed(0)
    model = xlnet_lite.XLNetLiteForSequenceClassification(config)
    model.push_to_hub("someone/tiny-xlnet-lite")
    model.save_pretrained(sys.argv[1])
    """
)


@pytest.mark.slow
def test_push_to_hub_uses_the_standard_client_and_reloads_with_remote_code(tmp_path):
    hub = FakeHub(tmp_path / "pushed")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_HUB_OFFLINE")}
    env.update(HF_ENDPOINT=hub.endpoint, HF_TOKEN="hf_fake_token", HF_HOME=str(tmp_path / "hf_home"))
    result = subprocess.run(
        [sys.executable, "-c", PUSH, str(tmp_path / "local")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    hub.server.shutdown()
    pushed = tmp_path / "pushed"
    assert hub.commits == 1
    assert {"config.json", "model.safetensors", "modeling_xlnet_lite.py", "configuration_xlnet_lite.py"} <= {
        p.name for p in pushed.iterdir()
    }
    torch.save({"input_ids": torch.randint(0, 97, (2, 9))}, pushed / "inputs.pt")
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HOME=str(tmp_path / "hf_home2"), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-c", REMOTE, str(pushed), "AutoModelForSequenceClassification"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    local = xlnet_lite.XLNetLiteForSequenceClassification.from_pretrained(tmp_path / "local").eval()
    with torch.no_grad():
        expected = local(**torch.load(pushed / "inputs.pt", weights_only=True))[0]
    torch.testing.assert_close(torch.load(pushed / "remote_out.pt", weights_only=True), expected, atol=0, rtol=0)
