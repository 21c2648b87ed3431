"""FP4 training recipes as data: how each operand of each of a linear layer's three GEMMs is quantized.

A linear layer ``Y = X·Wᵀ`` (X: tokens x features, W: outputs x features) runs three GEMMs, each quantizing both of its
operands along its own contraction axis:

    fwd    Y  = X  · Wᵀ     operands X (along features)  and W  (along features)
    dgrad  dX = dY · W      operands dY (along outputs)  and Wᵀ (along outputs)
    wgrad  dW = dYᵀ · X     operands dYᵀ (along tokens)  and Xᵀ (along tokens)

A ``Recipe`` holds one ``OperandSpec`` per operand. ``compose`` builds one from parts (per GEMM and per operand,
over an optional base recipe), and ``Recipe.table()`` prints it, one row per operand. Recipes are frozen
dataclasses, so ``dataclasses.replace`` works too (e.g. ``replace(recipes.get("nvidia_nvfp4"), wgrad_lhs=...)``).
``get(name)`` / ``names()`` is the registry (``register`` adds a recipe of one's own); one constructor per paper
below, whose docstring cites the paper and states every choice, each built by ``compose``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Literal, get_args

from fp4jax._src.formats import (
  E2M1_CHANNEL,
  E4M3,
  E5M2,
  FP8_BLOCK,
  MXFP4,
  MXFP8,
  NVFP4,
  BlockFormat,
  E2M1ChannelFormat,
  FP4Format,
  FP8Format,
)
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
OPERAND_NAMES = {
  "fwd_lhs": "X",
  "fwd_rhs": "W",
  "dgrad_lhs": "dY",
  "dgrad_rhs": "Wᵀ",
  "wgrad_lhs": "dYᵀ",
  "wgrad_rhs": "Xᵀ",
}  # each operand's tensor, for messages and tables


def _describe(spec: OperandSpec) -> tuple[str, ...]:
  """``Recipe.table``'s cells of one operand: format, block, rounding, hadamard, estimator, source, other."""
  fmt = spec.fmt
  if fmt is None:  # the input, or the forward-quantized tensor reused as it is
    name, block = "as forward" if spec.source == "forward" else "-", "-"
  elif isinstance(fmt, BlockFormat):
    options = [
      str(v) for f in dataclasses.fields(fmt) if f.name != "block_size" and (v := getattr(fmt, f.name)) != f.default
    ]
    name = fmt.name + (f" ({', '.join(options)})" if options else "")
    block = "x".join(map(str, spec.block_shape or (1, fmt.block_size)))
  else:
    name, block = fmt.name, "tensor" if isinstance(fmt, FP8Format) else "row"
  hadamard = f"{spec.hadamard}/{spec.signs}" if spec.hadamard else "-"
  other = [f"amax={spec.amax}"] if spec.amax != "tensor" else []
  other += ["pow2 scale"] if spec.scale_pow2 else []
  other += [f"{spec.clip} q={spec.clip_quantile}"] if spec.clip != "none" else []
  estimator = spec.estimator + (f"(k={spec.dge_k}, cap={spec.dge_cap})" if spec.estimator == "dge" else "")
  rounding = spec.rounding if fmt is not None else "-"
  return name, block, rounding, hadamard, estimator, spec.source, ", ".join(other) or "-"


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
  if isinstance(spec.fmt, BlockFormat):
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

  def table(self) -> str:
    """The recipe as a text table, one row per operand (``OPERAND_NAMES``): GEMM, operand, format (``-``: input
    precision), block (``1x16``, ``16x16``, ``tensor``: one FP8 scale, ``row``: one scale per row), rounding,
    Hadamard (``size/signs``), estimator, source and other options (``amax=row``, ``pow2 scale``, ``occ q=...``).

    Returns:
      The table (a header line, a rule and six rows), preceded by the recipe's name.
    """
    header = ("GEMM", "operand", "format", "block", "rounding", "hadamard", "estimator", "source", "other")
    rows = [header] + [
      (gemm, OPERAND_NAMES[f"{gemm}_{side}"], *_describe(spec))
      for gemm in GEMMS
      for side, spec in zip(("lhs", "rhs"), self.operands(gemm))
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join([f"recipe {self.name!r}", lines[0], "-" * len(lines[0]), *lines[1:]])

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
          rows, cols = spec.block_shape
          rules.append(ShapeRule(gemm, _OTHER_DIM[f"{gemm}_{side}"], rows, f"{rows}x{cols} tiles across it"))
    return tuple(rules)

  @property
  def is_random(self) -> bool:
    """True when some operand uses stochastic rounding, MS-EDEN or fresh random Hadamard signs (needs a key)."""
    return any(s.is_random for s in self.specs)

  @property
  def is_identity(self) -> bool:
    """True when nothing is quantized or rotated: the recipe is exactly ``lax.dot_general``."""
    return all(s.is_identity for s in self.specs)


# ------------------------------------------------------------------------------------------------ composing
Part = OperandSpec | tuple[OperandSpec, OperandSpec]
OPERANDS = tuple(OPERAND_NAMES)  # the six field names: fwd_lhs, fwd_rhs, dgrad_lhs, dgrad_rhs, wgrad_lhs, wgrad_rhs


def _operand(spec, where: str) -> OperandSpec:
  """``spec`` as an ``OperandSpec`` (a plain ``QuantizeSpec`` gets the default role fields); TypeError naming
  ``where`` otherwise."""
  if isinstance(spec, OperandSpec):
    return spec
  if isinstance(spec, QuantizeSpec):
    return OperandSpec(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(QuantizeSpec)})
  raise TypeError(f"{where} must be an fp4jax.recipes.OperandSpec (or a QuantizeSpec), got {spec!r}")


