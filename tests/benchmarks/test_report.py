"""benchmarks/report.py: BENCHMARKS.md is exactly what it generates from the committed JSON, short, and honest about
ranges, processes and stale results."""

import json
import re

import pytest

from benchmarks import report


def test_committed_benchmarks_md_is_what_the_report_generates():
  committed = (report.ROOT / "BENCHMARKS.md").read_text()
  assert committed == report.render(report.load()), "BENCHMARKS.md is stale: run python benchmarks/report.py"


def test_benchmarks_md_is_at_most_500_lines():
  assert len((report.ROOT / "BENCHMARKS.md").read_text().splitlines()) <= report.MAX_LINES == 500


def test_every_committed_result_states_where_it_ran_and_how_to_rerun():
  for doc in report.load():
    where, _, command = report.provenance(doc)
    assert "not recorded" not in where, (doc["benchmark"], where)
    assert re.match(r"Reproduce: `(\w+=\S+ )*python ", command) and "not recorded" not in command  # env, then python


def _trees_doc(**extra):
  row = {"name": "nvfp4_rtn [auto]", "this_rounds": [1.0, 3.0, 2.0], "baseline_rounds": [4.0, 2.0]}
  return {"benchmark": "linear_trees", "commit": "aaa", "baseline_commit": "bbb", "command": "c", "rows": [row]}


def test_linear_trees_reports_the_range_over_rounds_and_a_ratio_across_processes():
  text = "\n".join(report.RENDER["linear_trees"](_trees_doc()))
  # medians 2 and 3; ranges 1–3 and 2–4; ratio 2/3; its extremes 1/4 and 3/2 (hand-computed)
  assert "| nvfp4_rtn [auto] | 2.000 (1.000–3.000) | 3.000 (2.000–4.000) | 0.667 | 0.250–1.500 |" in text
  assert "ACROSS PROCESSES" in text


def test_cpu_quantizers_reports_medians_their_ranges_and_whether_the_outputs_agree():
  row = {"name": "quartet2 fwd_lhs", "this_ms": 2.0, "baseline_ms": 8.0, "ratio": 0.25, "this_rounds": [1.0, 3.0],
         "baseline_rounds": [6.0, 10.0], "same_output": False}  # fmt: skip
  doc = {"benchmark": "cpu_quantizers", "commit": "aaa", "baseline_commit": "bbb", "command": "c", "rows": [row],
         "settings": {"rows": 4, "cols": 8, "repeats": 3, "rounds": 2}}  # fmt: skip
  text = "\n".join(report.RENDER["cpu_quantizers"](doc))
  assert "| quartet2 fwd_lhs | 2.0 (1.0–3.0) | 8.0 (6.0–10.0) | 0.250 | NO |" in text
  assert "4x8 bfloat16" in text and "ACROSS PROCESSES" in text


def test_train_throughput_reports_tokens_per_second_of_each_round():
  row = {
    "model": "experiments",
    "recipe": "bf16",
    "devices": 1,
    "global_batch": 4,
    "seq_len": 25,
    "tokens_per_s": 133.3,
    "step_time_median_s": 0.75,
    "step_time_rounds_s": [0.5, 1.0],
    "mfu": 0.1,
    "ratio_to_anchor": None,
    "scaling_efficiency": 1.0,
    "compile_s": 3.0,
  }
  settings = {"model": "1M", "per_device_batch": 4, "seq_len": 25, "anchor_attention": "xla"}
  settings |= {"warmup": 1, "steps": 2, "rounds": 2}
  doc = {"benchmark": "train_throughput", "matmul_tflops": 1.0, "settings": settings, "rows": [row]}
  lines = report.RENDER["train_throughput"](doc)
  assert "| experiments | bf16 | 1 | 133 | 100–200 | 750.0 |" in "\n".join(lines)  # 100 tokens in 1.0 s and 0.5 s
  assert "by category" not in "\n".join(lines)  # no profile: no category table
  assert "ModelConfig overrides" not in "\n".join(lines)  # defaults only: nothing to say
  assert "†" not in "\n".join(lines)  # nothing ran beside an abandoned compile
  settings["max_compile_s"] = 60.0
  row["beside_abandoned_compile"] = True
  text = "\n".join(report.RENDER["train_throughput"](doc))
  assert "| experiments | bf16† | 1 | 133 |" in text
  assert "† compiled or timed while a compile given up at `--max-compile-s` (60.0 s) still ran" in text
  row["beside_abandoned_compile"] = False
  settings["experiments_variants"] = {"experiments": {}, "unrolled": {"scan_unroll": 12}}
  text = "\n".join(report.RENDER["train_throughput"](doc))
  assert (
    'Experiments models (ModelConfig overrides): `experiments`: the defaults; `unrolled`: {"scan_unroll": 12}.' in text
  )
  assert "### Training throughput, 1M, 4 x 25 tokens per device, 1 device" in text
  assert "all-reduce their gradients" not in text  # float32 (the default): nothing to say
  settings["grad_comm_dtype"] = "bfloat16"
  doc["rows"] = [row, {**row, "devices": 2, "quantizer_backend": "auto"}]
  text = "\n".join(report.RENDER["train_throughput"](doc))
  assert "### Training throughput, 1M, 4 x 25 tokens per device, 1 and 2 devices" in text
  assert "all-reduce their gradients in bfloat16" in text and "quantizers auto)" in text


