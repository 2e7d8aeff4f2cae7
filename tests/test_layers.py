"""The package's layers, read from the source (ast, nothing imported): base <- model <- data <- training, and the
recipes and benchmarks above them all. A module imports only modules of its own layer or of those below it, and the
files that trust_remote_code copies beside a saved model import nothing else of the package."""

import ast
import sys
from pathlib import Path

import pytest
from transformers.dynamic_module_utils import get_relative_import_files

PACKAGE = Path(__file__).resolve().parents[1] / "xlnet_lite"

BASE, MODEL, DATA, TRAINING, EXPORTS, SCRIPTS = range(6)
LAYER_NAMES = ("base", "model", "data", "training", "exports", "scripts")

# Every module of the package, by its name under xlnet_lite (a subpackage counts as one, with all its modules).
LAYERS = {
    # errors, fault injection, atomic files, checkpoint integrity, precision: what data and training both use
    "errors": BASE,
    "faults": BASE,
    "atomic_io": BASE,
    "integrity": BASE,
    "precision": BASE,
    # the model and its tokenizer
    "configuration_xlnet_lite": MODEL,
    "modeling_xlnet_lite": MODEL,
    "triton_attention": MODEL,
    "tokenization_xlnet_lite": MODEL,
    "convert": MODEL,
    "model_utils": MODEL,
    # documents, corpora, the pretraining stream, the token store, the collator, classification data and metrics
    "data": DATA,
    "collator": DATA,
    "objectives": DATA,
    "token_store": DATA,
    "classification_data": DATA,
    "embedded_datasets": DATA,
    "glue_metrics": DATA,
    "inference": DATA,
    "visualize": DATA,
    # the recipes' shared core
    "training": TRAINING,
    "pretraining": TRAINING,
    # xlnet_lite/__init__.py: the exports and the Auto* registration
    "": EXPORTS,
}
# Repository folders above the package: the package never imports them.
SCRIPT_PACKAGES = ("pretrain", "finetune", "benchmarks", "main_job", "scripts", "tests")


def module_name(path: Path) -> str:
    """xlnet_lite/training/run.py -> "training.run"; xlnet_lite/__init__.py -> ""."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(name: str) -> int | None:
    """The layer of a module named under xlnet_lite ("" is the package itself), or None when it has none."""
    if name in LAYERS:
        return LAYERS[name]
    top = name.split(".")[0]
    return LAYERS.get(top) if "." in name else None


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, what) for every import of the file, function-level ones included: a module of the package as its name
    under xlnet_lite, anything else as its absolute name prefixed with "/" (e.g. "/torch", "/pretrain.run")."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    package = [part for part in package if part]
    modules = package_modules()
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, absolute(alias.name)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            base = absolute(node.module)
            found += [(node.lineno, submodule(base, alias.name, modules)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parent = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            base = ".".join([*parent, *([node.module] if node.module else [])])
            found += [(node.lineno, submodule(base, alias.name, modules)) for alias in node.names]
    return found


def absolute(name: str) -> str:
    if name == "xlnet_lite":
        return ""
    return name.removeprefix("xlnet_lite.") if name.startswith("xlnet_lite.") else "/" + name


def submodule(base: str, name: str, modules) -> str:
    """`from base import name`: the module base.name when there is one, else base."""
    if base.startswith("/"):
        return base
    candidate = f"{base}.{name}" if base else name
    return candidate if candidate in modules else base


def test_every_module_of_the_package_has_a_layer():
    unplaced = [name or "__init__" for name in package_modules() if layer_of(name) is None]
    assert not unplaced, f"place these modules in tests/test_layers.py's LAYERS: {unplaced}"


def test_no_module_imports_a_module_of_a_higher_layer():
    upward = []
    for name, path in package_modules().items():
        layer = layer_of(name)
        if layer is None:
            continue  # reported by the test above
        for line, target in imported_modules(path):
            if target.startswith("/"):
                if target[1:].split(".")[0] in SCRIPT_PACKAGES:
                    upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target[1:]} (scripts)")
                continue
            target_layer = layer_of(target)
            if target_layer is not None and target_layer > layer:
                upward.append(
                    f"{path.relative_to(PACKAGE.parent)}:{line} ({LAYER_NAMES[layer]}) imports "
                    f"xlnet_lite.{target or '__init__'} ({LAYER_NAMES[target_layer]})"
                )
    assert not upward, "imports pointing up a layer:\n" + "\n".join(upward)


def test_the_layer_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The check itself: a data module importing the training core is found, however it is written."""
    for source in ("from .training import crash_point\n", "def f():\n    from . import training\n"):
        fake = tmp_path / "xlnet_lite"
        fake.mkdir(exist_ok=True)
        (fake / "__init__.py").write_text("")
        (fake / "data.py").write_text(source)
        (fake / "training").mkdir(exist_ok=True)
        (fake / "training" / "__init__.py").write_text("")
        monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
        with pytest.raises(AssertionError, match=r"data.py:\d \(data\) imports xlnet_lite.training \(training\)"):
            test_no_module_imports_a_module_of_a_higher_layer()


def test_the_files_trust_remote_code_copies_import_nothing_else_of_the_package():
    """save_pretrained copies configuration_xlnet_lite.py, modeling_xlnet_lite.py and the files they import relatively
    (transformers' own rule); a saved model loads from those alone, so none of them may import another module of the
    package, in any other form either (`from . import x`, `import xlnet_lite.x`)."""
    copied = set()
    for name in ("configuration_xlnet_lite", "modeling_xlnet_lite"):
        path = PACKAGE / f"{name}.py"
        copied |= {path, *map(Path, get_relative_import_files(str(path)))}
    unit = {module_name(path) for path in copied}
    assert "triton_attention" in unit  # the fused kernels travel with the model
    outside = [
        f"{path.name}:{line} imports xlnet_lite.{target or '__init__'}"
        for path in sorted(copied)
        for line, target in imported_modules(path)
        if not target.startswith("/") and target not in unit
    ]
    assert not outside, "the files copied beside a saved model import more of the package:\n" + "\n".join(outside)
    assert all(LAYERS[name] == MODEL for name in unit)
