"""Token corpora and the deterministic, resumable batch stream.

A corpus is a folder (or a ``train`` file with a ``val`` sibling) of flat token files: ``train.bin`` / ``val.bin``,
each a raw little-endian array, optionally xz-compressed (``.bin.xz``, decompressed once into the cache folder). The
token dtype comes from ``meta.json`` when the folder has one (every corpus :mod:`fp4jax_experiments.prepare`
writes does), else from the caller, else uint16 (nanoGPT's format). Named corpora:

  stdlib   byte-level, built on first use from the running interpreter's standard library (no download)
  linux    byte-level linux-6.12 research corpus (``data/linux-6.12``, the cache, or ``../shared/data/linux-6.12``)

The cache folder is ``$FP4JAX_CACHE`` or ``~/.cache/fp4jax`` unless a caller passes one (``data/`` in a checkout is
git-ignored and travels to GPU machines).

Batches: the training tokens are cut into W = ⌊(n−1)/T⌋ windows of T+1 tokens (stride T). Row j of step s reads
window π_e(g mod W) with g = s·B + j and e = ⌊g/W⌋, where π_e is the permutation of epoch e drawn from
``numpy.random.default_rng([seed, e])``. A batch is a pure function of (seed, step), so the step is the stream's whole
position: saving it in a checkpoint resumes the exact same batches.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import lzma
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fp4jax_experiments import prepare
from fp4jax_experiments.prepare import default_cache_dir

REPO_ROOT = Path(__file__).resolve().parents[1]
SPLITS = ("train", "val")
NANOGPT_DTYPE = "uint16"
VOCAB_ROUNDING = 64  # inferred vocabularies are rounded up to a multiple of 64 (GPT-2's 50257 → nanoGPT's 50304)
MAX_INFERRED_VOCAB = 1 << 20  # a larger inferred vocabulary means the token dtype is wrong
TEXT_SNIFF_BYTES = 4096  # multi-byte token files whose first bytes are all printable ASCII are refused as text
TEXT_BYTES = frozenset(range(32, 127)) | {9, 10, 13}


@dataclasses.dataclass(frozen=True, eq=False)
class Corpus:
  """Train/val token arrays (1-D, usually memmaps) with the vocabulary size and bytes per token (None if unknown)."""

  name: str
  train: np.ndarray
  val: np.ndarray
  vocab_size: int
  bytes_per_token: float | None


def load_corpus(
  spec: str | os.PathLike,
  cache_dir: str | os.PathLike | None = None,
  token_dtype: str | None = None,
  vocab_size: int | None = None,
) -> Corpus:
  """The corpus named by ``spec``: "stdlib", "linux", a corpus folder, or a train ``.bin``/``.bin.xz`` file.

  ``token_dtype`` applies to folders without ``meta.json``; ``vocab_size`` overrides the one from ``meta.json``
  or, for uint16 data without one, the inferred max(token)+1 rounded up to a multiple of 64.
  """
  cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
  if spec == "stdlib":
    folder = cache / prepare.stdlib_corpus_name()
    if not (folder / "meta.json").exists():
      prepare.build_stdlib_corpus(folder)
    return _load_folder(folder, cache, token_dtype, vocab_size, name="stdlib")
  if spec == "linux":
    return _load_folder(find_linux_corpus(cache), cache, "uint8", vocab_size, name="linux-6.12")
  path = Path(spec)
  if path.is_dir():
    return _load_folder(path, cache, token_dtype, vocab_size, name=path.name)
  if path.is_file() and path.name.endswith((".bin", ".bin.xz")):
    val = path.with_name(path.name.replace("train", "val"))
    if "train" not in path.name or not val.exists():
      raise ValueError(
        f"data={spec!r}: a token file needs a sibling validation file named like it with "
        f"'train' replaced by 'val' (looked for {val})"
      )
    files = {"train": path, "val": val}
    return _load_files(files, path.parent, cache, token_dtype, vocab_size, name=path.parent.name)
  raise ValueError(f"data={spec!r} is not 'stdlib', 'linux', a corpus folder, or an existing train .bin/.bin.xz file")


def find_linux_corpus(cache: Path) -> Path:
  """The linux-6.12 folder: ``$FP4JAX_LINUX_DATA``, the cache, ``./data``, the checkout's ``data/``,
  ``../shared/data``."""
  env = os.environ.get("FP4JAX_LINUX_DATA")
  candidates = [Path(env)] if env else []
  candidates += [
    cache / "linux-6.12",
    Path("data/linux-6.12"),
    REPO_ROOT / "data" / "linux-6.12",
    REPO_ROOT.parent / "shared" / "data" / "linux-6.12",
  ]
  for folder in candidates:
    if any((folder / f"train{ext}").exists() for ext in (".bin", ".bin.xz")):
      return folder
  raise FileNotFoundError(
    "data='linux': no linux-6.12 corpus found in "
    + ", ".join(map(str, candidates))
    + "; build it with `fp4jax-prepare linux` or set FP4JAX_LINUX_DATA"
  )


def _load_folder(folder: Path, cache: Path, token_dtype, vocab_size, name: str) -> Corpus:
  files = {}
  for split in SPLITS:
    found = [folder / f"{split}{ext}" for ext in (".bin", ".bin.xz") if (folder / f"{split}{ext}").exists()]
    if not found:
      raise FileNotFoundError(f"data={str(folder)!r}: missing {split}.bin or {split}.bin.xz")
    files[split] = found[0]
  return _load_files(files, folder, cache, token_dtype, vocab_size, name)


def _load_files(files: dict[str, Path], folder: Path, cache: Path, token_dtype, vocab_size, name: str) -> Corpus:
  meta = read_meta(folder / "meta.json")
  dtype = np.dtype(meta.get("dtype") or token_dtype or NANOGPT_DTYPE)
  if dtype not in (np.uint8, np.uint16, np.uint32):
    raise ValueError(f"token_dtype={dtype.name!r} must be uint8, uint16 or uint32")
  manifest = folder / "MANIFEST.json"
  expected = _read_json(manifest, "a MANIFEST.json of {split: {bytes, sha256}}") if manifest.exists() else {}
  arrays = {}
  for split, path in files.items():
    if path.name.endswith(".xz"):
      path = decompress_cached(path, cache, expected.get(split, {}).get("sha256"))
    elif isinstance(meta.get(split), dict):
      _check_recorded(path, meta[split], folder / "meta.json")
    arrays[split] = token_array(path, dtype)
  byte_level = dtype == np.uint8
  tops = {split: int(a.max()) for split, a in arrays.items()}
  source = "the vocab_size argument" if vocab_size is not None else None
  if vocab_size is None and meta.get("vocab_size") is not None:
    vocab_size, source = meta["vocab_size"], f"{folder / 'meta.json'}"
  if vocab_size is None:
    top = max(tops.values())
    vocab_size = 256 if byte_level else -(-(top + 1) // VOCAB_ROUNDING) * VOCAB_ROUNDING
    source = f"inferred from the largest token id, {top}"
    if vocab_size > MAX_INFERRED_VOCAB:
      raise ValueError(
        f"data={str(files['train'])!r}: token id {top} implies a vocabulary of {vocab_size}, "
        f"more than {MAX_INFERRED_VOCAB}; are these {dtype.name} tokens? Give the dtype and "
        "vocab_size in a meta.json"
      )
  for split, top in tops.items():
    if top >= vocab_size:
      raise ValueError(
        f"data={str(files[split])!r} holds token id {top}, outside the vocabulary of "
        f"vocab_size={vocab_size} ({source}): expected ids in [0, {vocab_size})"
      )
  bytes_per_token = meta.get("bytes_per_token", 1.0 if byte_level else None)
  return Corpus(name, arrays["train"], arrays["val"], int(vocab_size), bytes_per_token)


def _read_json(path: Path, expected: str) -> dict:
  try:
    value = json.loads(path.read_text())
  except (UnicodeDecodeError, json.JSONDecodeError) as err:
    raise ValueError(f"{path} is not valid JSON ({err}); expected {expected}") from None
  if not isinstance(value, dict):
    raise ValueError(f"{path} holds a JSON {type(value).__name__}; expected {expected}")
  return value


def read_meta(path: Path) -> dict:
  """A corpus's ``meta.json`` ({} if there is none), checked: dtype a token dtype, vocab_size a positive integer.

  Raises:
      ValueError: naming the file, if it is not such a JSON object.
  """
  if not path.exists():
    return {}
  expected = 'a JSON object like {"dtype": "uint8", "vocab_size": 256, "train": {"bytes": N, "sha256": HEX}}'
  meta = _read_json(path, expected)
  if meta.get("dtype") is not None and meta["dtype"] not in ("uint8", "uint16", "uint32"):
    raise ValueError(f"{path}: dtype={meta['dtype']!r} must be uint8, uint16 or uint32")
  vocab = meta.get("vocab_size")
  if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int) or vocab <= 0):
    raise ValueError(f"{path}: vocab_size={vocab!r} must be a positive integer")
  return meta


def _check_recorded(path: Path, record: dict, meta_path: Path) -> None:
  """``path`` has the size and sha256 that ``meta_path`` records for it (either may be absent)."""
  size = path.stat().st_size
  if record.get("bytes") is not None and size != record["bytes"]:
    raise ValueError(
      f"{path} has {size} bytes but {meta_path} records {record['bytes']}: the file is truncated or was replaced"
    )
  if record.get("sha256") is not None and (actual := sha256_file(path)) != record["sha256"]:
    raise ValueError(
      f"{path}: sha256 {actual} does not match the {record['sha256']} of {meta_path}: the file is "
      "corrupted or was replaced"
    )


def token_array(path: Path, dtype: np.dtype) -> np.ndarray:
  """The tokens of a raw little-endian ``.bin`` file as a read-only memmap, checked for what training needs.

  Raises:
      ValueError: naming the file, if its size is not a whole number of ``dtype`` tokens, it holds fewer than 2
          tokens, or it looks like text (printable bytes only) while ``dtype`` is wider than a byte.
  """
  size = path.stat().st_size
  if size % dtype.itemsize:
    raise ValueError(
      f"{path} has {size} bytes, not a whole number of {dtype.name} tokens of {dtype.itemsize} "
      "bytes: truncated, or another token dtype (meta.json's dtype, --token-dtype)"
    )
  if size < 2 * dtype.itemsize:
    raise ValueError(f"{path} holds {size // dtype.itemsize} {dtype.name} tokens; at least 2 are needed")
  if dtype.itemsize > 1:
    with open(path, "rb") as f:
      head = f.read(TEXT_SNIFF_BYTES)
    if all(b in TEXT_BYTES for b in head):
      raise ValueError(
        f"{path} looks like a text file (its first {len(head)} bytes are printable ASCII), not "
        f"{dtype.name} tokens; build a byte-level corpus with `fp4jax-prepare "
        "text OUT FILE`"
      )
  return np.memmap(path, dtype=dtype, mode="r")


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while block := f.read(chunk):
      digest.update(block)
  return digest.hexdigest()


def decompress_cached(path: Path, cache: Path, expected_sha256: str | None = None) -> Path:
  """Decompress ``path`` (.xz) once into ``cache/decompressed/<sha256(xz)[:16]>/``; check ``expected_sha256``.

  Safe when several processes (a sweep's runs) start at once: each writes its own temporary file and the first
  atomic ``os.replace`` wins; the others replace it with identical bytes.
  """
  out = cache / "decompressed" / sha256_file(path)[:16] / path.name[: -len(".xz")]
  if out.exists():
    return out
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
  try:
    with lzma.open(path) as src, open(tmp, "wb") as dst:
      shutil.copyfileobj(src, dst, 1 << 24)
  except (lzma.LZMAError, EOFError) as err:
    tmp.unlink(missing_ok=True)
    raise ValueError(
      f"{path} is not a complete xz stream ({err}): truncated or corrupted; expected an xz-compressed token file"
    ) from None
  if expected_sha256 is not None and (actual := sha256_file(tmp)) != expected_sha256:
    tmp.unlink()
    raise ValueError(f"{path}: decompressed sha256 {actual} does not match the MANIFEST's {expected_sha256}")
  os.replace(tmp, out)
  return out


@functools.lru_cache(maxsize=4)
def _epoch_permutation(seed: int, epoch: int, n_windows: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(n_windows)


@dataclasses.dataclass(frozen=True, eq=False)
class BatchStream:
  """Training batches (batch_size, seq_len + 1) int32 as a pure function of the step (see the module docstring)."""

  tokens: np.ndarray
  batch_size: int
  seq_len: int
  seed: int

  def __post_init__(self):
    if self.batch_size <= 0 or self.seq_len <= 0:
      raise ValueError(f"batch_size={self.batch_size} and seq_len={self.seq_len} must be positive")
    if self.n_windows < 1:
      raise ValueError(f"seq_len={self.seq_len} is longer than the {self.tokens.size}-token training split")

  @property
  def n_windows(self) -> int:
    return (self.tokens.size - 1) // self.seq_len

  def batch(self, step: int) -> np.ndarray:
    """Rows: windows π_e(g mod W), g = step·B + j, of T+1 tokens starting at multiples of T."""
    g = step * self.batch_size + np.arange(self.batch_size)
    epochs, within = np.divmod(g, self.n_windows)
    windows = np.array([_epoch_permutation(self.seed, int(e), self.n_windows)[w] for e, w in zip(epochs, within)])
    return _gather(self.tokens, windows * self.seq_len, self.seq_len + 1)

  def iterate(self, start_step: int = 0) -> Iterator[np.ndarray]:
    """Batches of steps start_step, start_step + 1, ... (the resumed stream is the uninterrupted one)."""
    step = start_step
    while True:
      yield self.batch(step)
      step += 1


def eval_batches(tokens: np.ndarray, batch_size: int, seq_len: int, n_batches: int) -> list[np.ndarray]:
  """A fixed evaluation set: n_batches·batch_size windows of T+1 tokens at evenly spaced starts over ``tokens``."""
  if tokens.size < seq_len + 1:
    raise ValueError(f"seq_len={seq_len} is longer than the {tokens.size}-token validation split")
  starts = np.linspace(0, tokens.size - seq_len - 1, n_batches * batch_size).astype(np.int64)
  rows = _gather(tokens, starts, seq_len + 1)
  return [rows[i * batch_size : (i + 1) * batch_size] for i in range(n_batches)]


def _gather(tokens: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
  return np.stack([np.asarray(tokens[s : s + length]) for s in starts]).astype(np.int32)
