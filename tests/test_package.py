"""The package is the plugin: importing it, or any of its modules, needs nothing of the `recipes` extra
(matplotlib, scikit-learn, scipy); the recipes, the benchmarks and the main job import those where they use them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXTRAS = ("sklearn", "scipy", "matplotlib")
IMPORT_EVERY_MODULE = (
    "import importlib, pkgutil, xlnet_lite\n"
    "for info in pkgutil.walk_packages(xlnet_lite.__path__, 'xlnet_lite.'):\n"
    "    importlib.import_module(info.name)\n"
)


def python(code):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_import_loads_none_of_the_extra_beyond_what_transformers_loads():
    """transformers' modeling_utils imports scipy whenever it is installed (for its object-detection losses), so the
    clean process imports that first and then asks what `import xlnet_lite` and its modules add."""
    code = (
        f"import sys, transformers.modeling_utils\nEXTRAS = {EXTRAS!r}\n"
        "before = {m for m in EXTRAS if m in sys.modules}\n"
        f"{IMPORT_EVERY_MODULE}"
        "print(sorted(m for m in EXTRAS if m in sys.modules and m not in before))\n"
    )
    assert python(code) == "[]"


@pytest.mark.slow
def test_every_module_imports_where_the_extra_is_not_installed():
    """sys.modules[name] = None is what Python does for a package that is absent: `import name` raises ImportError and
    importlib.util.find_spec(name) (transformers' is_scipy_available) answers None."""
    code = (
        f"import sys\nEXTRAS = {EXTRAS!r}\nfor name in EXTRAS:\n    sys.modules[name] = None\n"
        f"{IMPORT_EVERY_MODULE}"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in EXTRAS and sys.modules[m] is not None))\n"
    )
    assert python(code) == "[]"


def test_the_wheel_holds_the_plugin_alone():
    """main_job/ and benchmarks/ are scripts of this repository, run from its root: pyproject's package find picks
    xlnet_lite and its subpackages only, so `pip install xlnet-lite` brings no TF-IDF baseline and no scikit-learn."""
    import tomllib
    from setuptools import find_packages

    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = find_packages(REPO, include=find["include"], exclude=find.get("exclude", ()))
    assert "xlnet_lite" in packages and {name.split(".")[0] for name in packages} == {"xlnet_lite"}
