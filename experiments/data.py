"""Token corpora and the deterministic, resumable batch stream.

A corpus is a folder (or a ``train`` file with a ``val`` sibling) of flat token files: ``train.bin`` / ``val.bin``,
each a raw little-endian array, optionally xz-compressed (``.bin.xz``, decompressed once into the cache folder). The
token dtype comes from ``meta.json`` when the folder has one (every corpus :mod:`experiments.prepare` writes does),
else from the caller, else uint16 (nanoGPT's format). Named corpora:

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

REPO_ROOT = Path(__file__).resolve().parents[1]
SPLITS = ("train", "val")
NANOGPT_DTYPE = "uint16"
VOCAB_ROUNDING = 64  # inferred vocabularies are rounded up to a multiple of 64 (GPT-2's 50257 → nanoGPT's 50304)


def default_cache_dir() -> Path:
    """``$FP4JAX_CACHE`` or ``~/.cache/fp4jax``."""
    return Path(os.environ.get("FP4JAX_CACHE", "~/.cache/fp4jax")).expanduser()


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
        from experiments import prepare

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
            raise ValueError(f"data={spec!r}: a token file needs a sibling validation file named like it with "
                             f"'train' replaced by 'val' (looked for {val})")
        files = {"train": path, "val": val}
        return _load_files(files, path.parent, cache, token_dtype, vocab_size, name=path.parent.name)
    raise ValueError(f"data={spec!r} is not 'stdlib', 'linux', a corpus folder, or an existing train .bin/.bin.xz file")


def find_linux_corpus(cache: Path) -> Path:
    """The linux-6.12 folder: ``$FP4JAX_LINUX_DATA``, the cache, ``./data``, the checkout's ``data/``, ``../shared/data``."""
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
        "data='linux': no linux-6.12 corpus found in " + ", ".join(map(str, candidates))
        + "; build it with `python -m experiments.prepare linux` or set FP4JAX_LINUX_DATA"
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
    meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").exists() else {}
    dtype = np.dtype(meta.get("dtype") or token_dtype or NANOGPT_DTYPE)
    if dtype not in (np.uint8, np.uint16, np.uint32):
        raise ValueError(f"token_dtype={dtype.name!r} must be uint8, uint16 or uint32")
    manifest = folder / "MANIFEST.json"
    expected = json.loads(manifest.read_text()) if manifest.exists() else {}
    arrays = {}
    for split, path in files.items():
        if path.name.endswith(".xz"):
            path = decompress_cached(path, cache, expected.get(split, {}).get("sha256"))
        arrays[split] = np.memmap(path, dtype=dtype, mode="r")
        if arrays[split].size < 2:
            raise ValueError(f"data={str(path)!r} holds {arrays[split].size} tokens; at least 2 are needed")
    byte_level = dtype == np.uint8
    top = max(int(a.max()) for a in arrays.values())
    if vocab_size is None:
        vocab_size = meta.get("vocab_size") or (256 if byte_level else -(-(top + 1) // VOCAB_ROUNDING) * VOCAB_ROUNDING)
    if top >= vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is too small for token id {top} in data={str(folder)!r}")
    bytes_per_token = meta.get("bytes_per_token", 1.0 if byte_level else None)
    return Corpus(name, arrays["train"], arrays["val"], int(vocab_size), bytes_per_token)


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
    with lzma.open(path) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 24)
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
    return [rows[i * batch_size:(i + 1) * batch_size] for i in range(n_batches)]


def _gather(tokens: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    return np.stack([np.asarray(tokens[s:s + length]) for s in starts]).astype(np.int32)
