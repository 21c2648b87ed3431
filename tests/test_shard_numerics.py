"""``fp4jax.sharding.sharded`` recipes: one ``dot_general`` under ``shard_map`` with the tokens split over "data"
(or the outputs or inputs over "model") quantizes every operand (forward, dgrad, wgrad) bit for bit as one device
does on the logical tensors; only the sums over the split axis become per-device partial sums. Plus the
logical-index hook of ``fp4jax.bits`` and ``ordered_psum`` (in process; ``jax.vmap``
binds the axis name).

The sharded runs need 4 devices, requested before jax is imported: one subprocess (this file run as a script, CPU)
computes every comparison and prints them as JSON. It captures the operands each GEMM consumes by wrapping
``fp4jax._src.dot.matmul`` and running the custom VJP's forward and backward rules (``_qdot_fwd`` / ``_qdot_bwd``) as
plain functions; the public ``dot_general`` is checked end to end on a 3D lhs.
"""

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fp4jax
from fp4jax._src import bits
from fp4jax._src.reductions import leading_pairwise_sum

SHARDS = 4
M, K, N = 512, 128, 128  # tokens (128 per shard: quartet2's 128-point Hadamard along tokens fits), features, outputs
# FP8 and Microsoft FP4 too: per-tensor FP8 scales, per-row E2M1 scales, DGE and OCC bounds across shards.
RECIPES = ("nvfp4_rtn", "nvidia_nvfp4", "quartet2", "fp8", "ms_fp4")
FEATURE_RECIPES = RECIPES + ("quartet",)
SPLITS = ("outputs", "inputs")
# The default tier's cases (docs/testing.md); the subprocess computes only the selected ones. Along the tokens
# nvidia_nvfp4 (2D weight tiles, RHT, SR at global indices; nvfp4_rtn is computed for the negative control); along
# the features nvfp4_rtn on the inputs split (row-parallel: the forward's contraction split, Y partials).
DEFAULT_RECIPES, DEFAULT_FEATURE_RECIPES, DEFAULT_SPLITS = ("nvidia_nvfp4",), ("nvfp4_rtn",), ("inputs",)


def _tiered(names, default):
  # slow tier; default representative: the cases in DEFAULT_RECIPES, DEFAULT_FEATURE_RECIPES and DEFAULT_SPLITS
  return [n if n in default else pytest.param(n, marks=pytest.mark.slow) for n in names]


def _feature_cases():
  """(recipe, split) of the feature-sharded test: DEFAULT_FEATURE_RECIPES x DEFAULT_SPLITS by default, the rest
  slow."""
  default = lambda name, split: name in DEFAULT_FEATURE_RECIPES and split in DEFAULT_SPLITS  # noqa: E731
  # slow tier; default representative: [nvfp4_rtn-inputs]
  return [
    (name, split) if default(name, split) else pytest.param(name, split, marks=pytest.mark.slow)
    for name in FEATURE_RECIPES
    for split in SPLITS
  ]


# Two splits at once on a 2x2 mesh: the tokens over "data" and the outputs or inputs over "model"
TWO_SPLITS = tuple(f"{name}:{split}" for name in FEATURE_RECIPES for split in SPLITS)
DEFAULT_TWO_SPLITS = ("nvidia_nvfp4:outputs",)
OPERANDS = ("fwd_lhs", "fwd_rhs", "dgrad_lhs", "dgrad_rhs", "wgrad_lhs", "wgrad_rhs")  # matmul's (a, b) per GEMM


# ------------------------------------------------------------------------------------------------ subprocess side
def _inputs(m=M, k=K, n=N):
  """Canonical X (1, m, k) bf16, W (1, n, k) f32, dY (1, m, n) bf16; rows and features ramp in magnitude so shard
  amaxes differ whichever axis is split."""
  import jax.numpy as jnp  # noqa: PLC0415

  ks = jax.random.split(jax.random.key(0), 4)
  ramp = jnp.linspace(0.25, 4.0, m)[None, :, None]
  x = jax.random.normal(ks[0], (1, m, k)) * jnp.exp(jax.random.normal(ks[1], (1, 1, k))) * ramp
  w = jax.random.normal(ks[2], (1, n, k)) * 0.05 * jnp.linspace(0.5, 2.0, n)[None, :, None]
  dy = jax.random.normal(ks[3], (1, m, n)) * ramp * 1e-3 * jnp.linspace(2.0, 0.5, n)
  return x.astype(jnp.bfloat16), w, dy.astype(jnp.bfloat16)


