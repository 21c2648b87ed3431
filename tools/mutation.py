"""Mutation testing of fp4jax's core numerics: one command, reproducible, resumable, bounded.

    python tools/mutation.py run  [--modules bits ieee ...] [--limit N] [--jobs 1]
    python tools/mutation.py report                        # score per module and the surviving mutants
    python tools/mutation.py show MUTANT_ID                # the diff of one mutant
    python tools/mutation.py run --modules ieee --rerun-survivors   # after adding tests: the survivors again
    python tools/mutation.py run --modules dot --ids dot:_axis:16.0 --rerun-survivors   # those mutants only

Why a small tool rather than mutmut 3: mutmut 3 runs every mutant in a process forked from one that already ran the
tests, and JAX caches traced and compiled functions per Python function; a mutant inside a ``jax.jit`` function
whose unmutated trace is cached never runs, so it would "survive" falsely. Here every mutant runs in a fresh
interpreter, in a temporary copy of the repository whose one module is rewritten (JAX's persistent compilation
cache, keyed by the HLO, is shared between runs: programs the mutant does not change are not recompiled).

Mutants (enumerated deterministically from the AST, in source order): arithmetic / bitwise operator swaps
(``+ -``, ``* /``, ``// /``, ``>> <<``, ``& |``, ``^ |``, ``** *``), comparison swaps (``< <=``, ``> >=``, ``== !=``),
``and``/``or`` swaps, removal of unary ``-`` / ``~`` / ``not``, number constants (``n -> n + 1``, ``0.5 -> 1.5``,
``x -> 2x`` for floats), ``True``/``False`` swaps. Not mutated: docstrings and other strings, f-strings, statements
that ``raise`` (error messages), type annotations. Each mutant runs its module's targeted tests (``TARGETS``) with
``-x``; a failing, crashing or timed-out run kills it. Results go to ``tools/mutation_results.json`` (one entry per
mutant id ``module:scope:index.k``, see ``enumerate_mutants``), so an interrupted run resumes where it stopped and
a module's edit reruns only the mutants of the definitions it changed.

Equivalent mutants (behaviour provably identical to the original for every input the mutated function accepts) are
listed in ``EQUIVALENT`` with the reason and the digest of the top-level definition (scope) they were proved for:
``report`` counts them apart and leaves them out of the score's denominator only while that scope is unchanged (an
edit of the function reports the entry stale until re-checked).
``run --rerun-survivors`` skips them.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import copy
import difflib
import hashlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "tools" / "mutation_results.json"
SOURCES = Path("fp4jax") / "_src"  # the mutated modules, relative to the repository (or a workspace copy)
CACHE = Path(tempfile.gettempdir()) / "fp4jax_mutation_jax_cache"

# module -> pytest arguments of the fast, targeted tests that must kill its mutants (smallest modules first)
_Q, _N, _D = "tests/test_quantize.py", "tests/test_oracles_numerics.py", "tests/test_oracles_dot.py"
TARGETS = {
  "eden": [
    f"{_N}::test_ms_eden_correction_by_hand_including_zero_denominators",
    f"{_N}::test_ms_eden_correction_of_zero_blocks_divides_no_zero",
    f"{_N}::test_ms_eden_scales_and_values_equal_the_oracle",
    f"{_Q}::test_ms_eden_blocks_whose_scale_underflows_dequantize_to_zero_not_nan",
  ],
  "bits": [
    "tests/test_bits.py",
    "tests/test_oracles_bits.py",
    "tests/kernels/test_quantize.py::test_kernel_lowers_to_triton[nvfp4_cols_rht16_sr]",
  ],
  "scaling": [
    _N,
    f"{_Q}::test_mxfp4_matches_reference",
    f"{_Q}::test_nvfp4_zero_outlier_and_underflow",
    f"{_Q}::test_mxfp4_floor_headroom_never_clips_and_decodes_with_4_3",
    _D,
  ],
  "rounding": ["tests/test_rounding.py", _N, "-k", "sr or rtn or e2m1 or e4m3 or bf16 or nvfp4"],
  "ieee": ["tests/test_ieee.py", "tests/test_four_over_six_te.py::test_add_rn_matches_ieee"],
  "formats": [
    "tests/test_formats.py",
    "tests/test_fp8_blocks.py",  # MXFP8Format, FP8BlockFormat, BlockFP8Format against tests/oracles.py
    "tests/test_four_over_six_metrics.py::test_bad_metric_names_the_field",
    "tests/test_four_over_six_metrics.py::test_repr_shows_a_metric_other_than_the_default",
    "tests/test_four_over_six_te.py::test_field_validation",
    "tests/test_four_over_six_te.py::test_repr_shows_reference_only_when_set",
    "tests/test_rounding.py",
    _N,
    f"{_Q}::test_mxfp4_matches_reference",
    "tests/test_bottom_of_range.py::test_mxfp4_bottom_of_the_range_matches_ocp_reference[floor_headroom-rtn]",
  ],
  "hadamard": ["tests/test_hadamard.py", _D],
  "estimators": ["tests/test_estimators.py", _D],
  "dot": [
    _D,
    "tests/test_dot.py",
    "tests/kernels/test_dot_pallas.py",  # the fused-pair routes (Pallas in interpret mode) against the XLA bits
    "tests/test_shape_rules.py::test_ragged_hadamard_chunks_cancel_in_every_gemm",
    "tests/test_shape_rules.py::test_ragged_rht_gemms_match_numpy_nvfp4_oracle",
    "tests/test_shape_rules.py::test_sharded_shape_rules_fail_when_the_forward_is_traced[dot_general-nvfp4_rtn-rule0]",
    "tests/test_shape_rules.py::test_sharded_shape_rules_fail_when_the_forward_is_traced[dot_general-nvfp4_rtn-rule2]",
    "tests/test_shape_rules.py::test_empty_operands_fail_in_the_forward_naming_the_argument[nvfp4_rtn]",
    "tests/test_shape_rules.py::test_single_element_operands_are_not_empty",
  ],
}


# mutant id -> (digest of the scope it was proved for, why it cannot change any result); "no test builds that input"
# is no reason
EQUIVALENT = {
  # ieee.py
  "ieee:add_rn:177.0": (
    "10eb14992786de46",
    "add_rn: swap on mb >= ma instead of mb > ma (equal exponents) changes only operands of equal magnitude: with "
    "equal signs the sum is symmetric, with opposite signs p = (m1 << 6) - (m2 << 6) = 0 with shift 0 (no sticky), "
    "so zero holds and the sign is sa & sb whichever operand is first",
  ),
  "ieee:add_rn:319.0": (
    "10eb14992786de46",
    "add_rn: shift clipped at 32 instead of 31 changes only l1 - l2 >= 32, where small = m2 << 6 < 2^30: with 31 the "
    "mask is 2^31 - 1 and small >> 31 = 0; with 32, XLA's uint32 shifts by >= 32 give 0, so the mask is 0 - 1 = "
    "2^32 - 1 and small >> 32 = 0: the same sticky (small != 0) and aligned (0)",
  ),
  "ieee:significand:51.0": (
    "dfdf99ae485fda5a",
    "significand: shift clip 23 -> 24 only reaches x = 0 (clz(0) = 32); m << 24 is still 0 and the lsb "
    "of a zero is unspecified and unused (round_pack returns 0 for p = 0, div_rn masks ma = 0)",
  ),
  "ieee:_special:102.0": (
    "315900bb3f51a56d",
    "_special: a subnormal becomes +-(1 + 2^-23) instead of +-1; it only meets 0, Inf or NaN (else "
    "the exact path is selected), and 0, Inf, NaN times or over either give the same value and sign",
  ),
  "ieee:round_pack:304.0": (
    "ed893dcdef5fc4c4",
    "round_pack: -sh <= 23 for every p >= 1 (t >= h + lsb - 23, h >= 0), so clip(-sh, 0, 32) equals "
    "clip(-sh, 0, 31); p = 0 returns 0",
  ),
  "ieee:round_pack:247.0": (
    "ed893dcdef5fc4c4",
    "round_pack: shc = clip(sh, 1, 32) differs only for sh >= 32, where the result is 0 by the sh > 31 branch",
  ),
  "ieee:div_rn:39.0": (
    "cb5728f351fedfa8",
    "div_rn: 2R = mb is impossible: it means (2Q + 1)·mb = ma·2^(s+1), so 2^(s+1) >= 2^24 divides "
    "0 < mb < 2^24 (a quotient of 24-bit significands is never a tie), so > equals >=",
  ),
  "ieee:div_rn:185.0": (
    "cb5728f351fedfa8",
    "div_rn sticky 3R != ...: guard (2R >= mb) gives 3R > mb (always !=, as 2R != mb); no guard "
    "compares with 0, and 3R = 0 iff 2R = 0",
  ),
  "ieee:div_rn:215.0": (
    "cb5728f351fedfa8",
    "div_rn: mb is 0 or >= 2^23 (significand normalizes), so mb > 1 iff mb > 0",
  ),
  "ieee:div_rn:299.0": (
    "cb5728f351fedfa8",
    "div_rn: ma is 0 or >= 2^23 (significand normalizes), so ma > 1 iff ma > 0",
  ),
  "ieee:floor_significand_quotient:45.0": (
    "ec8ff4a06406f7d9",
    "floor_significand_quotient: a guess within 2 of Q (the contract) leaves r >= 0 after two "
    "decrement steps, so a third never fires",
  ),
  "ieee:floor_significand_quotient:52.0": (
    "ec8ff4a06406f7d9",
    "floor_significand_quotient: a guess within 2 of Q leaves r < mb after two increment steps, so a third never fires",
  ),
  "ieee:floor_significand_quotient:47.0": (
    "ec8ff4a06406f7d9",
    "floor_significand_quotient: r <= 0 instead of r < 0 moves R = 0 to (Q-1, mb), which an increment "
    "step (at most one of the two used: the guess was >= Q) moves back; checked for guesses Q-2..Q+2",
  ),
  "ieee:floor_significand_quotient:90.0": (
    "ec8ff4a06406f7d9",
    "floor_significand_quotient: r < 1 is r <= 0 on int32 (same as ieee:679.0)",
  ),
  # eden.py
  "eden:correction:91.0": (
    "f04e693750fcbca8",
    "correction: the inner where's fallback (1.0 -> 2.0) is divided into only where den > 0 is false, where the "
    "outer where returns 1.0 whatever the quotient; num / 2 is NaN-free exactly when num / 1 is (num finite or not)",
  ),
  # scaling.py
  "scaling:<module>:64.0": (
    "2d04275e4eaa3e95",
    "_SQRT2_SIGNIFICAND: bits(f32(sqrt 2)) & 0x7FFFFF = 0x3504F3 is odd, so OR-ing 0x800001 instead of 0x800000 "
    "sets a bit already set: the constant is 0xB504F3 either way",
  ),
  # formats.py
  "formats:Format:30.0": (
    "14f39e8c1ba26197",
    "Format: dataclass(repr=True) never replaces a __repr__ defined in the class body (dataclasses: 'If the class "
    "already defines __repr__(), this parameter is ignored'), and Format defines one: same class either way",
  ),
  "formats:MXFP8Format:157.0": (
    "edfacda01c31ef90",
    "MXFP8Format.exponents: the zero test bits == 1 instead of bits == 0 changes only amax_b = 0 and 2^-149, and "
    "both get -127 either way: floor_log2(0) = -150 and floor_log2(2^-149) = -149, and rceil adds 0 (significand "
    "m = 0 and 2^23, not above 1.75 * 2^23), so clip(e - 8, -127, 127) = -127, the all-zero block's exponent",
  ),
  # rounding.py
  "rounding:<module>:38.0": (
    "90145b1bc967d6ce",
    "sr_e2m1 (_ONE's only use): b < bits(1.0) + 1 sends only b = bits(1.0) (|x| = 1) to the below-1 path, which "
    "gives code 2 too: upper_half, and u·0.5 <= (2^24 - 1)·2^-25 < 1 - 0.5 is always up (1 + 1); the >= 1 path "
    "gives (2^23 + 2^22 - 1 - u) >> 22 = 2 for every 22-bit u",
  ),
  "rounding:sr_e2m1:133.0": (
    "827903aa7655330c",
    "sr_e2m1: b <= bits(1.0) instead of b < bits(1.0) moves only |x| = 1 to the below-1 path: code 2 on both "
    "paths (as rounding:<module>:38.0)",
  ),
  "rounding:sr_e2m1:29.0": (
    "827903aa7655330c",
    "sr_e2m1: b > bits(0.5) instead of b >= bits(0.5) changes only |x| = 0.5: the upper half gives 1 + (u·0.5 < 0), "
    "never up, code 1; the lower half gives 0 + (u·0.5 < 0.5), always up (u·0.5 < 0.5), code 1",
  ),
  # hadamard.py
  "hadamard:hadamard_matrix:44.0": (
    "ac0ed0922903831c",
    "hadamard_matrix: the Sylvester matrix is square, h.shape[1] == h.shape[0]",
  ),
  # The signs are the ±1 vector hadamard/inverse_hadamard document (random_signs, TE_SIGNS_16 or a recipe's
  # sign_vector; _scaled's exactness relies on it): x / s and x · s are both exactly ±x in IEEE arithmetic for
  # s = ±1, every float32 x (zeros, subnormals, Inf, NaN: a sign flip only), and JAX transposes either into ct · s
  "hadamard:_scaled:45.0": (
    "d09e3af49afda801",
    "_scaled (inverse): fwht(scaled) / signs equals fwht(scaled) * signs elementwise for signs = ±1",
  ),
  "hadamard:_scaled:80.0": (
    "d09e3af49afda801",
    "_scaled (forward): scaled / signs equals scaled * signs elementwise for signs = ±1, so fwht gets the same input",
  ),
  "hadamard:_direct:39.0": (
    "1b4e41a64e434a20",
    "_direct (inverse): y / signs equals y * signs elementwise for signs = ±1",
  ),
  "hadamard:_direct:80.0": (
    "1b4e41a64e434a20",
    "_direct (forward): chunks / signs equals chunks * signs elementwise for signs = ±1",
  ),
  "hadamard:_transform_jvp:54.0": (
    "a18d7effd63ee504",
    "_transform_jvp (inverse): plain(t_chunks) / signs equals plain(t_chunks) * signs for the primal signs = ±1 (the "
    "signs' tangent t_signs is any vector: its mutants are killed)",
  ),
  "hadamard:_transform_jvp:82.0": (
    "a18d7effd63ee504",
    "_transform_jvp (forward): t_chunks / signs equals t_chunks * signs for the primal signs = ±1 (the signs' "
    "tangent t_signs is any vector: its mutants are killed)",
  ),
  # dot.py
  "dot:_Canonical:51.0": (
    "463986e62d88979a",
    "_Canonical is never mutated, hashed or compared: frozen=False changes neither value nor use",
  ),
  "dot:_Static:44.0": (
    "cf10d3bb9d666cd4",
    "_Static (custom_vjp nondiff argument) is never mutated; custom_vjp keeps it without hashing it "
    "(require_static_args_hashable=False), so frozen=False changes nothing",
  ),
  # estimators.py
  "estimators:dge_derivative:48.0": (
    "3ac260df354d0af3",
    "dge_derivative: a <= 2 instead of a < 2 picks 2/delta = 4 at a = 2 only, where lo = 2 and "
    "u = 0, so t = |0 - 1| = 1 whatever delta",
  ),
  "estimators:dge_derivative:53.0": (
    "3ac260df354d0af3",
    "dge_derivative: at a = 2 both lo formulas give 2 (floor(4) * 0.5 = 2 + floor(0))",
  ),
  "estimators:dge_derivative:92.0": (
    "3ac260df354d0af3",
    "dge_derivative: a <= 4 picks 2/delta = 2 at a = 4 only, where lo = 4 and u = 0: t = 1",
  ),
  "estimators:dge_derivative:104.0": (
    "3ac260df354d0af3",
    "dge_derivative: at a = 4 both lo formulas give 4 (2 + floor(2) = 4)",
  ),
  "estimators:dge_derivative:63.0": (
    "3ac260df354d0af3",
    "dge_derivative: the placeholder where t = 0 (1.0 or 2.0) is a constant in the branch the "
    "outer where discards: same value, and zero gradient either way",
  ),
  "estimators:select_ranks:40.0": (
    "55bf4c7ed9acd874",
    "select_ranks: start = (keys & 0) - 0 equals (keys & 0) + 0 (both zero)",
  ),
  "estimators:select_ranks:252.0": (
    "55bf4c7ed9acd874",
    "select_ranks: start = first key & 1 offsets the search by 0 or 1; the MSD search then finds "
    "1 + D = the same key (max K with #{key < K} <= rank), except that key 0xFF..F (NaN) wraps "
    "to 0, which decodes to a NaN with the sign bit set: equal values, only a NaN's sign differs "
    "(checked on 2,000 rows of float32/bfloat16/float16 with NaN, +-Inf, +-0, ties)",
  ),
}

_BINOPS = {
  ast.Add: ast.Sub,
  ast.Sub: ast.Add,
  ast.Mult: ast.Div,
  ast.Div: ast.Mult,
  ast.FloorDiv: ast.Div,
  ast.RShift: ast.LShift,
  ast.LShift: ast.RShift,
  ast.BitAnd: ast.BitOr,
  ast.BitOr: ast.BitAnd,
  ast.BitXor: ast.BitOr,
  ast.Pow: ast.Mult,
  ast.Mod: ast.FloorDiv,
}
_CMPOPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}


def _skipped_nodes(tree: ast.AST) -> set[int]:
  """ids of nodes never mutated: docstrings, raise statements, f-strings, annotations."""
  skip = set()

  def mark(node):
    skip.update(id(n) for n in ast.walk(node))

  for node in ast.walk(tree):
    if isinstance(node, (ast.Raise, ast.JoinedStr, ast.Assert)):
      mark(node)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      if node.returns:
        mark(node.returns)
      for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
        if a.annotation:
          mark(a.annotation)
    elif isinstance(node, ast.AnnAssign):
      mark(node.annotation)
    if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body:
      first = node.body[0]
      if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        mark(first)
  return skip


def _mutations(node: ast.AST):
  """(description, apply) pairs for one node; ``apply(node)`` mutates it in place."""

  def setter(attr, value):
    return lambda n: setattr(n, attr, value)

  if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINOPS:
    new = _BINOPS[type(node.op)]
    yield f"{type(node.op).__name__} -> {new.__name__}", setter("op", new())
  elif isinstance(node, ast.Compare):
    for i, op in enumerate(node.ops):
      if type(op) in _CMPOPS:
        new = _CMPOPS[type(op)]

        def apply(n, i=i, new=new):
          n.ops[i] = new()

        yield f"{type(op).__name__} -> {new.__name__}", apply
  elif isinstance(node, ast.BoolOp):
    new = ast.Or if isinstance(node.op, ast.And) else ast.And
    yield f"{type(node.op).__name__} -> {new.__name__}", setter("op", new())
  elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Invert, ast.Not)):
    yield f"drop unary {type(node.op).__name__}", None  # replaced by its operand (see _apply)
  elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
    v = node.value
    if isinstance(v, bool):
      yield f"{v} -> {not v}", setter("value", not v)
    elif isinstance(v, int):
      yield f"{v} -> {v + 1}", setter("value", v + 1)
    else:
      new = 1.5 if v == 0.5 else (1.0 if v == 0.0 else v * 2)
      yield f"{v!r} -> {new!r}", setter("value", new)


class _DropUnary(ast.NodeTransformer):
  def __init__(self, target):
    self.target = target

  def visit_UnaryOp(self, node):
    self.generic_visit(node)
    return node.operand if node is self.target else node


def _scopes(tree: ast.Module) -> list[tuple[str, list[ast.AST]]]:
  """The module's top-level definitions, each a scope named by its name, and its other statements as ``<module>``."""
  scopes, rest = [], []
  for stmt in tree.body:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      scopes.append((stmt.name, [stmt]))
    else:
      rest.append(stmt)
  return [("<module>", rest), *scopes]


