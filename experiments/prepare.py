"""Build byte-level corpora (train.bin, val.bin, meta.json) from text files, the stdlib, or the linux-6.12 sources.

  fp4jax-prepare text  OUT_DIR FILE [FILE ...] [--val-fraction 0.1]
  fp4jax-prepare stdlib [OUT_DIR]
  fp4jax-prepare linux  [OUT_DIR] [--tarball /usr/src/linux-source-6.12.tar.xz] [--manifest M.json]

Every corpus is raw bytes (token = byte, vocab 256, dtype uint8) with a ``meta.json`` holding the dtype, vocabulary,
sizes and sha256 of each split. Source-tree corpora follow one rule (the linux-6.12 recipe of shared/data/README.md):
selected files in path order, NUL bytes removed, each followed by a blank line (b"\\n\\n"); a file is validation
when int(sha256(relative path), 16) mod 100 == 0, else training.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import sysconfig
import tarfile
from collections.abc import Iterable
from pathlib import Path


def default_cache_dir() -> Path:
  """``$FP4JAX_CACHE`` or ``~/.cache/fp4jax``: where prepared corpora are built and found."""
  return Path(os.environ.get("FP4JAX_CACHE", "~/.cache/fp4jax")).expanduser()


SEPARATOR = b"\n\n"
LINUX_TARBALL = "/usr/src/linux-source-6.12.tar.xz"
LINUX_BYTE_BUDGET = 200_000_000


def is_validation_file(path: str) -> bool:
  """int(sha256(path), 16) mod 100 == 0: the validation rule shared by all source-tree corpora."""
  return int(hashlib.sha256(path.encode()).hexdigest(), 16) % 100 == 0


def write_corpus(out_dir: Path, splits: dict[str, bytes], source: str) -> dict:
  """Write ``{split}.bin`` for each split and a ``meta.json``; return the metadata."""
  out_dir.mkdir(parents=True, exist_ok=True)
  meta = {"source": source, "dtype": "uint8", "vocab_size": 256, "bytes_per_token": 1.0}
  for split, data in splits.items():
    if not data:
      raise ValueError(f"split {split!r} of {source} is empty")
    (out_dir / f"{split}.bin").write_bytes(data)
    meta[split] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
  (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")  # written last: marks the corpus complete
  return meta


def split_source_files(files: Iterable[tuple[str, bytes]]) -> dict[str, bytes]:
  """Concatenate (path, content) pairs in path order into train/val by :func:`is_validation_file`."""
  parts = {"train": [], "val": []}
  for path, content in sorted(files):
    parts["val" if is_validation_file(path) else "train"] += [content.replace(b"\0", b""), SEPARATOR]
  return {split: b"".join(chunks) for split, chunks in parts.items()}


def prepare_text(out_dir: Path, files: list[Path], val_fraction: float = 0.1) -> dict:
  """Bytes of ``files`` concatenated in the given order; the first (1 − val_fraction) train, the rest val."""
  if not 0 < val_fraction < 1:
    raise ValueError(f"val_fraction={val_fraction} must be in (0, 1)")
  data = b"".join(Path(f).read_bytes() for f in files)
  cut = int(len(data) * (1 - val_fraction))
  return write_corpus(out_dir, {"train": data[:cut], "val": data[cut:]}, source=", ".join(map(str, files)))


def stdlib_corpus_name() -> str:
  """Cache folder name of this interpreter's stdlib corpus, e.g. ``stdlib-cpython-3.11.7``."""
  return f"stdlib-{sys.implementation.name}-{'.'.join(map(str, sys.version_info[:3]))}"


def build_stdlib_corpus(out_dir: Path) -> dict:
  """Every ``*.py`` under the running interpreter's stdlib folder (site-/dist-packages excluded), no download."""
  root = Path(sysconfig.get_paths()["stdlib"])
  paths = [p for p in root.rglob("*.py") if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts)]
  splits = split_source_files((p.relative_to(root).as_posix(), p.read_bytes()) for p in paths)
  return write_corpus(out_dir, splits, source=f"{stdlib_corpus_name()} standard library ({root})")