def _gemm_part(part, gemm: str, where: str) -> tuple[OperandSpec, OperandSpec]:
  """A GEMM argument of ``compose`` as its ``(lhs, rhs)`` specs."""
  if isinstance(part, (str, Recipe)):
    return get(part).operands(gemm)
  if isinstance(part, tuple):
    if len(part) != 2:
      raise TypeError(f"{where}={gemm}: a tuple must be an (lhs, rhs) pair of OperandSpecs, got {len(part)} items")
    return _operand(part[0], f"{where}={gemm}[0] ({gemm}_lhs)"), _operand(part[1], f"{where}={gemm}[1] ({gemm}_rhs)")
  spec = _operand(part, f"{where}={gemm} (an OperandSpec for both operands, an (lhs, rhs) pair or a recipe)")
  return spec, spec


def compose(
  name: str,
  *,
  fwd: Part | str | Recipe | None = None,
  dgrad: Part | str | Recipe | None = None,
  wgrad: Part | str | Recipe | None = None,
  base: str | Recipe | None = None,
  **operands: OperandSpec,
) -> Recipe:
  """A recipe built from parts: each GEMM's operands, then single operands, over a base recipe.

  Start from ``base``'s six operand specs (high precision everywhere when None); each GEMM argument given replaces
  both of that GEMM's specs; each operand keyword (``fwd_lhs=``, ..., ``wgrad_rhs=``) then replaces one. The result
  is validated as any ``Recipe`` (e.g. both operands of a GEMM must share the Hadamard size and signs; estimators
  and clipping are forward-only; ``trust_mask`` needs the backward W and X re-quantized from the forward), the
  error naming the recipe and the part. For example, FP8 forward with NVIDIA's NVFP4 backward (W re-quantized from
  the layer's weights)::

    compose("e4m3_fwd_nvfp4_bwd", base="nvidia_nvfp4", fwd=OperandSpec(fmt=E4M3), dgrad_rhs=OperandSpec(fmt=NVFP4))

  and NVIDIA's forward with Quartet II's MS-EDEN backward: ``compose("nv_eden", base="nvidia_nvfp4",
  dgrad="quartet2", wgrad="quartet2")``. ``Recipe.table()`` shows the result; ``register`` makes it a name.

  Args:
    name: the recipe's name (messages, tables, ``register``); a non-empty string.
    fwd, dgrad, wgrad: None (keep the base's), one ``OperandSpec`` for both operands, an ``(lhs, rhs)`` pair of
      them, or a recipe (name or ``Recipe``) whose specs of that GEMM are taken. A ``QuantizeSpec`` is taken as
      the ``OperandSpec`` with the same fields.
    base: a recipe name or ``Recipe`` the unnamed parts come from; None: ``bf16`` (nothing quantized).
    **operands: single operands by field name (``OPERANDS``), applied after the GEMM arguments.

  Returns:
    The ``Recipe``.

  Raises:
    TypeError: a part that is not a spec, pair or recipe, or an unknown operand keyword (naming it).
    ValueError: an empty ``name``, an unknown base or part recipe name, or an invalid combination (``Recipe``'s
      checks, naming the recipe and the operand or GEMM).
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f"compose: name must be a non-empty string, got {name!r}")
  unknown = sorted(set(operands) - set(OPERANDS))
  if unknown:
    raise TypeError(f"compose({name!r}): unknown operand keyword(s) {unknown}; expected some of {OPERANDS}")
  specs = {op: getattr(get(base), op) for op in OPERANDS} if base is not None else {}
  for gemm, part in (("fwd", fwd), ("dgrad", dgrad), ("wgrad", wgrad)):
    if part is not None:
      specs[f"{gemm}_lhs"], specs[f"{gemm}_rhs"] = _gemm_part(part, gemm, f"compose({name!r})")
  specs.update({op: _operand(spec, f"compose({name!r}): {op}") for op, spec in operands.items()})
  return Recipe(name, **specs)


# ------------------------------------------------------------------------------------------------ the recipes
def bf16() -> Recipe:
  """No quantization: every GEMM is ``lax.dot_general`` on the inputs as given (the reference).

  Returns:
    The ``Recipe`` named "bf16", all of whose operands are None (high precision).
  """
  return compose("bf16")


def fp8() -> Recipe:
  """The common FP8 baseline (Transformer Engine per-tensor current scaling; Micikevicius et al., arXiv 2209.05433).

  Forward X and W: E4M3, per-tensor scale 448/amax, RTN. dgrad: dY in E5M2 (scale 57344/amax, RTN), W the forward
  E4M3 tensor reused (a per-tensor scale does not depend on the axis). wgrad: dYᵀ in E5M2, Xᵀ the forward E4M3
  tensor. Straight-through everywhere.

  Returns:
    The ``Recipe``.
  """
  e4m3, e5m2 = OperandSpec(fmt=E4M3), OperandSpec(fmt=E5M2)
  return compose("fp8", fwd=e4m3, dgrad=(e5m2, REUSE_FORWARD), wgrad=(e5m2, REUSE_FORWARD))


def mxfp8() -> Recipe:
  """MXFP8 training as NVIDIA publishes it (Mishra et al., "Recipes for Pre-training LLMs with MXFP8", arXiv
  2506.08027; Transformer Engine's ``MXFP8BlockScaling``), on the OCP MX v1.0 format.

  All six GEMM operands MXFP8 with E4M3 elements (gradients too: the paper's choice over E5M2), one E8M0 scale per
  32 consecutive elements along each GEMM's contraction axis, the scale exponent rounded up (``scale_mode="rceil"``:
  the smallest 2^e with 448·2^e >= amax_b, the paper's fix for the divergence it reports under the OCP rule), RTN
  elements. MX blocks are 1D, so each GEMM quantizes its own operands from the high-precision tensors along its
  contraction axis (W along inputs for the forward and along outputs for dgrad; X and dY along tokens for wgrad),
  as TE does. Straight-through everywhere. Shape rules: inputs (fwd), outputs (dgrad) and tokens (wgrad) hold
  whole 32-element blocks (padded with zeros on one device).

  Returns:
    The ``Recipe``.
  """
  q = OperandSpec(fmt=dataclasses.replace(MXFP8, scale_mode="rceil"))
  return compose("mxfp8", fwd=q, dgrad=q, wgrad=q)


def fp8_block() -> Recipe:
  """FP8 block scaling as in DeepSeek-V3 (arXiv 2412.19437 §3.3; Transformer Engine's ``Float8BlockScaling``).

  E4M3 everywhere with fp32 scales amax/448 (``FP8_BLOCK``, RTN): activations and gradients in 1x128 tiles along
  each GEMM's contraction axis (per token per 128 channels for X in the forward; dY per token per 128 outputs for
  dgrad; dYᵀ and Xᵀ per 128 tokens for wgrad, the paper's 1x128 -> 128x1 change of tile in the backward), weights
  in 128x128 blocks. dgrad: Wᵀ the forward's 128x128-block tensor reused (a 128x128 block grid is the same for W
  and Wᵀ). wgrad: Xᵀ re-quantized from the forward FP8 activations (the paper caches X in FP8 for the backward).
  Straight-through everywhere. Shape rules: inputs (fwd), outputs (dgrad) and tokens (wgrad) hold whole 128-element
  tiles, and outputs hold whole 128-row weight blocks (padded with zeros on one device).

  Returns:
    The ``Recipe``.
  """
  tile = OperandSpec(fmt=FP8_BLOCK)
  w = OperandSpec(fmt=FP8_BLOCK, block_shape=(FP8_BLOCK.block_size,) * 2)
  x_t = OperandSpec(fmt=FP8_BLOCK, source="forward")
  return compose("fp8_block", fwd=(tile, w), dgrad=(tile, REUSE_FORWARD), wgrad=(tile, x_t))


def nvfp4_rtn() -> Recipe:
  """Naive NVFP4 everywhere: all six operands NVFP4 1x16 (TE scales), RTN, no Hadamard, straight-through.

  The floor every real recipe must beat: its backward is deterministic and biased.

  Returns:
    The ``Recipe``.
  """
  q = OperandSpec(fmt=NVFP4)
  return compose("nvfp4_rtn", fwd=q, dgrad=q, wgrad=q)


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
  return compose("nvidia_nvfp4", fwd=(x_fwd, w_fwd), dgrad=(dy, REUSE_FORWARD), wgrad=(dy_t, x_t))


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
  return compose("quartet", fwd=fwd, dgrad=(bwd, from_fwd), wgrad=(bwd, from_fwd))


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
  name = "quartet2" if four_over_six else "quartet2_no46"
  return compose(name, fwd=fwd, dgrad=(bwd, from_fwd), wgrad=(bwd, from_fwd))


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
  return compose("ms_fp4", fwd=(x, w), dgrad=(grad, from_fwd), wgrad=(grad, from_fwd))


_REGISTRY: dict[str, Callable[[], Recipe]] = {
  "bf16": bf16,
  "fp8": fp8,
  "mxfp8": mxfp8,
  "fp8_block": fp8_block,
  "nvfp4_rtn": nvfp4_rtn,
  "nvidia_nvfp4": nvidia_nvfp4,
  "quartet": quartet,
  "quartet2": quartet2,
  "ms_fp4": ms_fp4,
}
PUBLISHED = tuple(_REGISTRY)  # the published recipes above; ``register`` adds after them


def names() -> tuple[str, ...]:
  """Names of the registered recipes: the published ones (``PUBLISHED``), then any ``register``-ed.

  Returns:
    The names ``get`` accepts, in registration order.
  """
  return tuple(_REGISTRY)


def register(recipe: Recipe, *, replace: bool = False) -> Recipe:
  """Registers ``recipe`` under its ``name``, so that every API taking a recipe name (``get``, ``dot_general``,
  the Flax layers, the experiments' ``--recipe``) takes that name in this process.

  Args:
    recipe: a ``Recipe`` (e.g. from ``compose``).
    replace: allow replacing a recipe this function registered under the same name.

  Returns:
    ``recipe``.

  Raises:
    TypeError: ``recipe`` is not a ``Recipe``.
    ValueError: its name is a published recipe's, or already registered and ``replace`` is False.
  """
  if not isinstance(recipe, Recipe):
    raise TypeError(f"register: recipe must be an fp4jax.recipes.Recipe (e.g. from compose), got {recipe!r}")
  if recipe.name in PUBLISHED:
    raise ValueError(f"register: {recipe.name!r} is a published recipe; give the recipe another name")
  if recipe.name in _REGISTRY and not replace:
    raise ValueError(f"register: a recipe named {recipe.name!r} is already registered; pass replace=True")
  _REGISTRY[recipe.name] = lambda: recipe
  return recipe


def unregister(name: str) -> None:
  """Removes a recipe ``register`` added.

  Args:
    name: its name.

  Returns:
    None.

  Raises:
    ValueError: ``name`` is a published recipe or not registered.
  """
  if name in PUBLISHED or name not in _REGISTRY:
    raise ValueError(
      f"unregister: {name!r} is not a registered recipe of one's own; those are {names()[len(PUBLISHED) :]}"
    )
  del _REGISTRY[name]


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
