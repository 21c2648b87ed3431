"""The documentation site's structure (the build itself, executing the notebooks, runs in .ci/run): every page is
reachable from the table of contents, every notebook is a Jupytext MyST notebook the build executes, and the
README's and the pages' relative links point at files that exist."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _pages():
  return {p.relative_to(DOCS).with_suffix("").as_posix() for p in DOCS.rglob("*.md") if "_build" not in p.parts}


def _toctree_entries():
  text = (DOCS / "index.md").read_text()
  blocks = re.findall(r"```\{toctree\}\n(.*?)```", text, flags=re.S)
  return {line.strip() for b in blocks for line in b.splitlines() if line.strip() and not line.startswith(":")}


def test_every_page_is_in_the_table_of_contents():
  entries = _toctree_entries()
  assert entries - _pages() == set()  # no entry without a page
  assert _pages() - entries == {"index"}  # no page left out


def test_notebooks_are_jupytext_myst_with_a_python_kernel():
  notebooks = sorted((DOCS / "notebooks").glob("*.md"))
  assert {p.stem for p in notebooks} >= {
    "quantization_in_10_minutes",
    "fp4_training_step",
    "quantize_a_model",
    "scaling_laws",
  }
  for path in notebooks:
    text = path.read_text()
    front = re.match(r"---\n(.*?)\n---\n", text, flags=re.S)
    assert front, f"{path.name}: no front matter"
    assert "format_name: myst" in front.group(1) and "name: python3" in front.group(1), path.name
    assert text.count("```{code-cell} ipython3") >= 3, path.name


def test_docs_build_executes_notebooks_and_fails_on_errors():
  conf = (DOCS / "conf.py").read_text()
  assert re.search(r'^nb_execution_mode = "(force|cache)"', conf, flags=re.M)
  assert re.search(r"^nb_execution_raise_on_error = True", conf, flags=re.M)


def _relative_links(path: pathlib.Path):
  text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code blocks hold no links
  for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
    if not re.match(r"[a-z]+:", target):
      yield target


def test_relative_links_exist():
  files = [ROOT / "README.md", *(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]
  missing = [
    (f.relative_to(ROOT).as_posix(), t) for f in files for t in _relative_links(f) if not (f.parent / t).exists()
  ]
  assert missing == []
  assert sum(1 for _ in _relative_links(ROOT / "README.md")) >= 10