def _bits(a) -> np.ndarray:
  a = np.asarray(a)
  return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def compute(
  recipes=RECIPES, feature_recipes=FEATURE_RECIPES, splits=SPLITS, public=("nvidia_nvfp4",), two_splits=TWO_SPLITS
) -> dict:
  """Every comparison of the tests below, for the token-sharded ``recipes``, the feature-sharded ``feature_recipes``
  on the feature ``splits`` (nvfp4_rtn always: the negative controls), the public ``dot_general`` under the
  ``public`` recipes (none: not run) and the ``two_splits`` cases ("recipe:split": tokens and that feature split)."""
  import jax.numpy as jnp  # noqa: PLC0415
  from jax import lax  # noqa: PLC0415
  from jax.sharding import PartitionSpec as P  # noqa: PLC0415

  import fp4jax  # noqa: PLC0415
  from fp4jax._src import dot  # noqa: PLC0415

  mesh = jax.make_mesh((SHARDS,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  captured = []
  matmul = dot.matmul

  def spy(a, b, precision=None):  # the operands each GEMM consumes, in GEMM order
    captured.append((a, b))
    return matmul(a, b, precision)

  dot.matmul = spy

  def gemms(recipe, x, w, dy, key):
    """(y, dx, dw, [(values, scale)] * 6) of fp4jax.dot's custom VJP rules on canonical operands."""
    captured.clear()
    static = dot._Static(recipe, None, "xla", jnp.float32, x.dtype, w.dtype)
    y, res = dot._qdot_fwd(static, x, w, key)
    dx, dw, *_ = dot._qdot_bwd(static, res, dy)
    return y, dx, dw, [tuple(op) for pair in captured for op in pair]

  @functools.cache  # one compile per recipe and input shapes
  def sharded(recipe):
    def local(x, w, dy, key):
      y, dx, dw, ops = gemms(recipe, x, w, dy, key)
      return y, dx, lax.psum(dw, "data"), jax.tree.map(lambda a: a[None], ops)  # operands stacked per device

    return jax.jit(
      jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(P(None, "data"), P(), P(None, "data"), P()),
        out_specs=(P(None, "data"), P(None, "data"), P(), P("data")),
      )
    )

  x, w, dy = _inputs()
  key = jax.random.key(7)
  token_dims = fp4jax.sharding.SPLIT_DIMS["tokens"]
  out = {"recipes": {}, "errors": {}}

  def compare(got_ops, ref_ops, dims=token_dims):
    """Per operand: values and scale of every device equal the one-device operand (slices concatenated along the
    operand's split dim in ``dims``; per-row scales too, when the split cuts the rows)."""

    def equal(got, ref, split_dim):  # got: one slice per device
      if split_dim is None:
        return all(np.array_equal(_bits(g), _bits(ref)) for g in got)
      return np.array_equal(_bits(np.concatenate(list(got), axis=split_dim)), _bits(ref))

    same = {}
    for name, (gv, gs), (rv, rs) in zip(OPERANDS, got_ops, ref_ops):
      gv, gs = np.asarray(gv), np.asarray(gs)
      split = dims.get(name)
      row_split = split if gs.ndim == 4 and split == 1 else None  # per-row (B, R, 1) scales, their rows split
      same[name] = bool(equal(gv, rv, split) and equal(gs, rs, row_split))
    return same

  for name in dict.fromkeys(("nvfp4_rtn", *recipes)):
    ref = jax.device_get(jax.jit(lambda *a, name=name: gemms(fp4jax.recipes.get(name), *a))(x, w, dy, key))
    got = jax.device_get(sharded(fp4jax.sharding.token_sharded(name, "data"))(x, w, dy, key))
    (a, sa), (b, sb) = ref[3][4], ref[3][5]  # the wgrad operands: fp32 reordering bound of dW
    terms = np.abs(np.asarray(a, np.float64)[0]) @ np.abs(np.asarray(b, np.float64)[0]).T * abs(float(sa) * float(sb))
    bound = 2 * (M + SHARDS) * 2.0**-24 * terms
    dw_err = np.abs(np.asarray(got[2], np.float64) - np.asarray(ref[2], np.float64))
    out["recipes"][name] = {
      "operands": compare(got[3], ref[3]),
      "y": bool(np.array_equal(_bits(got[0]), _bits(ref[0]))),
      "dx": bool(np.array_equal(_bits(got[1]), _bits(ref[1]))),
      "dw_within_reorder_bound": bool(np.all(dw_err <= bound)),
      "dw_bit_identical": bool(np.array_equal(got[2], ref[2])),
    }
    if name == "nvfp4_rtn":  # negative control: the plain recipe quantizes each shard on its own
      plain = jax.device_get(sharded(fp4jax.recipes.get(name))(x, w, dy, key))
      out["plain_recipe_operands"] = compare(plain[3], ref[3])

  # Feature splits over 2 devices (tensor parallelism): the outputs N (column-parallel) or the inputs K
  # (row-parallel). Every operand as one device's; the results a device holds whole (its slice) bit for bit; the
  # partial sums over the split contraction (column: dX over N; row: Y over K) are each device's chunk GEMM of the
  # one-device operands, bit for bit (the caller adds them, e.g. fp4jax.sharding.sum_from_shards).
  fmesh = jax.make_mesh((2,), ("model",), axis_types=(jax.sharding.AxisType.Auto,))
  fx, fw, fdy = _inputs(m=128, k=256, n=256)  # 128 local features: quartet2's 128-point Hadamard fits
  split_specs = {
    "outputs": (P(), P(None, "model"), P(None, None, "model")),
    "inputs": (P(None, None, "model"), P(None, None, "model"), P()),
  }
  out["splits"] = {}
  for split, specs in ((s, split_specs[s]) for s in splits):
    dims = fp4jax.sharding.SPLIT_DIMS[split]

    def split_run(recipe, specs=specs):
      local = lambda x, w, dy, key: jax.tree.map(lambda a: a[None], gemms(recipe, x, w, dy, key))  # noqa: E731
      return jax.device_get(
        jax.jit(jax.shard_map(local, mesh=fmesh, in_specs=(*specs, P()), out_specs=P("model")))(fx, fw, fdy, key)
      )

    for name in dict.fromkeys(("nvfp4_rtn", *feature_recipes)):
      got = split_run(fp4jax.sharding.sharded(name, "model", split))
      ref = jax.device_get(jax.jit(lambda *a, name=name: gemms(fp4jax.recipes.get(name), *a))(fx, fw, fdy, key))
      if name == "nvfp4_rtn":  # negative control: the unmarked recipe takes each shard's own NVFP4 amax
        out["splits"][f"{split}/plain"] = compare(split_run(fp4jax.recipes.get(name))[3], ref[3], dims)
      whole_dims = {"outputs": {"y": 2, "dw": 1}, "inputs": {"dx": 2, "dw": 2}}[split]
      summed, (a, sa), (b, sb), dtype = (
        ("dx", ref[3][2], ref[3][3], fdy.dtype) if split == "outputs" else ("y", ref[3][0], ref[3][1], jnp.float32)
      )
      chunks = [
        dot.matmul(
          fp4jax._src.operand.Operand(a[..., c * 128 : (c + 1) * 128], sa),
          fp4jax._src.operand.Operand(b[..., c * 128 : (c + 1) * 128], sb),
        ).astype(dtype)
        for c in range(2)
      ]
      results = dict(zip(("y", "dx", "dw"), range(3)))
      # Quartet's dX partials pass its trust mask and inverse Hadamard (dot._to_input): not a plain chunk GEMM.
      emulated = not (split == "outputs" and name == "quartet")
      out["splits"][f"{split}/{name}"] = {
        "operands": compare(got[3], ref[3], dims),
        **{
          f"{r}_slices": bool(
            np.array_equal(_bits(np.concatenate(list(got[results[r]]), axis=d)), _bits(ref[results[r]]))
          )
          for r, d in whole_dims.items()
        },
        **(
          {
            f"{summed}_partials": all(
              np.array_equal(_bits(got[results[summed]][c]), _bits(chunk))
              for c, chunk in enumerate(jax.device_get(chunks))
            )
          }
          if emulated
          else {}
        ),
      }

  # The public dot_general on a 3D lhs (batch, seq, K), the batch split over "data": y and dx as one device.
  dn = (((2,), (1,)), ((), ()))
  lhs, rhs, cot = x.reshape(8, M // 8, K), w[0], dy.reshape(8, M // 8, N).astype(jnp.float32)

  def vjp(recipe, lhs, rhs, cot, key):
    y, f = jax.vjp(lambda a, b: fp4jax.dot_general(a, b, dn, recipe=recipe, key=key), lhs, rhs)
    return (y, *f(cot))

  out["public_dot_general"] = {}
  for name in public:
    ref = jax.jit(lambda *a, name=name: vjp(name, *a))(lhs, rhs, cot, key)
    recipe = fp4jax.sharding.token_sharded(name, "data")
    local = lambda a, b, c, k, recipe=recipe: vjp(recipe, a, lax.pcast(b, "data", to="varying"), c, k)[:2]  # noqa: E731
    got = jax.jit(
      jax.shard_map(local, mesh=mesh, in_specs=(P("data"), P(), P("data"), P()), out_specs=(P("data"), P("data")))
    )(lhs, rhs, cot, key)
    out["public_dot_general"][name] = {
      "y": bool(np.array_equal(_bits(got[0]), _bits(ref[0]))),
      "dx": bool(np.array_equal(_bits(got[1]), _bits(ref[1]))),
    }

  # Tokens over "data" and the outputs (column-parallel) or inputs (row-parallel) over "model" on a 2x2 mesh: each
  # device's operand is its block of the one-device operand (a dY or X cut along both of its dims). Negative
  # control: the recipe marked with the tokens only gives the operands the model axis cuts each shard's own amax.
  mesh2 = jax.make_mesh((2, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  tx, tw, tdy = _inputs(m=256, k=256, n=256)  # 128 tokens and 128 features per device: quartet2's Hadamard fits
  specs2 = {
    "outputs": (P(None, "data"), P(None, "model"), P(None, "data", "model")),
    "inputs": (P(None, "data", "model"), P(None, None, "model"), P(None, "data")),
  }

  def blocks(got_ops, ref_ops, split):
    """Per operand: every device's values and scale equal its block of the one-device operand."""
    cuts = {name: {} for name in OPERANDS}  # operand -> {dim: mesh position index (0: data, 1: model)}
    for position, kind in enumerate(("tokens", split)):
      for name, dim in fp4jax.sharding.SPLIT_DIMS[kind].items():
        cuts[name][dim] = position
    same = {}
    for name, (gv, gs), (rv, rs) in zip(OPERANDS, got_ops, ref_ops):
      gv, gs, rv, rs = (np.asarray(a) for a in (gv, gs, rv, rs))
      ok = True
      for where in np.ndindex(2, 2):
        want_v, want_s = rv, rs
        for dim, position in cuts[name].items():
          n = gv.shape[2 + dim]
          take = slice(where[position] * n, (where[position] + 1) * n)
          want_v = want_v[(slice(None),) * dim + (take,)]
          if rs.ndim == 3 and dim == 1:  # per-row (B, R, 1) scales: their rows are cut with the operand's
            want_s = want_s[:, take]
        ok &= np.array_equal(_bits(gv[where]), _bits(want_v)) and np.array_equal(_bits(gs[where]), _bits(want_s))
      same[name] = bool(ok)
    return same

  out["two_splits"] = {}
  for case in dict.fromkeys(("nvfp4_rtn:inputs", *two_splits)):  # nvfp4_rtn:inputs: the negative control's
    name, split = case.split(":")

    def two_run(recipe, split=split):
      local = lambda *a: jax.tree.map(lambda t: t[None, None], gemms(recipe, *a)[3])  # noqa: E731
      return jax.device_get(
        jax.jit(jax.shard_map(local, mesh=mesh2, in_specs=(*specs2[split], P()), out_specs=P("data", "model")))(
          tx, tw, tdy, key
        )
      )

    tokens = fp4jax.sharding.token_sharded(name, "data")
    ref = jax.device_get(jax.jit(lambda *a, name=name: gemms(fp4jax.recipes.get(name), *a))(tx, tw, tdy, key))[3]
    out["two_splits"][case] = blocks(two_run(fp4jax.sharding.sharded(tokens, "model", split)), ref, split)
    if case == "nvfp4_rtn:inputs":
      out["two_splits"][f"{case}/tokens only"] = blocks(two_run(tokens), ref, split)

  # NaN in one shard of X: the forward X operand's tensor scale is NaN on every device, as on one device.
  bad = x.at[0, M - 3, 5].set(jnp.nan)
  scales = jax.device_get(sharded(fp4jax.sharding.token_sharded("nvfp4_rtn", "data"))(bad, w, dy, key))[3][0][1]
  out["nan_in_one_shard_scales"] = [float(s) for s in scales]

  try:  # 64 tokens per device cannot hold quartet2's 128-point wgrad Hadamard chunk
    sharded(fp4jax.sharding.token_sharded("quartet2", "data"))(x[:, :256], w, dy[:, :256], key)
    out["errors"]["straddle_hadamard"] = None
  except ValueError as err:
    out["errors"]["straddle_hadamard"] = str(err)
  return out


# ------------------------------------------------------------------------------------------------ tests
@pytest.fixture(scope="module")
def results(script_json, selected_params, request):
  """``compute`` of the recipes and splits this session's tests select, in one subprocess with 4 CPU devices."""
  names = ("recipe", "feature_recipe", "split", "public_recipe", "two_split")
  args = tuple(",".join(selected_params(request, name)) for name in names)
  return script_json(__file__, f"--xla_force_host_platform_device_count={SHARDS}", timeout=600, args=args)


@pytest.mark.parametrize("recipe", _tiered(RECIPES, DEFAULT_RECIPES))
def test_every_operand_of_a_token_sharded_dot_is_the_one_device_operand(results, recipe):
  """Forward (X, W), dgrad (dY, Wᵀ), wgrad (dYᵀ, Xᵀ along the sharded tokens): values and tensor scales bit for bit;
  y and dX (row-local) bit for bit; dW differs only by the order of its fp32 sum over tokens: |ΔdW| <=
  2(M + shards)·2^-24 · Σ_m |a||b|·|s_a s_b| (the classic recursive-summation bound, both orders, plus the psum)."""
  r = results["recipes"][recipe]
  assert r["operands"] == {name: True for name in OPERANDS}, r
  assert r["y"] and r["dx"] and r["dw_within_reorder_bound"], r


def test_the_plain_recipe_under_shard_map_would_be_detected(results):
  """Negative control: without the token-sharded mark each shard has its own NVFP4 amax, so the activation-like
  operands differ from one device's, while the weight operands (the same on every device) do not."""
  plain = results["plain_recipe_operands"]
  assert not any(plain[name] for name in ("fwd_lhs", "dgrad_lhs", "wgrad_lhs", "wgrad_rhs")), plain
  assert plain["fwd_rhs"] and plain["dgrad_rhs"], plain


@pytest.mark.parametrize("feature_recipe, split", _feature_cases())  # the slow cases: _feature_cases
def test_every_operand_of_a_feature_sharded_dot_is_the_one_device_operand(results, feature_recipe, split):
  """Column-parallel (outputs split) and row-parallel (inputs split) dots on 2 devices: all six operands bit for bit;
  the results each device holds whole (column: Y, dW slices; row: dX, dW slices) bit for bit; the partial sums over
  the split contraction (column: dX; row: Y) equal the one-device operands' chunk GEMMs bit for bit."""
  r = results["splits"][f"{split}/{feature_recipe}"]
  assert r["operands"] == {name: True for name in OPERANDS}, r
  assert len(r) == (3 if (split, feature_recipe) == ("outputs", "quartet") else 4) and all(r.values()), r


@pytest.mark.parametrize("split", _tiered(SPLITS, DEFAULT_SPLITS))
def test_the_unmarked_recipe_under_a_feature_split_would_be_detected(results, split):
  """Negative control: without the mark the operands the split cuts take each shard's NVFP4 amax and differ."""
  plain = results["splits"][f"{split}/plain"]
  cut = fp4jax.sharding.SPLIT_DIMS[split]
  assert not any(plain[name] for name in cut), plain
  assert all(plain[name] for name in OPERANDS if name not in cut), plain


# slow tier; default representative: test_every_operand_of_a_token_sharded_dot_is_the_one_device_operand[nvidia_nvfp4]
@pytest.mark.parametrize("public_recipe", [pytest.param("nvidia_nvfp4", marks=pytest.mark.slow)])
def test_public_dot_general_with_a_3d_lhs_split_over_its_batch(results, public_recipe):
  """End to end: the public ``dot_general`` under ``shard_map`` (the operands' checks above run its VJP rules)."""
  assert results["public_dot_general"][public_recipe] == {"y": True, "dx": True}


@pytest.mark.parametrize("two_split", _tiered(TWO_SPLITS, DEFAULT_TWO_SPLITS))
def test_every_operand_under_tokens_and_a_feature_split_is_its_block_of_the_one_device_operand(results, two_split):
  """Data parallelism with Megatron tensor parallelism on a 2x2 mesh (tokens over "data", the outputs or inputs over
  "model"; ``sharded(token_sharded(r, "data"), "model", split)``): each device's six operands, values and scales,
  are its block of the one-device operands bit for bit, dY (column-parallel) and X (row-parallel) cut along both
  dims, their amax combined over both axes."""
  assert results["two_splits"][two_split] == {name: True for name in OPERANDS}, results["two_splits"][two_split]


def test_a_recipe_marked_with_the_tokens_only_under_two_splits_would_be_detected(results):
  """Negative control: marked with the tokens alone, the operands the model axis also cuts take each model shard's
  own NVFP4 amax and differ from one device's; the operands it does not cut stay equal."""
  plain = results["two_splits"]["nvfp4_rtn:inputs/tokens only"]
  cut = fp4jax.sharding.SPLIT_DIMS["inputs"]
  assert not any(plain[name] for name in cut), plain
  assert all(plain[name] for name in OPERANDS if name not in cut), plain


def test_nonfinite_element_in_one_shard_makes_every_tensor_scale_nan(results):
  scales = results["nan_in_one_shard_scales"]
  assert len(scales) == SHARDS and all(np.isnan(scales)), scales


def test_straddling_layouts_are_rejected(results):
  err = results["errors"]
  assert err["straddle_hadamard"] is not None and "64 local tokens are not a multiple of" in err["straddle_hadamard"]
  assert "Hadamard size 128" in err["straddle_hadamard"] and "straddle two devices" in err["straddle_hadamard"]


# ------------------------------------------------------------------------------------------------ in process
def test_index_grid_of_a_slice_is_the_logical_grid_sliced():
  logical = np.arange(4 * 6 * 8, dtype=np.uint32).reshape(4, 6, 8)
  got = bits.index_grid((2, 3, 8), origin=(1, 3, 0), logical_shape=(4, 6, 8))
  np.testing.assert_array_equal(np.asarray(got), logical[1:3, 3:6, :])
  key = jax.random.key(3)
  whole = np.asarray(bits.random_bits(key, (4, 6, 8)))
  traced = jax.jit(lambda r: bits.random_bits(key, (2, 6, 8), (r, 0, 0), (4, 6, 8)))(2)
  np.testing.assert_array_equal(np.asarray(traced), whole[2:])
  np.testing.assert_array_equal(np.asarray(bits.index_grid((3, 4))), np.arange(12).reshape(3, 4))


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(origin=(0, 0)), "both origin and logical_shape"),
    (dict(origin=(0, 0), logical_shape=(2, 3)), "must have the rank of shape .* and hold it"),
    (dict(origin=(0,), logical_shape=(8, 8)), "one entry per dim"),
    (dict(origin=(0, 0), logical_shape=(2**17, 2**16)), "at most 2\\*\\*32"),
  ],
)
def test_index_grid_arguments_are_checked(kwargs, match):
  with pytest.raises(ValueError, match=match):
    bits.index_grid((4, 4), **kwargs)


if __name__ == "__main__":  # argv: the token- and feature-sharded recipes, the splits, the public recipes, two splits
  import sys  # noqa: PLC0415

  print(json.dumps(compute(*(tuple(filter(None, arg.split(","))) for arg in sys.argv[1:6]))))


def _ordered_psum_on(stacked: np.ndarray) -> np.ndarray:
  """``ordered_psum`` over ``len(stacked)`` devices bound by ``jax.vmap``; asserts every device holds the same sum."""
  out = np.asarray(jax.jit(jax.vmap(lambda x: fp4jax.sharding.ordered_psum(x, "data"), axis_name="data"))(stacked))
  for device in out[1:]:
    np.testing.assert_array_equal(device, out[0])
  return out[0]


@pytest.mark.parametrize("devices", [1, 2, 4, 8])
@pytest.mark.parametrize("shape", [(), (5, 3), (64, 48)])
def test_ordered_psum_adds_the_devices_by_the_pairwise_tree(devices, shape):
  """Bit for bit the one-device ``leading_pairwise_sum`` of the stacked shards, for sizes that do not split evenly
  into the devices' chunks (the zero padding) and values over 8 decades (where the order shows)."""
  rng = np.random.default_rng(devices)
  stacked = (rng.standard_normal((devices, *shape)) * np.exp(rng.normal(0, 4, (devices, *shape)))).astype(np.float32)
  np.testing.assert_array_equal(_ordered_psum_on(stacked), np.asarray(leading_pairwise_sum(jnp.asarray(stacked))))


def test_ordered_psum_keeps_nan_and_inf_and_rejects_odd_device_counts():
  stacked = np.ones((4, 6), np.float32)
  stacked[2, 1], stacked[3, 4] = np.nan, np.inf
  total = _ordered_psum_on(stacked)
  assert np.isnan(total[1]) and total[4] == np.inf and np.all(total[[0, 2, 3, 5]] == 4)
  with pytest.raises(ValueError, match="3 devices, expected a power of two"):
    _ordered_psum_on(np.ones((3, 2), np.float32))


def test_sharded_marks_compose_and_refuse_a_split_or_an_axis_twice():
  """``sharded`` adds a split to a sharded recipe and keeps the recipe's fields; each operand is cut by the splits
  that SPLIT_DIMS names for it (dY of a column-parallel layer under data parallelism by both)."""
  from fp4jax._src import sharding as sharding_lib  # noqa: PLC0415

  both = fp4jax.sharding.sharded(fp4jax.sharding.token_sharded("nvidia_nvfp4", "data"), "model", "outputs")
  assert both.splits == (("tokens", "data"), ("outputs", "model"))
  assert both.fwd_lhs == fp4jax.recipes.get("nvidia_nvfp4").fwd_lhs and both.name == "nvidia_nvfp4"
  cuts = {name: sharding_lib.operand_shard(both, name) for name in OPERANDS}
  assert [(s.axis_name, s.dim) for s in cuts["dgrad_lhs"].shards] == [("data", 1), ("model", 2)]
  assert [(s.axis_name, s.dim) for s in cuts["fwd_lhs"].shards] == [("data", 1)]
  assert [(s.axis_name, s.dim) for s in cuts["wgrad_lhs"].shards] == [("data", 2), ("model", 1)]
  assert cuts["dgrad_rhs"].shards[0].axis_name == "model" and sharding_lib.operand_shard(both, "fwd_rhs") is not None
  assert sharding_lib.operand_shard(fp4jax.recipes.get("nvidia_nvfp4"), "fwd_lhs") is None
  with pytest.raises(ValueError, match="split 'tokens' appears twice"):
    fp4jax.sharding.token_sharded(fp4jax.sharding.token_sharded("nvfp4_rtn", "data"), "pod")
  with pytest.raises(ValueError, match="mesh axis 'data' appears twice"):
    fp4jax.sharding.sharded(fp4jax.sharding.token_sharded("nvfp4_rtn", "data"), "data", "inputs")
  with pytest.raises(ValueError, match="split must be one of"):
    fp4jax.sharding.sharded("nvfp4_rtn", "model", "columns")
  with pytest.raises(ValueError, match="axis must be a mesh axis name"):
    fp4jax.sharding.sharded("nvfp4_rtn", "", "outputs")
  with pytest.raises(ValueError, match="non-empty tuple"):
    fp4jax.sharding.ShardedRecipe(**{f.name: getattr(both, f.name) for f in dataclasses.fields(fp4jax.recipes.Recipe)})