class _Normalize(ast.NodeTransformer):
  """Drops docstrings and writes ``fp4jax._src.x`` imports as ``fp4jax.x``: what a scope's digest must not see."""

  def _strip(self, node):
    self.generic_visit(node)
    body = node.body
    if (
      body
      and isinstance(body[0], ast.Expr)
      and isinstance(getattr(body[0], "value", None), ast.Constant)
      and isinstance(body[0].value.value, str)
    ):
      node.body = body[1:] or [ast.Pass()]
    return node

  visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _strip

  def visit_ImportFrom(self, node):
    node.module = (node.module or "").replace("fp4jax._src", "fp4jax")
    return node

  def visit_Import(self, node):
    for alias in node.names:
      alias.name = alias.name.replace("fp4jax._src", "fp4jax")
    return node


def _digest(nodes: list[ast.AST]) -> str:
  # ast.unparse, not ast.dump: the dump gains fields between Python versions (3.12's type_params), the code does not
  normalized = [_Normalize().visit(copy.deepcopy(n)) for n in nodes]
  return hashlib.sha256("\n".join(ast.unparse(n) for n in normalized).encode()).hexdigest()[:16]


def _source(module: str, src: str | None) -> str:
  return src if src is not None else (REPO / SOURCES / f"{module}.py").read_text()


