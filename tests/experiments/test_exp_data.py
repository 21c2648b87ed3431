"""Corpora: .bin / .bin.xz round trips, MANIFEST checks, prepare commands, the deterministic batch stream."""

import hashlib
import io
import json
import lzma
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from fp4jax_experiments import data, prepare


def _write_pair(folder, train, val, suffix=".bin"):
  folder.mkdir(parents=True, exist_ok=True)
  for split, arr in (("train", train), ("val", val)):
    raw = arr.tobytes()
    (folder / f"{split}{suffix}").write_bytes(lzma.compress(raw) if suffix.endswith(".xz") else raw)


def test_nanogpt_uint16_round_trip_and_inferred_vocab(tmp_path):
  rng = np.random.default_rng(0)
  train, val = rng.integers(0, 50257, 5000, dtype=np.uint16), rng.integers(0, 300, 700, dtype=np.uint16)
  train[0] = 50256
  _write_pair(tmp_path / "gpt2", train, val)
  for spec in (tmp_path / "gpt2", tmp_path / "gpt2" / "train.bin"):
    corpus = data.load_corpus(spec, cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(corpus.train, train)
    np.testing.assert_array_equal(corpus.val, val)
    assert corpus.vocab_size == 50304 and corpus.bytes_per_token is None
  with pytest.raises(ValueError, match="vocab_size=1000"):
    data.load_corpus(tmp_path / "gpt2", cache_dir=tmp_path / "cache", vocab_size=1000)


def test_xz_corpus_is_decompressed_once_and_checked_against_manifest(tmp_path):
  train = np.frombuffer(b"hello world, " * 300, np.uint8)
  val = np.frombuffer(b"goodbye " * 50, np.uint8)
  folder = tmp_path / "bytes"
  _write_pair(folder, train, val, ".bin.xz")
  manifest = {
    s: {"bytes": a.size, "sha256": hashlib.sha256(a.tobytes()).hexdigest()} for s, a in (("train", train), ("val", val))
  }
  (folder / "MANIFEST.json").write_text(json.dumps(manifest))
  corpus = data.load_corpus(folder, cache_dir=tmp_path / "cache", token_dtype="uint8")
  np.testing.assert_array_equal(corpus.train, train)
  assert corpus.vocab_size == 256 and corpus.bytes_per_token == 1.0
  assert len(list((tmp_path / "cache" / "decompressed").rglob("*.bin"))) == 2

  manifest["val"]["sha256"] = "0" * 64
  (folder / "MANIFEST.json").write_text(json.dumps(manifest))
  with pytest.raises(ValueError, match="MANIFEST"):
    data.load_corpus(folder, cache_dir=tmp_path / "other_cache", token_dtype="uint8")


def test_bad_data_argument_is_named(tmp_path):
  with pytest.raises(ValueError, match="data="):
    data.load_corpus(tmp_path / "missing.txt")
  (tmp_path / "tokens.bin").write_bytes(b"\0" * 10)
  with pytest.raises(ValueError, match="'train' replaced by 'val'"):
    data.load_corpus(tmp_path / "tokens.bin")


def test_prepare_text_splits_bytes_in_order(tmp_path):
  (tmp_path / "a.txt").write_bytes(b"a" * 60)
  (tmp_path / "b.txt").write_bytes(b"b" * 40)
  prepare.main(
    ["text", str(tmp_path / "out"), str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), "--val-fraction", "0.25"]
  )
  corpus = data.load_corpus(tmp_path / "out", cache_dir=tmp_path)
  assert bytes(corpus.train) == b"a" * 60 + b"b" * 15 and bytes(corpus.val) == b"b" * 25


def test_source_tree_split_is_order_independent_and_follows_the_hash_rule():
  files = [(f"dir/file_{i}.py", f"x = {i}\0\n".encode()) for i in range(400)]
  splits = prepare.split_source_files(files)
  assert splits == prepare.split_source_files(reversed(files))
  val_files = [p for p, _ in files if prepare.is_validation_file(p)]
  assert 0 < len(val_files) < 20
  assert splits["val"] == b"".join(c.replace(b"\0", b"") + b"\n\n" for p, c in sorted(files) if p in val_files)
  assert b"\0" not in splits["train"]