def test_throughput_report_takes_ratios_to_bf16_and_the_category_differences():
  def row(recipe, tokens_per_s, categories, busy, kernels, short=None):
    profile = {"/device:GPU:0": {"busy_ms_per_step": busy, "kernels_per_step": kernels}}
    profile["/device:GPU:0"]["ms_per_step_by_category"] = categories
    if short:
      profile["/device:GPU:0"]["short_kernels"] = {"under_us": 5.0, "per_step": short[0], "ms_per_step": short[1]}
    return {
      "model": "experiments",
      "recipe": recipe,
      "devices": 1,
      "global_batch": 1,
      "seq_len": 100,
      "tokens_per_s": tokens_per_s,
      "step_time_median_s": 100 / tokens_per_s,
      "step_time_rounds_s": [100 / tokens_per_s],
      "mfu": 0.5,
      "ratio_to_anchor": None,
      "scaling_efficiency": 1.0,
      "compile_s": 3.0,
      "profile": profile,
    }

  rows = [
    row("bf16", 400.0, {"gemm": 10.0, "fusion": 2.0}, 12.0, 100),
    row("quartet2", 100.0, {"gemm": 11.0, "pallas": 5.0, "fusion": 7.5}, 23.5, 400, short=(2894.4, 4.46)),
  ]
  settings = {"model": "1M", "per_device_batch": 1, "seq_len": 100, "anchor_attention": "xla"}
  settings |= {"warmup": 1, "steps": 2, "rounds": 1}
  doc = {"benchmark": "train_throughput", "matmul_tflops": 1.0, "settings": settings, "rows": rows}
  text = "\n".join(report.RENDER["train_throughput"](doc))
  assert "| experiments | quartet2 | 1 | 100 | one round | 1000.0 | 50.0% |  | 0.25 |" in text  # 100 / 400 tok/s
  # the short kernels (count and ms per step; blank without the count), then a column per step_profile category in
  # its order: gemm, attention, pallas, copy, collective, fusion, other
  header = "| model | recipe | devices | busy ms/step | kernels/step | short | gemm | attention | pallas | copy"
  assert header + " | collective | fusion | other |" in text
  assert "| experiments | bf16 | 1 | 12.0 | 100 |  | 10.0 |" in text
  assert "| experiments | quartet2 | 1 | 23.5 | 400 | 2,894 (4.5) | 11.0 | 0.0 | 5.0 | 0.0 | 0.0 | 7.5 | 0.0 |" in text
  assert "| | Δ bf16 | | +11.5 | +300 | | +1.0 | +0.0 | +5.0 | +0.0 | +0.0 | +5.5 | +0.0 |" in text
  assert "Copy kernels by XLA op" not in text  # no profile attributes its copies
  sources = [["copy.3", 26.0, 3.45], ["call.7", 2.0, 0.4], ["copy.1", 1.0, 0.01]]
  rows[1]["profile"]["/device:GPU:0"]["copy_sources"] = sources
  text = "\n".join(report.RENDER["train_throughput"](doc))
  # ops under 0.05 ms per step left out
  assert (
    "- experiments quartet2 on 1: `copy.3` (26 per step, 3.5 ms), `call.7` (2 per step, 0.4 ms)" in text.splitlines()
  )


def test_a_stale_result_is_labelled_with_its_reason():
  lines = report.RENDER["linear_trees"](_trees_doc() | {"stale": "measured before abc"})
  assert lines[0].startswith("### STALE: ") and f"**Stale:** measured before abc {report.STALE_TABLES}" in lines
  assert not report.RENDER["linear_trees"](_trees_doc())[0].startswith("### STALE")


def test_a_stale_section_keeps_its_provenance_and_drops_its_tables():
  fresh = report.section(_trees_doc())
  stale = report.section(_trees_doc() | {"stale": "measured before abc"})
  assert any(line.startswith("|") for line in fresh)
  assert not any(line.startswith("|") for line in stale)
  assert stale[-1].startswith("Reproduce: ")


def test_provenance_falls_back_to_the_header_line():
  doc = {"header": "device: NVIDIA H100 (gpu); jax 0.11.2; date: 2026-11-26 10:33 UTC", "commit": "c0ffee"}
  where = report.provenance(doc)[0]
  assert where == "Device: NVIDIA H100 (gpu); JAX 0.11.2; commit c0ffee; date 2026-11-26 10:33 UTC."


def test_reproduce_gives_a_runnable_command_where_the_runs_own_no_longer_runs():
  doc = {"commit": "c0ffee", "command": "python b.py --gone 1"}
  assert report.provenance(doc)[-1] == "Reproduce: `python b.py --gone 1`"
  assert report.provenance(doc | {"reproduce": "python b.py"})[-1] == "Reproduce: `python b.py`"


