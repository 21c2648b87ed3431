"""Rules and policies select exactly the intended layers; summary counts FLOPs; bad rules fail loudly."""

import flax.linen as nn
import flax_models as fm
import jax
import pytest
from flax import nnx

from fp4jax._src.flax import rules
from fp4jax.flax import Rule, keep_high_precision, quantize, summary

CFG = fm.Config(n_layers=4)
HP = "high precision"
TOKS = fm.tokens(jax.random.key(0))[:, :-1]


def _linen_recipes(rule_list, **kw):
  return summary(quantize(fm.LinenTransformer(CFG), rule_list, **kw), TOKS, show=False).recipes()


def _nnx_recipes(rule_list, **kw):
  model = quantize(fm.NnxTransformer(CFG, nnx.Rngs(0)), rule_list, rngs=nnx.Rngs(quant=1), **kw)
  return summary(model, TOKS, show=False).recipes()


POLICY = [keep_high_precision(first=1, last=1), Rule(r".*/(qkv|o)", "quartet"), Rule(r".*", "nvidia_nvfp4")]


def _expected(block_name):
  out = {}
  for i in range(CFG.n_layers):
    for layer in ("qkv", "o", "gate_up", "down"):
      kept = i in (0, CFG.n_layers - 1)
      out[f"{block_name(i)}/{layer}"] = HP if kept else ("quartet" if layer in ("qkv", "o") else "nvidia_nvfp4")
  out["lm_head"] = HP  # DEFAULT_HIGH_PRECISION; embeddings and attention products are not linear layers
  return out


def test_linen_rules_and_policy_select_exactly_the_intended_layers():
  assert _linen_recipes(POLICY) == _expected(lambda i: f"block_{i}")


def test_nnx_rules_and_policy_select_exactly_the_intended_layers():
  assert _nnx_recipes(POLICY) == _expected(lambda i: f"blocks/{i}")


def test_first_match_wins_and_defaults_can_be_dropped():
  got = _linen_recipes([Rule(r"block_2/.*", None), Rule(r".*", "nvfp4_rtn")], defaults=())
  assert got["lm_head"] == "nvfp4_rtn"  # no default: the catch-all rule reaches the LM head
  assert all(v == HP for k, v in got.items() if k.startswith("block_2/"))
  assert all(v == "nvfp4_rtn" for k, v in got.items() if not k.startswith("block_2/"))


def test_summary_fp4_share_of_flops_is_exact(capsys):
  model = quantize(fm.LinenTransformer(CFG), POLICY)
  s = summary(model, TOKS)
  t, d, h, v = TOKS.size, CFG.d_model, CFG.hidden, CFG.vocab
  block = 2 * t * (3 * d * d + d * d + d * 2 * h + h * d)
  total, fp4 = CFG.n_layers * block + 2 * t * d * v, (CFG.n_layers - 2) * block
  assert (s.total_flops, s.fp4_flops) == (total, fp4)
  assert s.fp4_share == pytest.approx(fp4 / total, rel=1e-12)
  printed = capsys.readouterr().out
  assert "block_1/qkv" in printed and f"{100 * fp4 / total:.1f}%" in printed


def test_explicit_fp4_layers_show_in_summary_without_rules():
  class Explicit(nn.Module):
    @nn.compact
    def __call__(self, x):
      from fp4jax._src.flax import linen as ql

      return nn.Dense(8, name="plain")(ql.Dense(16, recipe="quartet2", name="fp4")(x))

  s = summary(Explicit(), jax.numpy.ones((4, 32)), show=False)
  assert s.recipes() == {"fp4": "quartet2", "plain": HP}


def test_nvidia_policy_keeps_first_2_and_last_8_of_62_blocks():
  """The 12B model of arXiv 2509.25149: 10 of 62 blocks in BF16, 16% of its linear layers."""
  paths = [f"layers_{i}/{p}" for i in range(62) for p in ("qkv", "o", "fc1", "fc2")]
  plan = rules.plan(paths, [keep_high_precision(first=2, last=8), Rule(".*", "nvidia_nvfp4")])
  kept = sorted({int(p.split("/")[0][7:]) for p, r in plan.items() if r is None})
  assert kept == [0, 1] + list(range(54, 62))
  assert sum(r is None for r in plan.values()) / len(paths) == pytest.approx(10 / 62)