def select_linux_files(sizes: dict[str, int], budget: int = LINUX_BYTE_BUDGET) -> list[str]:
  """All ``Documentation/**/*.rst`` in path order, then ``.c``/``.h`` in sha256(path) order while the running total
  of (size + 2 separator bytes) is below ``budget`` (the file that crosses it is included)."""
  docs = sorted(p for p in sizes if p.startswith("Documentation/") and p.endswith(".rst"))
  code = sorted((p for p in sizes if p.endswith((".c", ".h"))), key=lambda p: hashlib.sha256(p.encode()).hexdigest())
  chosen, total = [], 0
  for path in docs + code:
    if total >= budget:
      break
    chosen.append(path)
    total += sizes[path] + len(SEPARATOR)
  return chosen


def build_linux_corpus(out_dir: Path, tarball: Path, manifest: Path | None = None) -> dict:
  """Rebuild the linux-6.12 corpus from Debian's ``linux-source-6.12`` tarball and check it against ``manifest``.

  Two streaming passes over the tarball: names and sizes (sizes after NUL removal are used, so the first pass
  reads contents too), then contents of the selected files. Paths are relative to the tarball's top folder.
  """

  def members():
    with tarfile.open(tarball, mode="r|*") as tar:
      for member in tar:
        if member.isfile() and member.name.endswith((".rst", ".c", ".h")):
          path = member.name.split("/", 1)[1] if "/" in member.name else member.name
          yield path, tar.extractfile(member).read().replace(b"\0", b"")

  sizes = {path: len(content) for path, content in members()}
  chosen = set(select_linux_files(sizes))
  splits = split_source_files((path, content) for path, content in members() if path in chosen)
  meta = write_corpus(out_dir, splits, source=f"{tarball} ({len(chosen)} files)")
  if manifest is not None:
    expected = json.loads(Path(manifest).read_text())
    for split in ("train", "val"):
      if meta[split] != expected[split]:
        raise ValueError(f"{split}: built {meta[split]} but {manifest} expects {expected[split]}")
    if expected.get("files") not in (None, len(chosen)):
      raise ValueError(f"selected {len(chosen)} files but {manifest} expects {expected['files']}")
  return meta


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="fp4jax-prepare", description=__doc__.split("\n\n")[0])
  commands = parser.add_subparsers(dest="command", required=True)
  text = commands.add_parser("text", help="byte-level corpus from text files")
  text.add_argument("out_dir", type=Path)
  text.add_argument("files", type=Path, nargs="+")
  text.add_argument("--val-fraction", type=float, default=0.1)
  stdlib = commands.add_parser("stdlib", help="the embedded default corpus (this interpreter's stdlib)")
  stdlib.add_argument("out_dir", type=Path, nargs="?", default=default_cache_dir() / stdlib_corpus_name())
  linux = commands.add_parser("linux", help="rebuild linux-6.12 from Debian's linux-source-6.12 package")
  linux.add_argument("out_dir", type=Path, nargs="?", default=default_cache_dir() / "linux-6.12")
  linux.add_argument("--tarball", type=Path, default=Path(LINUX_TARBALL))
  linux.add_argument("--manifest", type=Path, default=None, help="MANIFEST.json to check sizes and sha256 against")
  args = parser.parse_args(argv)

  if args.command == "text":
    meta = prepare_text(args.out_dir, args.files, args.val_fraction)
  elif args.command == "stdlib":
    meta = build_stdlib_corpus(args.out_dir)
  else:
    if not args.tarball.exists():
      parser.error(f"--tarball {args.tarball} does not exist (apt-get install linux-source-6.12)")
    meta = build_linux_corpus(args.out_dir, args.tarball, args.manifest)
  print(f"wrote {args.out_dir}: train {meta['train']['bytes']:,} bytes, val {meta['val']['bytes']:,} bytes")


if __name__ == "__main__":
  main()