def test_a_result_file_of_an_unknown_benchmark_is_refused(tmp_path):
  (tmp_path / "x.json").write_text(json.dumps({"benchmark": "mystery"}))
  with pytest.raises(ValueError, match=r"no renderer for \['x.json'\]"):
    report.load(tmp_path)


def test_sections_follow_the_report_order(tmp_path):
  (tmp_path / "a.json").write_text(json.dumps(_trees_doc()))
  (tmp_path / "b.json").write_text(json.dumps({"benchmark": "train_throughput"}))
  assert [d["benchmark"] for d in report.load(tmp_path)] == ["train_throughput", "linear_trees"]


def test_a_note_follows_the_heading_of_its_section():
  doc = _trees_doc() | {"note": "measured where the option had another name"}
  lines = report.RENDER["linear_trees"](doc)
  assert lines[:4] == [
    "### One linear layer fwd+bwd, this commit against bbb",
    "",
    "**Note:** measured where the option had another name",
    "",
  ]
  assert "**Note:**" not in "\n".join(report.RENDER["linear_trees"](_trees_doc()))


def test_compile_profile_reports_each_variants_stages_and_its_largest_passes():
  events = [["ThreadPool", 9000.0, 40], ["backend_compile", 5000.0, 1], ["priority-fusion", 2500.0, 1]]
  events += [[f"pass{i}", 100.0 - i, 1] for i in range(12)] + [["PTX->CUBIN", 50.0, 7], ["tiny", 1.0, 3]]
  variant = {"trace_s": 1.25, "lower_s": 0.5, "compile_s": 12.0, "optimized_hlo_lines": 12345, "custom_calls": 7,
             "host_events": events}  # fmt: skip
  doc = {"benchmark": "compile_profile", "commit": "aaa", "command": "c", "variants": {"scan": variant},
         "settings": {"model": "125M", "recipe": "quartet2", "overrides": {"n_layers": 2}}}  # fmt: skip
  lines = report.RENDER["compile_profile"](doc)
  text = "\n".join(lines)
  assert "### Where the train step's compile time goes, 125M quartet2" in text
  assert "| scan | 1.2 | 0.5 | 12.0 | 12,345 | 7 |" in text and '{"n_layers": 2}' in text
  rows = [line for line in lines if line.startswith("| ") and line.endswith(" |") and line.count("|") == 4]
  # the 6 largest events run once (backend_compile, priority-fusion, pass0..pass3), then the 2 largest run many times
  want = ["| backend_compile | 5.0 | 1 |", "| priority-fusion | 2.5 | 1 |"]
  want += [f"| pass{i} | 0.1 | 1 |" for i in range(4)] + ["| ThreadPool | 9.0 | 40 |", "| PTX->CUBIN | 0.1 | 7 |"]
  assert rows[1:] == want, rows


def test_prepass_sweep_reports_the_default_and_the_fastest_launch_with_the_same_bits():
  row = {"shape": [16384, 2048], "along": "rows", "tile": [16, 256], "warps": 4, "copy_ms": 0.05}
  doc = {
    "benchmark": "prepass_sweep",
    "command": "python benchmarks/kernels_quantize_profile.py --prepass-sweep",
    "rows": [
      row | {"ms": 0.1, "gb_s": 1342.2, "vs_default": 1.0, "same_bits": True},
      row | {"tile": [32, 128], "warps": 8, "ms": 0.04, "gb_s": 3355.4, "vs_default": 0.4, "same_bits": False},
      row | {"tile": [32, 256], "warps": 8, "ms": 0.08, "gb_s": 1677.7, "vs_default": 0.8, "same_bits": True},
      row | {"tile": [128, 24], "error": "ValueError: bad tile"},
      row | {"along": "rows_of_transpose", "error": "ValueError: bad tile"},
    ],
  }
  text = "\n".join(report.RENDER["prepass_sweep"](doc))
  # the faster launch with other bits (0.04 ms) is not the one reported
  assert "| 16384x2048 | rows | 16x256, 4, 0.100, 1,342 | 32x256, 8, 0.080, 1,678 | 0.80 | 3 / 1 / 1 | 0.050 |" in text
  assert "| 16384x2048 | rows_of_transpose | no launch ran | | | 0 / 1 / 0 | |" in text


def test_hlo_census_reports_one_row_per_recipe_and_variant():
  row = {"variant": "unrolled", "recipe": "quartet2", "inlined_ops": 35333, "threefry_calls": 925}
  row |= {"threefry_share": 0.126, "threefry_by_caller": {"f": 925}, "xla_quantizers": 0, "triton_calls": 23}
  settings = {"model": "125M", "batch": 16, "seq_len": 1024, "variants": {"unrolled": {"scan_unroll": 12}}}
  doc = {"benchmark": "hlo_census", "commit": "aaa", "command": "python benchmarks/hlo_census.py", "rows": [row]}
  doc["settings"] = settings
  text = "\n".join(report.RENDER["hlo_census"](doc))
  assert "### How large the train step is lowered for a GPU, 125M" in text and "at 16 x 1024 tokens" in text
  assert '`unrolled`: {"scan_unroll": 12}' in text
  assert "| unrolled | quartet2 | 35,333 | 925 | 13% | 0 | 23 |" in text
