"""Packed export: weights as QTensors equal the recipe's forward weights; orbax round trip is bit-identical."""

import json
import re
import shutil

import flax_models as fm
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import fp4jax
from fp4jax._src.flax import export
from fp4jax.flax import Rule, keep_high_precision, quantize

_INIT = jax.jit(fm.LinenTransformer(fm.Config()).init)  # one compile, not the eager init's op-by-op dispatch


def _params():
  toks = fm.tokens(jax.random.key(0))[:, :-1]
  return _INIT(jax.random.key(1), toks)["params"]


def _qtensors(tree):
  flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, fp4jax.QTensor))[0]
  return {jax.tree_util.keystr(k): v for k, v in flat}


@pytest.mark.parametrize(
  "recipe",
  # slow tier; default representative: [nvidia_nvfp4] (the pack against fake_quantize, the orbax round trip; quartet
  # differs by its spec alone: MXFP4 in a 32-point Hadamard domain)
  ["nvidia_nvfp4", pytest.param("quartet", marks=pytest.mark.slow)],
)
def test_pack_is_the_recipes_forward_weight_and_orbax_round_trip_is_bit_identical(recipe, tmp_path):
  params = _params()
  packed = export.pack(params, select=export.ALL_KERNELS, recipe=recipe)
  spec = fp4jax.recipes.get(recipe).fwd_rhs
  kernel = params["block_0"]["qkv"]["kernel"]
  q = packed["block_0"]["qkv"]["kernel"]
  assert isinstance(q, fp4jax.QTensor) and q.codes.dtype == jnp.uint8 and q.fmt == spec.fmt
  fq = lambda w: fp4jax.fake_quantize(
    w, spec.fmt, axis=0, block_shape=spec.block_shape, hadamard=spec.hadamard or None, hadamard_signs="none"
  )
  want = jax.jit(fq)(kernel)
  np.testing.assert_array_equal(export.unpack(packed)["block_0"]["qkv"]["kernel"], want)
  assert not isinstance(packed["embed"]["embedding"], fp4jax.QTensor)  # only "kernel" leaves by default

  export.save(tmp_path / "ckpt", packed)
  restored = export.restore(tmp_path / "ckpt")
  got, ref = _qtensors(restored), _qtensors(packed)
  assert got.keys() == ref.keys()
  for k, a in ref.items():
    b = got[k]
    if isinstance(a, fp4jax.QTensor):
      assert (a.shape, a.axis, a.fmt, a.block_shape, a.hadamard, a.dtype) == (
        b.shape,
        b.axis,
        b.fmt,
        b.block_shape,
        b.hadamard,
        b.dtype,
      )
      for field in ("codes", "scales", "global_scale"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and x.shape == y.shape, (k, field)
        np.testing.assert_array_equal(
          jax.lax.bitcast_convert_type(x, jnp.uint8), jax.lax.bitcast_convert_type(y, jnp.uint8)
        )
    else:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bytes_saved_by_packing():
  params = _params()
  packed = export.pack(params, select=export.ALL_KERNELS, recipe="nvidia_nvfp4")
  n_kernel = sum(q.codes.size * 2 for q in _qtensors(packed).values() if isinstance(q, fp4jax.QTensor))
  n_qt = sum(isinstance(q, fp4jax.QTensor) for q in _qtensors(packed).values())
  report = export.bytes_report(params, packed)
  # fp32 kernels, 4 bytes per element, become 1/2 byte (E2M1 code) + 1/256 (one E4M3 scale per 16x16 tile)
  # + 4 bytes (fp32 tensor scale) per kernel; all kernel dims here are multiples of 16.
  packed_kernels = n_kernel // 2 + n_kernel // 256 + 4 * n_qt
  assert report["params_bytes"] - report["packed_bytes"] == 4 * n_kernel - packed_kernels
  assert report["saved_bytes"] == 4 * n_kernel - packed_kernels


def test_export_errors():
  params = _params()
  with pytest.raises(ValueError, match=r"does not quantize weights to block-scaled FP4"):
    export.pack(params, select=export.ALL_KERNELS, recipe="fp8")
  with pytest.raises(ValueError, match=r"select='nope' matches no weight"):
    export.pack(params, select="nope")


RULES = [keep_high_precision(first=1, last=1), Rule(r".*/(qkv|o)", "nvfp4_rtn"), Rule(r".*", "nvidia_nvfp4")]
CFG3 = fm.Config(n_layers=3)  # bf16 compute on fp32 params
TOKS = fm.tokens(jax.random.key(0))[:, :-1]


def _planned(block):
  """{layer path: recipe or None} RULES give, written out by hand: the first and last block and the LM head (by
  DEFAULT_HIGH_PRECISION) stay high precision, block 1 runs nvfp4_rtn on qkv/o and nvidia_nvfp4 on the MLP."""
  out = {f"{block(i)}/{n}": None for i in (0, 2) for n in ("qkv", "o", "gate_up", "down")}
  out.update(
    {
      f"{block(1)}/qkv": "nvfp4_rtn",
      f"{block(1)}/o": "nvfp4_rtn",
      f"{block(1)}/gate_up": "nvidia_nvfp4",
      f"{block(1)}/down": "nvidia_nvfp4",
      "lm_head": None,
    }
  )
  return out


def _check_packed_layers(params, packed, block):
  """Planned layers: a QTensor equal to the recipe's forward weight spec applied to the bf16 kernel (the layer's
  compute dtype); the others: untouched."""
  flat_p, flat_q = (
    dict(jax.tree_util.tree_flatten_with_path(t, is_leaf=lambda x: isinstance(x, fp4jax.QTensor))[0])
    for t in (params, packed)
  )
  key = lambda path: tuple(jax.tree_util.DictKey(int(p) if p.isdigit() else p) for p in path.split("/"))
  unpacked = export.unpack(packed)
  for path, recipe in _planned(block).items():
    w, q = flat_p[key(path + "/kernel")], flat_q[key(path + "/kernel")]
    if recipe is None:
      assert not isinstance(q, fp4jax.QTensor), path
      np.testing.assert_array_equal(q, w)
      continue
    spec = fp4jax.recipes.get(recipe).fwd_rhs
    want = fp4jax.fake_quantize(
      w.astype(jnp.bfloat16),
      spec.fmt,
      axis=0,
      block_shape=spec.block_shape,
      hadamard=spec.hadamard or None,
      hadamard_signs="none",
    )
    assert isinstance(q, fp4jax.QTensor) and q.fmt == spec.fmt and q.block_shape == (spec.block_shape or (16,)), path
    got = dict(jax.tree_util.tree_flatten_with_path(unpacked)[0])[key(path + "/kernel")]
    np.testing.assert_array_equal(got, want, err_msg=path)
  assert sum(isinstance(q, fp4jax.QTensor) for q in flat_q.values()) == 4  # nothing else (embedding, norms) packed


# The two rule-following packs run a quantized 3-block model op by op before and after packing and compare every
# packed layer with fake_quantize: about 50 s each from cold caches (measured: ~95 s for the NNX one alone). Slow
# tier; default representative: the parts, tests/flax/test_flax_rules.py (the rules' layer plan, linen and NNX),
# test_pack_is_the_recipes_forward_weight_and_orbax_round_trip_is_bit_identical[nvidia_nvfp4] (a pack by a recipe is
# its forward weight), test_pack_without_rules_says_what_to_pass (pack resolving a quantized model's rules).
@pytest.mark.slow
def test_pack_follows_the_rules_of_a_linen_model():
  qmodel = quantize(fm.LinenTransformer(CFG3), RULES, deterministic=True)
  params = qmodel.init(jax.random.key(1), TOKS)["params"]
  want = qmodel.apply({"params": params}, TOKS)
  for rules in (RULES, qmodel):
    packed = export.pack(params, rules, dtype=jnp.bfloat16)
    _check_packed_layers(params, packed, lambda i: f"block_{i}")
    # the quantized model re-quantizes the unpacked weights to the same codes, scales and (bf16) tensor scale
    np.testing.assert_array_equal(qmodel.apply({"params": export.unpack(packed)}, TOKS), want)


@pytest.mark.slow  # slow tier; default representative: see test_pack_follows_the_rules_of_a_linen_model
def test_pack_follows_the_rules_of_an_nnx_model():
  model = quantize(fm.NnxTransformer(CFG3, nnx.Rngs(0)), RULES, deterministic=True)
  want = model(TOKS)
  state = nnx.state(model, nnx.Param)
  params = state.to_pure_dict()
  packed = export.pack(params, model)  # each layer's own recipe and dtype
  _check_packed_layers(params, packed, lambda i: f"blocks/{i}")
  _check_packed_layers(params, export.pack(params, RULES, dtype=jnp.bfloat16), lambda i: f"blocks/{i}")
  nnx.replace_by_pure_dict(state, export.unpack(packed))
  nnx.update(model, state)
  np.testing.assert_array_equal(model(TOKS), want)


def test_pack_without_rules_says_what_to_pass():
  params = _params()
  for kwargs in ({}, {"recipe": "nvidia_nvfp4"}):
    with pytest.raises(TypeError, match=r"pass the rules the model was quantized with, pack\(params, rules\)"):
      export.pack(params, **kwargs)
  with pytest.raises(ValueError, match=r"pack: layer 'blocks/block/o' has a kernel of shape \(2, 128, 128\)"):
    scan = quantize(fm.LinenScanTransformer(fm.Config(n_layers=2)), [Rule(r".*/o", "nvidia_nvfp4")])
    # the quantized model's parameter tree is its module's (QuantizedModule): initialized without an FP4 compile
    export.pack(scan.module.init(jax.random.key(1), TOKS)["params"], scan)


def _saved(tmp_path):
  packed = export.pack(_params(), select=export.ALL_KERNELS, recipe="nvidia_nvfp4")
  export.save(tmp_path / "ckpt", packed)
  return packed, tmp_path / "ckpt"


def _copy(src, dst, rel):
  shutil.copytree(src, dst)
  return dst / rel


def test_restore_raises_on_any_flipped_truncated_or_extra_file(tmp_path):
  packed, ckpt = _saved(tmp_path)
  restored = export.restore(ckpt)
  for (k, a), b in zip(_qtensors(packed).items(), _qtensors(restored).values()):  # untouched: bit-exact
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      assert x.dtype == y.dtype and x.shape == y.shape, k
      bits = lambda t: jax.lax.bitcast_convert_type(t, jnp.uint8)
      np.testing.assert_array_equal(bits(x), bits(y))
  files = sorted(p.relative_to(ckpt) for p in ckpt.rglob("*") if p.is_file())
  assert export.MANIFEST in {str(f) for f in files} and len(files) >= 4, files
  for i, rel in enumerate(files):
    target = _copy(ckpt, tmp_path / f"flip{i}", rel)
    data = bytearray(target.read_bytes())
    n = min(64, len(data))
    start = (len(data) - n) // 2
    data[start : start + n] = bytes(b ^ 0xFF for b in data[start : start + n]) if n else bytes(64)  # empty: extend
    target.write_bytes(bytes(data))
    name = export.MANIFEST if str(rel) == export.MANIFEST else str(rel)
    with pytest.raises(export.CorruptCheckpointError, match=re.escape(name)):
      export.restore(tmp_path / f"flip{i}")
  largest = max(files, key=lambda f: (ckpt / f).stat().st_size)
  target = _copy(ckpt, tmp_path / "truncated", largest)
  target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
  with pytest.raises(export.CorruptCheckpointError, match=re.escape(f"file '{largest}'") + r".*truncated"):
    export.restore(tmp_path / "truncated")
  (_copy(ckpt, tmp_path / "extra", "orbax") / "stray").write_bytes(b"x")
  with pytest.raises(export.CorruptCheckpointError, match=r"files \['orbax/stray'\].*not in"):
    export.restore(tmp_path / "extra")


def test_restore_checks_every_array_against_its_saved_sha256(tmp_path):
  _, ckpt = _saved(tmp_path)
  manifest = json.loads((ckpt / export.MANIFEST).read_text())
  body = {k: manifest[k] for k in ("arrays", "files")}
  body["arrays"]["block_0/qkv/kernel/scales"] = "0" * 64  # a consistent manifest that disagrees on one array
  (ckpt / export.MANIFEST).write_text(json.dumps({**body, "sha256": export._sha256_json(body)}))
  with pytest.raises(export.CorruptCheckpointError, match=r"array 'block_0/qkv/kernel/scales'"):
    export.restore(ckpt)


def test_an_interrupted_save_leaves_nothing_restore_accepts(tmp_path, monkeypatch):
  packed, ckpt = _saved(tmp_path)
  with pytest.raises(FileExistsError, match=r"exists"):
    export.save(ckpt, packed)

  def crash(*args):
    raise KeyboardInterrupt

  monkeypatch.setattr(export, "_write_manifest", crash)  # dies after orbax wrote its data, before the manifest
  with pytest.raises(KeyboardInterrupt):
    export.save(tmp_path / "crashed", packed)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no target, no temporary sibling left
  shutil.copytree(ckpt, tmp_path / "no_manifest")
  (tmp_path / "no_manifest" / export.MANIFEST).unlink()  # what a save killed before the manifest would hold
  with pytest.raises(export.CorruptCheckpointError, match=r"has no fp4jax_manifest.json.*verify=False"):
    export.restore(tmp_path / "no_manifest")
  assert _qtensors(export.restore(tmp_path / "no_manifest", verify=False)).keys() == _qtensors(packed).keys()
