"""FP4 training recipes as data: how each operand of each of a linear layer's three GEMMs is quantized.

A linear layer ``Y = X·Wᵀ`` (X: tokens x features, W: outputs x features) runs three GEMMs, each quantizing both of its
operands along its own contraction axis:

    fwd    Y  = X  · Wᵀ     operands X (along features)  and W  (along features)
    dgrad  dX = dY · W      operands dY (along outputs)  and Wᵀ (along outputs)
    wgrad  dW = dYᵀ · X     operands dYᵀ (along tokens)  and Xᵀ (along tokens)

A ``Recipe`` holds one ``OperandSpec`` per operand. Recipes are frozen dataclasses: build a variant with
``dataclasses.replace`` (e.g. ``replace(recipes.get("nvidia_nvfp4"), wgrad_lhs=...)``). ``get(name)`` / ``names()``
is the registry; one constructor per paper below, whose docstring cites the paper and states every choice.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Literal, get_args

from fp4jax._src.formats import E2M1_CHANNEL, E4M3, E5M2, MXFP4, NVFP4, E2M1ChannelFormat, FP4Format
from fp4jax._src.spec import QuantizeSpec

FP8_FORMATS = (E4M3, E5M2)
Estimator = Literal["ste", "trust_mask", "dge"]
Source = Literal["input", "forward"]
GEMMS = ("fwd", "dgrad", "wgrad")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OperandSpec(QuantizeSpec):
  """How one GEMM operand is quantized (always along that GEMM's contraction axis): a ``QuantizeSpec`` (its fields
  and their validation: ``fmt``, ``block_shape``, ``rounding``, ``hadamard``, ``signs``, ``scale_pow2``, ``clip``,
  ``clip_quantile``, ``amax``) plus the fields of the operand's role in the GEMM. ``fmt=None`` is an operand used
  at its input precision; both operands of a GEMM must have the same ``hadamard`` and ``signs`` (they are rotated
  with the same signs, so the rotation cancels in the product; ``Recipe`` checks it); ``clip`` is for forward
  operands only; ``"fixed"`` signs are one constant random vector for the whole run.

  Attributes:
    estimator: backward rule of a forward operand: ``"ste"`` (straight-through), ``"trust_mask"`` (Quartet/QuEST:
      gradient only where the scaled value was not clipped) or ``"dge"`` (Microsoft FP4's differentiable gradient
      estimator, weights quantized with ``E2M1_CHANNEL``).
    dge_k, dge_cap: DGE's sharpness k and the cap on its derivative.
    source: for the backward operands W and X: ``"input"`` (quantize the layer input) or ``"forward"`` (re-quantize
      the forward-quantized tensor; with ``fmt=None`` and no Hadamard it is reused unchanged).

  Raises:
    TypeError, ValueError: as ``QuantizeSpec``, and for an ``estimator`` or ``source`` outside its options or an
      estimator the format does not take, naming the field.
  """

  estimator: Estimator = "ste"
  dge_k: float = 5.0
  dge_cap: float = 3.0
  source: Source = "input"

  def __post_init__(self):
    super().__post_init__()
    fmt = self.fmt
    if self.estimator not in get_args(Estimator):
      raise ValueError(f"OperandSpec.estimator must be one of {get_args(Estimator)}, got {self.estimator!r}")
    if self.estimator == "trust_mask" and not isinstance(fmt, FP4Format):
      raise ValueError(f"OperandSpec.estimator 'trust_mask' needs an FP4Format fmt (its block scales), got {fmt!r}")
    if self.estimator == "dge" and not isinstance(fmt, E2M1ChannelFormat):
      raise ValueError(f"OperandSpec.estimator 'dge' is defined on E2M1_CHANNEL weights, got fmt={fmt!r}")
    if self.source not in get_args(Source):
      raise ValueError(f"OperandSpec.source must be one of {get_args(Source)}, got {self.source!r}")

  @property
  def is_identity(self) -> bool:
    return self.fmt is None and not self.hadamard and self.clip == "none"


HIGH_PRECISION = OperandSpec()
REUSE_FORWARD = OperandSpec(source="forward")


# The canonical GEMM dims (fp4jax.dot: X (B, M, K), W (B, N, K)) by name, and each GEMM's contraction dim.
DIMS = ("tokens", "outputs", "inputs")  # M, N, K (the names of fp4jax.sharding's splits)
CONTRACTION = {"fwd": "inputs", "dgrad": "outputs", "wgrad": "tokens"}
_OTHER_DIM = {
  "fwd_lhs": "tokens",
  "fwd_rhs": "outputs",
  "dgrad_lhs": "tokens",
  "dgrad_rhs": "inputs",
  "wgrad_lhs": "outputs",
  "wgrad_rhs": "inputs",
}  # each operand's non-contraction dim


@dataclasses.dataclass(frozen=True)
class ShapeRule:
  """A unit a GEMM dim is cut into: ``dim`` ("tokens", "outputs" or "inputs", i.e. features) holds whole
  ``multiple``-element units in GEMM ``gemm`` because of ``why`` (blocks, 16x16 tiles, Hadamard chunks).

  ``fp4jax.dot_general`` zero-pads a dim that is not a multiple (blocks: ``fp4jax.quantize``; Hadamard chunks along a
  GEMM's contraction: ``fp4jax.dot``), so on one device the rule only says where padding happens. Under
  ``fp4jax.sharding`` the local length of the split dim must be a multiple: a unit would straddle two devices.
  """

  gemm: str
  dim: str
  multiple: int
  why: str

  def describe(self, recipe_name: str) -> str:
    return f"{recipe_name}'s {self.gemm} GEMM ({self.why})"


def _units(spec: OperandSpec) -> tuple[tuple[int, str], ...]:
  """``(multiple, why)`` of the units an operand's contraction axis is cut into."""
  out = []
  if isinstance(spec.fmt, FP4Format):
    out.append((spec.fmt.block_size, f"{spec.fmt.name} {spec.fmt.block_size}-element blocks"))
  if spec.hadamard:
    out.append((spec.hadamard, f"{spec.hadamard}-point Hadamard chunks"))
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class Recipe:
  """Per-GEMM operand specs of a linear layer (see the module docstring for which operand is which)."""

  name: str
  fwd_lhs: OperandSpec = HIGH_PRECISION
  fwd_rhs: OperandSpec = HIGH_PRECISION
  dgrad_lhs: OperandSpec = HIGH_PRECISION
  dgrad_rhs: OperandSpec = HIGH_PRECISION
  wgrad_lhs: OperandSpec = HIGH_PRECISION
  wgrad_rhs: OperandSpec = HIGH_PRECISION

  def __post_init__(self):
    for gemm in GEMMS:
      lhs, rhs = self.operands(gemm)
      if (lhs.hadamard, lhs.signs) != (rhs.hadamard, rhs.signs):
        raise ValueError(
          f"recipe {self.name!r}: both {gemm} operands must share the Hadamard size and signs so the rotation "
          f"cancels; got ({lhs.hadamard}, {lhs.signs!r}) and ({rhs.hadamard}, {rhs.signs!r})"
        )
    for field in ("dgrad_lhs", "dgrad_rhs", "wgrad_lhs", "wgrad_rhs"):
      spec = getattr(self, field)
      if spec.estimator != "ste" or spec.clip != "none":
        raise ValueError(
          f"recipe {self.name!r}: {field} is a backward operand; estimators and clipping are forward-only"
        )
    for field in ("fwd_lhs", "fwd_rhs", "dgrad_lhs", "wgrad_lhs"):
      if getattr(self, field).source != "input":
        raise ValueError(f"recipe {self.name!r}: {field}.source must be 'input' (only W and X can come from forward)")
    for fwd, bwd in (("fwd_lhs", "dgrad_rhs"), ("fwd_rhs", "wgrad_rhs")):
      est = getattr(self, fwd).estimator
      if est == "trust_mask" and getattr(self, bwd).source != "forward":
        raise ValueError(
          f"recipe {self.name!r}: {fwd} trust_mask acts in the forward domain; set {bwd}.source='forward'"
        )
      if est == "dge" and self.fwd_lhs.hadamard:
        raise ValueError(f"recipe {self.name!r}: {fwd} dge needs an unrotated forward (fwd hadamard=0)")

  def operands(self, gemm: str) -> tuple[OperandSpec, OperandSpec]:
    """``(lhs, rhs)`` specs of ``gemm`` in ``("fwd", "dgrad", "wgrad")``."""
    return getattr(self, f"{gemm}_lhs"), getattr(self, f"{gemm}_rhs")

  @property
  def specs(self) -> tuple[OperandSpec, ...]:
    return tuple(s for g in GEMMS for s in self.operands(g))

  @property
  def shape_rules(self) -> tuple[ShapeRule, ...]:
    """Every ``ShapeRule`` of the recipe: per GEMM, the units of its contraction dim (the lcm over both operands'
    blocks and Hadamard chunks), and the non-contraction dim of an operand quantized in 16x16 tiles."""
    rules = []
    for gemm in GEMMS:
      units = dict.fromkeys(u for spec in self.operands(gemm) for u in _units(spec))  # ordered, no repeats
      if units:
        why = " and ".join(w for _, w in units) + " along it"
        rules.append(ShapeRule(gemm, CONTRACTION[gemm], math.lcm(*(m for m, _ in units)), why))
    for gemm in GEMMS:
      for side, spec in zip(("lhs", "rhs"), self.operands(gemm)):
        if spec.block_shape is not None:
          rules.append(ShapeRule(gemm, _OTHER_DIM[f"{gemm}_{side}"], spec.block_shape[0], "16x16 tiles across it"))
    return tuple(rules)

  @property
  def is_random(self) -> bool:
    """True when some operand uses stochastic rounding, MS-EDEN or fresh random Hadamard signs (needs a key)."""
    return any(s.is_random for s in self.specs)

  @property
  def is_identity(self) -> bool:
    """True when nothing is quantized or rotated: the recipe is exactly ``lax.dot_general``."""
    return all(s.is_identity for s in self.specs)


# ------------------------------------------------------------------------------------------------ the recipes
def bf16() -> Recipe:
  """No quantization: every GEMM is ``lax.dot_general`` on the inputs as given (the reference).

  Returns:
    The ``Recipe`` named "bf16", all of whose operands are None (high precision).
  """
  return Recipe("bf16")


def fp8() -> Recipe:
  """The common FP8 baseline (Transformer Engine per-tensor current scaling; Micikevicius et al., arXiv 2209.05433).

  Forward X and W: E4M3, per-tensor scale 448/amax, RTN. dgrad: dY in E5M2 (scale 57344/amax, RTN), W the forward
  E4M3 tensor reused (a per-tensor scale does not depend on the axis). wgrad: dYᵀ in E5M2, Xᵀ the forward E4M3
  tensor. Straight-through everywhere.

  Returns:
    The ``Recipe``.
  """
  e4m3, e5m2 = OperandSpec(fmt=E4M3), OperandSpec(fmt=E5M2)
  return Recipe("fp8", e4m3, e4m3, e5m2, REUSE_FORWARD, e5m2, REUSE_FORWARD)


def nvfp4_rtn() -> Recipe:
  """Naive NVFP4 everywhere: all six operands NVFP4 1x16 (TE scales), RTN, no Hadamard, straight-through.

  The floor every real recipe must beat: its backward is deterministic and biased.

  Returns:
    The ``Recipe``.
  """
  q = OperandSpec(fmt=NVFP4)
  return Recipe("nvfp4_rtn", q, q, q, q, q, q)


def nvidia_nvfp4() -> Recipe:
  """NVIDIA's NVFP4 pretraining recipe (NVIDIA, "Pretraining LLMs with NVFP4", arXiv 2509.25149).

  Forward: X NVFP4 1x16, RTN; W NVFP4 16x16 2D tiles, RTN (FP32 tensor scales, E4M3 block scales, TE order).
  dgrad: dY NVFP4 1x16 with stochastic rounding; W the forward 2D tensor reused unchanged (2D tiles make W and Wᵀ
  identical). wgrad: dYᵀ and Xᵀ quantized along tokens after a 16-point random Hadamard transform with one fixed sign
  vector (Transformer Engine's, ``hadamard.TE_SIGNS_16``) on both; SR on dYᵀ, RTN on Xᵀ (from the layer input).
  Straight-through estimators. (The paper keeps ~15% of layers in BF16; that is a model-level policy, not this op.)

  Returns:
    The ``Recipe``.
  """
  x_fwd = OperandSpec(fmt=NVFP4)
  w_fwd = OperandSpec(fmt=NVFP4, block_shape=(16, 16))
  dy = OperandSpec(fmt=NVFP4, rounding="sr")
  dy_t = OperandSpec(fmt=NVFP4, rounding="sr", hadamard=16, signs="te")
  x_t = OperandSpec(fmt=NVFP4, hadamard=16, signs="te")
  return Recipe("nvidia_nvfp4", x_fwd, w_fwd, dy, REUSE_FORWARD, dy_t, x_t)


def quartet() -> Recipe:
  """Quartet (Castro et al., "Quartet: Native FP4 Training Can Be Optimal for LLMs", arXiv 2505.14669), MXFP4.

  Forward (QuEST): X and W rotated by the 32-point Hadamard along K (no signs), MXFP4 with the QuEST scale
  2^floor(log2(0.48708·σ_b)) (σ_b the block's standard deviation), RTN; backward through the trust mask
  (gradient only where ``|x̂/s| < 6``) and then Hᵀ. Backward (after Tseng et al., arXiv 2502.20586): E, Ŵᵀ, Eᵀ, X̂ᵀ
  rotated by a 32-point Hadamard with fresh random signs per call, shared by the four backward operands; MXFP4
  with 3/4 headroom (amax/s in [3, 6), nothing clips) and stochastic rounding; Ŵ and X̂ re-quantized from the
  forward-quantized tensors.

  Returns:
    The ``Recipe``.
  """
  fwd = OperandSpec(
    fmt=dataclasses.replace(MXFP4, scale_mode="quest"), hadamard=32, signs="none", estimator="trust_mask"
  )
  bwd = OperandSpec(
    fmt=dataclasses.replace(MXFP4, scale_mode="floor_headroom"), rounding="sr", hadamard=32, signs="random"
  )
  from_fwd = dataclasses.replace(bwd, source="forward")
  return Recipe("quartet", fwd, fwd, bwd, from_fwd, bwd, from_fwd)


def quartet2(four_over_six: bool = True) -> Recipe:
  """Quartet II (IST Austria; NVFP4 training with MS-EDEN, FP4-REFERENCE.md §5).

  Forward: X and W NVFP4 1x16, RTN, with four-over-six block scales (each block keeps the lower-error of the
  scales mapping its max to 6 and to 4; tensor scale amax/(256·6)) when ``four_over_six``, plain TE scales otherwise.
  Backward: E, Wᵀ, Eᵀ, Xᵀ rotated by a 128-point Hadamard with fresh random signs per call (shared by the backward
  GEMMs) and quantized by MS-EDEN (RTN plus an EDEN correction folded into a stochastically rounded E4M3 scale,
  unbiased); Wᵀ and Xᵀ re-quantized from the forward NVFP4 tensors. Straight-through estimators.

  Args:
    four_over_six: the forward's four-over-six block scales (the paper's recipe); False gives plain TE scales
      (the recipe "quartet2_no46").

  Returns:
    The ``Recipe``.
  """
  fwd_fmt = dataclasses.replace(NVFP4, scale_mode="four_over_six") if four_over_six else NVFP4
  fwd = OperandSpec(fmt=fwd_fmt)
  bwd = OperandSpec(fmt=NVFP4, rounding="eden", hadamard=128, signs="random")
  from_fwd = dataclasses.replace(bwd, source="forward")
  return Recipe("quartet2" if four_over_six else "quartet2_no46", fwd, fwd, bwd, from_fwd, bwd, from_fwd)


def ms_fp4(*, pow2_scale: bool = False, fp4_gradients: bool = False, clip_quantile: float = 0.99) -> Recipe:
  """Microsoft FP4 (Wang et al., "Optimizing Large Language Model Training Using FP4 Quantization", arXiv 2501.17116).

  Forward: E2M1 with absmax scaling, γ = 6/max|x| per token for X and per output channel for W (``pow2_scale``:
  2^floor(log2 γ) as in the released code), RTN. X gets outlier clamping and compensation (OCC): clamped to its
  [1 - q, q] quantiles (q = ``clip_quantile``, 0.99) before quantizing, the clamped-off residual added back at high
  precision. W's gradient goes through the differentiable gradient estimator (DGE, k = 5, derivative capped at 3)
  evaluated on the scaled weight; X's is straight-through. Backward: gradients dY / dYᵀ in FP8 E5M2 (per-tensor
  current scaling), W and X the forward FP4 tensors cast to FP8 E4M3 (as the released MS-AMP code does);
  ``fp4_gradients``: dY / dYᵀ in E2M1 with per-row absmax scales along the contraction axis instead.

  Args:
    pow2_scale: round the per-channel scales down to powers of two (the released code).
    fp4_gradients: quantize dY / dYᵀ to per-row E2M1 instead of E5M2.
    clip_quantile: q of OCC's clamp to the [1 - q, q] quantiles of X.

  Returns:
    The ``Recipe``.

  Raises:
    ValueError: ``clip_quantile`` outside (0.5, 1] (from ``OperandSpec``).
  """
  x = OperandSpec(fmt=E2M1_CHANNEL, scale_pow2=pow2_scale, clip="occ", clip_quantile=clip_quantile)
  w = OperandSpec(fmt=E2M1_CHANNEL, scale_pow2=pow2_scale, estimator="dge")
  grad = OperandSpec(fmt=E2M1_CHANNEL, scale_pow2=pow2_scale) if fp4_gradients else OperandSpec(fmt=E5M2)
  from_fwd = OperandSpec(fmt=E4M3, source="forward")
  return Recipe("ms_fp4", x, w, grad, from_fwd, grad, from_fwd)


_REGISTRY: dict[str, Callable[[], Recipe]] = {
  "bf16": bf16,
  "fp8": fp8,
  "nvfp4_rtn": nvfp4_rtn,
  "nvidia_nvfp4": nvidia_nvfp4,
  "quartet": quartet,
  "quartet2": quartet2,
  "ms_fp4": ms_fp4,
}


def names() -> tuple[str, ...]:
  """Names of the registered recipes.

  Returns:
    The names ``get`` accepts, in registration order.
  """
  return tuple(_REGISTRY)


def get(name: str | Recipe) -> Recipe:
  """The recipe called ``name`` with its paper's defaults (a ``Recipe`` is returned unchanged).

  Args:
    name: a registered recipe name (``names()``) or a ``Recipe``.

  Returns:
    The ``Recipe``.

  Raises:
    ValueError: ``name`` is not registered.
  """
  if isinstance(name, Recipe):
    return name
  if name not in _REGISTRY:
    raise ValueError(f"unknown recipe {name!r}; expected a Recipe or one of {names()}")
  return _REGISTRY[name]()


def deterministic(recipe: str | Recipe) -> Recipe:
  """The evaluation variant of ``recipe``: stochastic roundings (SR, MS-EDEN) become RTN and fresh random Hadamard
  signs become the run's fixed ones, so it needs no key. Deterministic recipes are returned unchanged.

  Args:
    recipe: a recipe name or ``Recipe``.

  Returns:
    The deterministic ``Recipe`` (named ``"<name>:deterministic"`` when anything changed).

  Raises:
    ValueError: an unknown recipe name.
  """
  recipe = get(recipe)
  if not recipe.is_random:
    return recipe

  def fixed(spec: OperandSpec) -> OperandSpec:
    return dataclasses.replace(spec, rounding="rtn", signs="fixed" if spec.signs == "random" else spec.signs)

  fields = {f"{g}_{side}": fixed(getattr(recipe, f"{g}_{side}")) for g in GEMMS for side in ("lhs", "rhs")}
  return dataclasses.replace(recipe, name=f"{recipe.name}:deterministic", **fields)


def causal(recipe: str | Recipe) -> Recipe:
  """The strictly causal variant of ``recipe``: its forward activation operand X (``fwd_lhs``) takes its amax per
  row (``OperandSpec.amax="row"``: one FP32 tensor scale per token), so a token's forward quantization, and so
  every output at that token, depends on that token's input only.

  With ``amax="tensor"`` (every registered recipe, as Transformer Engine) one token's max|x| sets the NVFP4 tensor
  scale (FP8: the current scale) of all tokens of the batch: in a causal LM, tokens after position p then change
  the logits at positions <= p, and one batch row changes the others. Nothing else in a recipe's forward mixes
  tokens: W holds no tokens, block scales, Hadamard chunks and MS-EDEN corrections lie along the features, random
  bits hash element indices, and Microsoft FP4's OCC quantiles and ``E2M1_CHANNEL`` scales are per token already
  (there "row" changes no bits). The backward GEMMs are left as they are (they compute gradients, not outputs).
  A ``dot_general`` whose rhs holds tokens (e.g. attention's K or V quantized by an einsum layer) is not made
  causal by this: keep such products in high precision (as the experiments' model does; ``fp4jax.flax``'s rules
  select weight layers only). A recipe with an unquantized X is returned unchanged.

  Args:
    recipe: a recipe name or ``Recipe``.

  Returns:
    The causal ``Recipe``.

  Raises:
    ValueError: an unknown recipe name.
  """
  recipe = get(recipe)
  if recipe.fwd_lhs.fmt is None or recipe.fwd_lhs.amax == "row":
    return recipe
  return dataclasses.replace(
    recipe, name=f"{recipe.name}:causal", fwd_lhs=dataclasses.replace(recipe.fwd_lhs, amax="row")
  )