def test_bad_rules_raise_clear_errors():
  with pytest.raises(ValueError, match=r"matches no quantizable layer.*block_0/qkv"):
    _linen_recipes([Rule(r".*/attention/query", "nvidia_nvfp4")])
  with pytest.raises(ValueError, match=r"matches no quantizable layer"):
    quantize(fm.NnxTransformer(CFG, nnx.Rngs(0)), [Rule(r"decoder/.*", "quartet")], rngs=nnx.Rngs(quant=1))
  with pytest.raises(ValueError, match=r"unknown recipe 'nvfp5'; expected one of .*nvidia_nvfp4"):
    Rule(r".*", "nvfp5")
  with pytest.raises(ValueError, match=r"not a valid regular expression"):
    Rule(r"block_(", "quartet")
  with pytest.raises(ValueError, match=r"no layer path matches block_pattern"):
    rules.plan(["mlp/up", "mlp/down"], [keep_high_precision(last=1)])
  with pytest.raises(ValueError, match=r"exceeds the 4 blocks"):
    _linen_recipes([keep_high_precision(first=3, last=2)])
  with pytest.raises(ValueError, match=r"'quartet' draws random bits.*rngs=nnx.Rngs\(quant=...\)"):
    quantize(fm.NnxTransformer(CFG, nnx.Rngs(0)), [Rule(r".*", "quartet")])


@pytest.mark.parametrize(
  "recipes_of",
  # slow tier; default representative: [linen] (the rule order is the plan's, whichever API builds it) and
  # test_nnx_rules_and_policy_select_exactly_the_intended_layers (NNX's plan)
  [_linen_recipes, pytest.param(_nnx_recipes, marks=pytest.mark.slow)],
  ids=["linen", "nnx"],
)
def test_a_rule_naming_the_lm_head_wins_over_the_default(recipes_of):
  got = recipes_of([Rule("lm_head", "nvidia_nvfp4")])
  assert got["lm_head"] == "nvidia_nvfp4"
  assert {k: v for k, v in got.items() if k != "lm_head"} == {k: HP for k in got if k != "lm_head"}
  got = recipes_of([keep_high_precision(last=1), Rule(r".*/(qkv|o)|lm_head", "quartet"), Rule(r".*", "nvfp4_rtn")])
  assert got["lm_head"] == "quartet"  # named among other layers: the rule still wins over the default
  assert recipes_of([Rule(r".*", "nvfp4_rtn")])["lm_head"] == HP  # a catch-all does not name the head


@pytest.mark.parametrize("recipes_of", [_linen_recipes, _nnx_recipes], ids=["linen", "nnx"])
def test_empty_rules_warn_that_nothing_is_quantized(recipes_of):
  with pytest.warns(UserWarning, match=r"quantize no layer"):
    got = recipes_of([])
  assert set(got.values()) == {HP}


def test_a_rule_that_decides_no_layer_raises():
  paths = ["block_0/fc", "block_1/fc", "lm_head"]
  with pytest.raises(ValueError, match=r"rules\[1\] = Rule\(pattern='lm_head'.*decides no layer"):
    rules.plan(paths, [Rule(r".*", "nvfp4_rtn"), Rule("lm_head", "quartet")])
  with pytest.raises(ValueError, match=r"rules\[1\] = KeepHighPrecision\(first=1.*decides no layer"):
    rules.plan(paths, [Rule(r".*", "nvfp4_rtn"), keep_high_precision(first=1)])
  paths = ["block_0/fc", "block_0/proj", "block_1/fc", "lm_head"]  # a layer named before the policy keeps its rule
  named_first = [Rule(r"block_0/fc", "quartet"), keep_high_precision(first=1), Rule(r".*", "nvfp4_rtn")]
  assert rules.plan(paths, named_first) == {
    "block_0/fc": "quartet",
    "block_0/proj": None,
    "block_1/fc": "nvfp4_rtn",
    "lm_head": None,
  }