def enumerate_mutants(module: str, src: str | None = None) -> list[dict]:
  """Every mutant of ``fp4jax/_src/<module>.py`` (or of ``src``) as ``{"id", "line", "desc", "source"}``.

  Ids are ``module:scope:index.k``: the ``index``-th node of the top-level definition ``scope`` (``ast.walk``
  order) and its ``k``-th mutation; ``source`` is the digest of that scope's code (docstrings and the ``_src`` in
  import paths left out). A recorded result or an equivalence proof counts only while its digest is the scope's
  current one, so editing one function invalidates the results of that function's mutants only.
  """
  tree = ast.parse(_source(module, src))
  skip = _skipped_nodes(tree)
  out = []
  for scope, nodes in _scopes(tree):
    digest = _digest(nodes)
    walk = [n for top in nodes for n in ast.walk(top)]
    for idx, node in enumerate(walk):
      if id(node) in skip:
        continue
      for k, (desc, _) in enumerate(_mutations(node)):
        out.append(
          {"id": f"{module}:{scope}:{idx}.{k}", "line": getattr(node, "lineno", 0), "desc": desc, "source": digest}
        )
  return out


def _node(tree: ast.Module, mutant_id: str) -> tuple[ast.AST, int]:
  _, scope, rest = mutant_id.split(":")
  idx, k = (int(p) for p in rest.split("."))
  nodes = dict(_scopes(tree))[scope]
  return [n for top in nodes for n in ast.walk(top)][idx], k


