"""Sphinx configuration of the fp4jax documentation (MyST Markdown pages, MyST-NB notebooks executed on build).

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (``.ci/run`` does it with the ``docs``
extra installed). Every notebook under ``notebooks/`` is a Jupytext Markdown file, executed at each build; a failing
cell fails the build.
"""

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]  # the checkout first, as the tests run it (autodoc)
# The notebooks' kernels inherit this environment: the checkout first on their path too, and XLA:CPU's LLVM at -O0
# (compiling the quantized training steps dominates the build; optimization levels do not change IEEE float
# semantics, and fast math is off).
os.environ["PYTHONPATH"] = os.pathsep.join(
  filter(None, [str(ROOT), str(ROOT / "kernels"), os.environ.get("PYTHONPATH")])
)
os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), "--xla_backend_optimization_level=0"]))

project = "fp4jax"
author = "fp4jax authors"
copyright = "fp4jax authors"  # noqa: A001 (Sphinx's name)

extensions = [
  "myst_nb",
  "sphinx.ext.autodoc",
  "sphinx.ext.napoleon",
  "sphinx.ext.viewcode",
  "sphinx.ext.mathjax",
]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "jupyter_execute"]

myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 3

# Notebooks: executed on every build, in order; a cell that raises fails the build (with -W, so does a warning).
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_timeout = 600
nb_execution_show_tb = True
nb_merge_streams = True

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "sphinx_book_theme"
html_title = "fp4jax"
html_theme_options = {"show_toc_level": 2}