def test_linux_selection_and_rebuild_from_a_tarball(tmp_path):
  sizes = {
    "Documentation/b.rst": 10,
    "Documentation/a.rst": 10,
    "kernel/x.c": 50,
    "kernel/y.h": 50,
    "Makefile": 5,
    "Documentation/img.svg": 7,
  }
  chosen = prepare.select_linux_files(sizes, budget=30)
  code_first = min(["kernel/x.c", "kernel/y.h"], key=lambda p: hashlib.sha256(p.encode()).hexdigest())
  assert chosen == ["Documentation/a.rst", "Documentation/b.rst", code_first]

  contents = {
    "Documentation/a.rst": b"Title\n=====\n",
    "drivers/a.c": b"int a;\0\n",
    "include/b.h": b"#define B\n",
    "drivers/net/v6.c": b"int v6;\n",
    "scripts/run.sh": b"echo\n",
  }
  assert prepare.is_validation_file("drivers/net/v6.c")  # sha256 % 100 == 0: the val split is not empty
  tarball = tmp_path / "linux-source-6.12.tar.xz"
  with tarfile.open(tarball, "w:xz") as tar:
    for path, content in contents.items():
      info = tarfile.TarInfo(f"linux-source-6.12/{path}")
      info.size = len(content)
      tar.addfile(info, io.BytesIO(content))
  expected = prepare.split_source_files((p, c) for p, c in contents.items() if not p.endswith(".sh"))
  assert expected["val"] == b"int v6;\n\n\n"
  manifest = {s: {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()} for s, b in expected.items()}
  manifest["files"] = 4
  (tmp_path / "MANIFEST.json").write_text(json.dumps(manifest))
  prepare.build_linux_corpus(tmp_path / "out", tarball, tmp_path / "MANIFEST.json")
  assert (tmp_path / "out" / "train.bin").read_bytes() == expected["train"]
  assert b"\0" not in expected["train"] and b"echo" not in expected["train"]


def test_linux_rebuild_refuses_a_manifest_mismatch(tmp_path):
  contents = {f"Documentation/d{i}.rst": f"doc {i}\n".encode() for i in range(300)}
  tarball = tmp_path / "src.tar.xz"
  with tarfile.open(tarball, "w:xz") as tar:
    for path, content in contents.items():
      info = tarfile.TarInfo(f"top/{path}")
      info.size = len(content)
      tar.addfile(info, io.BytesIO(content))
  (tmp_path / "M.json").write_text(
    json.dumps({"train": {"bytes": 1, "sha256": "0"}, "val": {"bytes": 1, "sha256": "0"}})
  )
  with pytest.raises(ValueError, match="expects"):
    prepare.build_linux_corpus(tmp_path / "out", tarball, tmp_path / "M.json")


def test_stdlib_corpus_is_deterministic(tmp_path):
  first = prepare.build_stdlib_corpus(tmp_path / "a")
  second = prepare.build_stdlib_corpus(tmp_path / "b")
  assert first == second
  assert first["train"]["bytes"] > 1_000_000 and first["val"]["bytes"] > 10_000
  assert b"def " in (tmp_path / "a" / "val.bin").read_bytes()[:200_000]


def test_batch_stream_is_a_function_of_the_step():
  tokens = np.arange(1001, dtype=np.uint16)
  stream = data.BatchStream(tokens, batch_size=3, seq_len=10, seed=7)
  assert stream.n_windows == 100
  it = stream.iterate(start_step=5)
  for step in range(5, 12):
    np.testing.assert_array_equal(next(it), stream.batch(step))
  batch = stream.batch(0)
  assert batch.shape == (3, 11) and batch.dtype == np.int32
  np.testing.assert_array_equal(np.diff(batch, axis=1), 1)  # contiguous windows
  assert (batch[:, 0] % 10 == 0).all()
  again = data.BatchStream(tokens, batch_size=3, seq_len=10, seed=7)
  np.testing.assert_array_equal(again.batch(40), stream.batch(40))
  other = data.BatchStream(tokens, batch_size=3, seq_len=10, seed=8)
  assert not np.array_equal(other.batch(0), stream.batch(0))


def test_batch_stream_visits_every_window_once_per_epoch():
  tokens = np.arange(241, dtype=np.uint16)
  stream = data.BatchStream(tokens, batch_size=4, seq_len=8, seed=0)  # 30 windows: epochs straddle batches
  starts = np.concatenate([stream.batch(s)[:, 0] for s in range(15)])
  assert sorted(starts[:30]) == list(range(0, 240, 8)) and sorted(starts[30:]) == list(range(0, 240, 8))
  assert not np.array_equal(starts[:30], starts[30:])


def test_eval_batches_are_fixed_and_cover_the_split():
  tokens = np.arange(500, dtype=np.uint16)
  batches = data.eval_batches(tokens, batch_size=2, seq_len=16, n_batches=3)
  assert len(batches) == 3 and batches[0][0, 0] == 0 and batches[-1][-1, -1] == 499
  with pytest.raises(ValueError, match="seq_len=600"):
    data.eval_batches(tokens, 2, 600, 1)


def test_processes_decompressing_at_once_all_get_the_file(tmp_path):
  """Regression: a sweep's runs start together; a shared temporary name made all but one of them crash."""
  payload = bytes(range(256)) * 20000
  src = tmp_path / "train.bin.xz"
  src.write_bytes(lzma.compress(payload))
  script = (
    "import sys; from pathlib import Path; from fp4jax_experiments import data; "
    "print(data.decompress_cached(Path(sys.argv[1]), Path(sys.argv[2])))"
  )
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", script, str(src), str(tmp_path / "cache")],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for _ in range(4)
  ]
  outs = [p.communicate(timeout=120) for p in procs]
  assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
  paths = {out.strip() for out, _ in outs}
  assert len(paths) == 1 and Path(paths.pop()).read_bytes() == payload
  assert not list((tmp_path / "cache").rglob("*.tmp"))