def mutated_source(mutant_id: str, src: str | None = None) -> str:
  module = mutant_id.split(":")[0]
  tree = ast.parse(_source(module, src))
  node, k = _node(tree, mutant_id)
  _, apply = list(_mutations(node))[k]
  if apply is None:
    tree = _DropUnary(node).visit(tree)
  else:
    apply(node)
  return ast.unparse(ast.fix_missing_locations(tree))


def _workspace(root: Path) -> Path:
  """A copy of the repository's code and tests under ``root``, where mutants are written and tests run (pytest puts
  the rootdir of ``tests/`` first on ``sys.path``, so the mutated package must live in the tree the tests run from)."""
  ws = root / "repo"
  ignore = shutil.ignore_patterns("__pycache__", "results", "*.json", ".hypothesis")
  for name in ("fp4jax", "kernels", "experiments", "benchmarks", "tests"):  # tests/kernels imports a benchmark
    shutil.copytree(REPO / name, ws / name, ignore=ignore)
  shutil.copy(REPO / "pyproject.toml", ws / "pyproject.toml")
  probe = subprocess.run(
    [sys.executable, "-c", "import fp4jax; print(fp4jax.__file__)"],
    cwd=ws,
    env=_env(ws),
    capture_output=True,
    text=True,
    check=True,
  )
  if not probe.stdout.strip().startswith(str(ws)):
    sys.exit(f"the workspace copy is not the fp4jax the tests import: {probe.stdout.strip()}")
  return ws


def _env(ws: Path) -> dict:
  return {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ws), str(ws / "kernels")]),
    "JAX_PLATFORMS": "cpu",
    "JAX_COMPILATION_CACHE_DIR": str(CACHE),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
  }


def _pytest(tests: list[str], ws: Path, timeout: float) -> tuple[str, float]:
  cmd = [
    sys.executable,
    "-m",
    "pytest",
    "-x",
    "-q",
    "-p",
    "no:randomly",
    "-p",
    "no:cacheprovider",
    "-o",
    "addopts=",
    *tests,
  ]
  t0 = time.time()
  try:
    proc = subprocess.run(cmd, check=False, cwd=ws, env=_env(ws), capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return "timeout", time.time() - t0
  return ("survived" if proc.returncode == 0 else "killed"), time.time() - t0


def _current(results: dict, mutant: dict) -> str | None:
  """The recorded status of ``mutant``, or None when it was never run or was run on another version of its module."""
  r = results.get(mutant["id"], {})
  return r.get("status") if r.get("source") == mutant["source"] else None


def equivalent(mutant: dict) -> str | None:
  """The proof that ``mutant`` is equivalent, or None (not listed, or listed for another source of its module)."""
  digest, reason = EQUIVALENT.get(mutant["id"], (None, None))
  return reason if digest == mutant["source"] else None


def _load() -> dict:
  return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def _save(results: dict) -> None:
  tmp = RESULTS.with_suffix(".tmp")
  tmp.write_text(json.dumps(results, indent=1, sort_keys=True))
  tmp.replace(RESULTS)


def _baseline(module: str, results: dict, ws: Path, lock: threading.Lock) -> float:
  """Seconds the targeted tests of ``module`` take unmutated (timed again when the targets changed)."""
  tests, key = TARGETS[module], f"{module}:baseline"
  if results.get(key, {}).get("tests") != tests:
    status, secs = _pytest(tests, ws, 1800)
    if status != "survived":
      sys.exit(f"{module}: the targeted tests {tests} fail on the unmutated code; fix that first")
    with lock:
      results[key] = {"status": "baseline", "seconds": round(secs, 1), "tests": tests}
      _save(results)
  return results[key]["seconds"]


def run(
  modules: list[str],
  limit: int | None,
  budget_s: float | None,
  rerun_survivors: bool = False,
  jobs: int = 1,
  ids: list[str] | None = None,
) -> None:
  """Runs the mutants of ``modules`` not yet in the results, ``jobs`` at a time (one workspace copy per job); with
  ``ids``, only those of them.

  A mutant's timeout is ``5 x`` its module's baseline plus 120 s, generous because ``jobs`` processes share the
  machine; ``report`` counts timeouts apart from test failures.
  """
  results = _load()
  start = time.time()
  lock = threading.Lock()
  status_of = lambda m: _current(results, m)
  with tempfile.TemporaryDirectory(prefix="fp4jax_mut_") as tmp:
    workspaces = queue.Queue()
    for j in range(jobs):
      workspaces.put(_workspace(Path(tmp) / f"w{j}"))
    todo = []
    for module in modules:
      ws = workspaces.get()
      timeout = 5 * _baseline(module, results, ws, lock) + 120
      workspaces.put(ws)
      todo += [
        (m, timeout)
        for m in enumerate_mutants(module)
        if (ids is None or m["id"] in ids)
        and (status_of(m) is None or (rerun_survivors and status_of(m) == "survived" and equivalent(m) is None))
      ][:limit]

    def one(item):
      m, timeout = item
      if budget_s is not None and time.time() - start > budget_s:
        return
      ws = workspaces.get()
      target = ws / SOURCES / f"{m['id'].split(':')[0]}.py"
      original = target.read_text()
      target.write_text(mutated_source(m["id"]))
      try:
        status, secs = _pytest(TARGETS[m["id"].split(":")[0]], ws, timeout)
      finally:
        target.write_text(original)
        workspaces.put(ws)
      with lock:
        results[m["id"]] = {**m, "status": status, "seconds": round(secs, 1)}
        _save(results)
      print(f"{m['id']:<18} line {m['line']:<4} {m['desc']:<28} {status} ({secs:.0f}s)", flush=True)

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
      list(pool.map(one, todo))
    if budget_s is not None and time.time() - start > budget_s:
      print(f"time budget of {budget_s:.0f}s spent; rerun the same command to resume")


def report(show_survivors: bool = True) -> None:
  """Score per module over the mutants of the modules' current sources (results of older sources are ignored):
  killed / (run - equivalent), with the equivalent survivors listed apart and their proofs in ``EQUIVALENT``."""
  results = _load()
  total = killed = 0
  for module in TARGETS:
    mutants = enumerate_mutants(module)
    rs = [{**m, **results[m["id"]]} for m in mutants if _current(results, m) is not None]
    if not rs:
      continue
    k = sum(r["status"] in ("killed", "timeout") for r in rs)
    t = sum(r["status"] == "timeout" for r in rs)
    eq = [r for r in rs if r["status"] == "survived" and equivalent(r)]
    n = len(rs) - len(eq)
    print(
      f"{module:<11} {k}/{n} killed ({100 * k / max(n, 1):.1f}%; {t} of them by a timeout), {len(eq)} equivalent "
      f"(listed, not counted), {len(rs)}/{len(mutants)} mutants run"
    )
    current = {m["id"]: m["source"] for m in mutants}
    stale = [i for i, (digest, _) in EQUIVALENT.items() if i.split(":")[0] == module and current.get(i) != digest]
    if stale:
      print(
        f"    {len(stale)} EQUIVALENT entries are stale (their scope changed since the proof): {', '.join(stale)}; "
        "their mutants count as survivors until re-checked"
      )
    for r in rs:
      if r["status"] != "survived" and equivalent(r):
        print(f"    LISTED EQUIVALENT BUT {r['status'].upper()}: {r['id']} (the proof in EQUIVALENT is wrong)")
    total, killed = total + n, killed + k
    if show_survivors:
      for r in sorted(eq, key=lambda r: r["line"]):
        print(f"    equivalent {r['id']:<18} line {r['line']:<4} {r['desc']}")
      for r in sorted((r for r in rs if r["status"] == "survived" and not equivalent(r)), key=lambda r: r["line"]):
        print(f"    survived {r['id']:<18} line {r['line']:<4} {r['desc']}")
  if total:
    print(f"total       {killed}/{total} killed ({100 * killed / total:.1f}%; equivalent mutants not counted)")


def show(mutant_id: str) -> None:
  module = mutant_id.split(":")[0]
  a = ast.unparse(ast.parse((REPO / SOURCES / f"{module}.py").read_text())).splitlines()
  b = mutated_source(mutant_id).splitlines()
  print("\n".join(difflib.unified_diff(a, b, f"{SOURCES}/{module}.py", f"mutant {mutant_id}", lineterm="", n=2)))


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = p.add_subparsers(dest="cmd", required=True)
  r = sub.add_parser("run")
  r.add_argument("--modules", nargs="+", default=list(TARGETS), choices=list(TARGETS))
  r.add_argument("--limit", type=int, default=None, help="at most this many new mutants per module")
  r.add_argument("--budget", type=float, default=None, help="stop starting mutants after this many seconds")
  r.add_argument("--rerun-survivors", action="store_true", help="run the surviving mutants again (after new tests)")
  r.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own workspace copy")
  r.add_argument("--ids", nargs="+", default=None, help="run only these mutant ids (of --modules)")
  sub.add_parser("report")
  s = sub.add_parser("show")
  s.add_argument("mutant_id")
  s2 = sub.add_parser("list")
  s2.add_argument("module", choices=list(TARGETS))
  args = p.parse_args()
  if args.cmd == "run":
    run(args.modules, args.limit, args.budget, args.rerun_survivors, args.jobs, args.ids)
  elif args.cmd == "report":
    report()
  elif args.cmd == "show":
    show(args.mutant_id)
  else:
    for m in enumerate_mutants(args.module):
      print(m["id"], m["line"], m["desc"])


if __name__ == "__main__":
  main()