def _byte_corpus(tmp_path):
  (tmp_path / "t.txt").write_bytes(b"some training text, " * 50)
  prepare.prepare_text(tmp_path / "c", [tmp_path / "t.txt"])
  return tmp_path / "c"


def test_odd_sized_bin_names_the_file_and_the_token_size(tmp_path):
  _write_pair(tmp_path / "c", np.arange(100, dtype=np.uint16), np.arange(50, dtype=np.uint16))
  with open(tmp_path / "c" / "train.bin", "ab") as f:
    f.write(b"\0")
  with pytest.raises(ValueError, match=r"train\.bin has 201 bytes, not a whole number of uint16 tokens of 2"):
    data.load_corpus(tmp_path / "c", cache_dir=tmp_path)


def test_empty_bin_names_the_file(tmp_path):
  _write_pair(tmp_path / "c", np.arange(100, dtype=np.uint16), np.arange(0, dtype=np.uint16))
  with pytest.raises(ValueError, match=r"val\.bin holds 0 uint16 tokens; at least 2"):
    data.load_corpus(tmp_path / "c", cache_dir=tmp_path)


def test_truncated_bin_is_caught_by_the_size_in_meta_json(tmp_path):
  folder = _byte_corpus(tmp_path)
  raw = (folder / "train.bin").read_bytes()
  (folder / "train.bin").write_bytes(raw[:-10])
  with pytest.raises(ValueError, match=rf"train\.bin has {len(raw) - 10} bytes but .*meta\.json records {len(raw)}"):
    data.load_corpus(folder, cache_dir=tmp_path)


def test_corrupt_bin_is_caught_by_the_sha256_in_meta_json(tmp_path):
  folder = _byte_corpus(tmp_path)
  raw = bytearray((folder / "val.bin").read_bytes())
  raw[3] ^= 1
  (folder / "val.bin").write_bytes(bytes(raw))
  with pytest.raises(ValueError, match=r"val\.bin: sha256 .* does not match .*meta\.json"):
    data.load_corpus(folder, cache_dir=tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_truncated_or_corrupt_xz_names_the_file(tmp_path, damage):
  _write_pair(tmp_path / "c", np.frombuffer(b"hello world " * 500, np.uint8), np.arange(50, dtype=np.uint8), ".bin.xz")
  path = tmp_path / "c" / "train.bin.xz"
  raw = bytearray(path.read_bytes())
  if damage == "truncated":
    raw = raw[: len(raw) // 2]
  else:
    raw[len(raw) // 2] ^= 0xFF
  path.write_bytes(bytes(raw))
  with pytest.raises(ValueError, match=r"train\.bin\.xz is not a complete xz stream"):
    data.load_corpus(tmp_path / "c", cache_dir=tmp_path / "cache", token_dtype="uint8")
  assert not list((tmp_path / "cache").rglob("*.tmp"))


@pytest.mark.parametrize(
  "text,match",
  [
    ('{"dtype": "uint8", "vocab', "meta.json is not valid JSON"),
    ('["uint8"]', "meta.json holds a JSON list"),
    ('{"dtype": "int8"}', "meta.json: dtype='int8' must be uint8"),
    ('{"vocab_size": -3}', "vocab_size=-3 must be a positive integer"),
  ],
)
def test_broken_meta_json_names_the_file(tmp_path, text, match):
  folder = _byte_corpus(tmp_path)
  (folder / "meta.json").write_text(text)
  with pytest.raises(ValueError, match=match):
    data.load_corpus(folder, cache_dir=tmp_path)


def test_text_file_passed_as_uint16_tokens_is_refused(tmp_path):
  text = b"def f(x):\n    return x + 1\n" * 200
  (tmp_path / "train.bin").write_bytes(text)
  (tmp_path / "val.bin").write_bytes(text[:400])
  with pytest.raises(ValueError, match=r"train\.bin looks like a text file .* not uint16 tokens"):
    data.load_corpus(tmp_path / "train.bin", cache_dir=tmp_path)


def test_token_ids_outside_the_vocabulary_name_the_file(tmp_path):
  _write_pair(tmp_path / "c", np.arange(100, dtype=np.uint16), np.full(10, 300, np.uint16))
  (tmp_path / "c" / "meta.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": 256}))
  with pytest.raises(ValueError, match=r"val\.bin' holds token id 300, outside the vocabulary of vocab_size=256"):
    data.load_corpus(tmp_path / "c", cache_dir=tmp_path)
  _write_pair(tmp_path / "d", np.array([0, 1 << 30], np.uint32), np.arange(4, dtype=np.uint32))
  with pytest.raises(ValueError, match=r"train\.bin.*token id 1073741824 implies a vocabulary"):
    data.load_corpus(tmp_path / "d", cache_dir=tmp_path, token_dtype="uint32")
