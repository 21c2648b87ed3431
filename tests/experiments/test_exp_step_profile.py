import gzip
import json

import pytest

from fp4jax_experiments import step_profile


def _trace(tmp_path, events):
  folder = tmp_path / "plugins" / "profile" / "t"
  folder.mkdir(parents=True)
  path = folder / step_profile.TRACE_NAME
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": events}, f)
  return tmp_path


def test_summary_counts_stream_kernels_once_and_measures_idle_time(tmp_path):
  meta = [
    {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
    {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}},
    {"ph": "M", "pid": 1, "tid": 7, "name": "thread_name", "args": {"name": "Stream #7(Compute)"}},
    {"ph": "M", "pid": 1, "tid": 8, "name": "thread_name", "args": {"name": "Stream #8(MemcpyD2D)"}},
    {"ph": "M", "pid": 1, "tid": 9, "name": "thread_name", "args": {"name": "XLA Ops"}},
  ]
  kernel = lambda tid, ts, dur, name: {"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": name}
  events = meta + [
    kernel(7, 0, 100, "gemm"),
    kernel(7, 300, 100, "gemm"),
    kernel(7, 500, 500, "fusion_1"),
    kernel(7, 1000, 2, "tiny"),  # launch-bound (< 5 µs), three launches
    kernel(7, 1010, 3, "tiny"),
    kernel(7, 1020, 1, "tiny"),
    kernel(8, 50, 100, "copy"),  # overlaps the first gemm: busy counts it once
    kernel(9, 0, 1000, "the whole step again"),  # not a stream: left out of the kernels
    {"ph": "X", "pid": 2, "tid": 1, "ts": 0, "dur": 5000, "name": "python"},  # host: not a device
  ]
  summary = step_profile.summarize(step_profile.find_trace(_trace(tmp_path, events)), steps=2)
  assert list(summary) == ["/device:GPU:0"]
  gpu = summary["/device:GPU:0"]
  assert gpu["span_ms"] == pytest.approx(1.021) and gpu["busy_ms"] == pytest.approx(0.756)
  assert gpu["busy_fraction"] == pytest.approx(0.756 / 1.021) and gpu["busy_ms_per_step"] == pytest.approx(0.378)
  assert gpu["kernels_per_step"] == 3.5
  assert gpu["top"] == [["fusion_1", 0.5, 1], ["gemm", 0.2, 2], ["copy", 0.1, 1], ["tiny", pytest.approx(0.006), 3]]
  # by launches: tiny 3 (1.5 per step, mean 2 µs), gemm 2, then copy and fusion_1 (1 each, by name)
  assert gpu["most_launched"] == [
    ["tiny", 1.5, 2.0],
    ["gemm", 1.0, 100.0],
    ["copy", 0.5, 100.0],
    ["fusion_1", 0.5, 500.0],
  ]
  assert gpu["short_kernels"] == {"under_us": 5.0, "per_step": 1.5, "ms_per_step": pytest.approx(0.003)}
  assert gpu["threads"]["XLA Ops"] == [1.0, 1]
  assert gpu["copy_sources"] == [["the whole step again", 0.5, 0.05]]  # the one XLA-op event holding the copy
  assert gpu["ms_per_step_by_category"] == pytest.approx({"fusion": 0.25, "gemm": 0.1, "copy": 0.05, "other": 0.003})


def test_copy_kernels_are_attributed_to_the_innermost_xla_op(tmp_path):
  meta = [
    {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
    {"ph": "M", "pid": 1, "tid": 7, "name": "thread_name", "args": {"name": "Stream #7(Compute)"}},
    {"ph": "M", "pid": 1, "tid": 9, "name": "thread_name", "args": {"name": "XLA Ops"}},
  ]

  def event(tid, ts, dur, name, **args):
    return {"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": name, "args": args}

  events = meta + [
    event(9, 0, 1000, "while.1"),  # the loop holds every kernel; the ops inside it are shorter
    event(9, 100, 50, "copy.7"),
    event(9, 300, 40, "dynamic-update-slice.3"),
    event(7, 110, 30, "memcpy128"),  # inside copy.7 (and while.1): copy.7
    event(7, 120, 20, "memcpy32_post"),
    event(7, 305, 30, "memcpy128"),  # inside dynamic-update-slice.3
    event(7, 320, 30, "memcpy128"),  # ends after dynamic-update-slice.3: the loop
    event(7, 500, 10, "memcpy128", hlo_op="custom-call.9"),  # the trace names its op
    event(7, 2000, 10, "memset"),  # after every op
    event(7, 600, 90, "gemm"),  # not a copy
  ]
  gpu = step_profile.summarize(step_profile.find_trace(_trace(tmp_path, events)), steps=1)["/device:GPU:0"]
  assert gpu["copy_sources"] == [
    ["copy.7", 2, 0.05],
    ["dynamic-update-slice.3", 1, 0.03],
    ["while.1", 1, 0.03],
    ["custom-call.9", 1, 0.01],
    ["unattributed", 1, 0.01],
  ]


@pytest.mark.parametrize(
  ("kernel", "expected"),
  [
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize256x128x32", "gemm"),
    ("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_TNT", "gemm"),
    ("gemm_fusion_dot_176", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16", "attention"),
    ("fp4_quantize_pair", "pallas"),
    ("memcpy128", "copy"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "collective"),
    ("loop_convert_slice_fusion", "fusion"),
    ("input_reduce_fusion_2", "fusion"),
    ("some_custom_kernel", "other"),
  ],
)
def test_kernel_categories(kernel, expected):
  assert step_profile.category(kernel) == expected


def test_missing_trace_and_bad_steps_are_refused(tmp_path):
  with pytest.raises(FileNotFoundError, match="create_perfetto_trace"):
    step_profile.find_trace(tmp_path)
  with pytest.raises(ValueError, match="steps"):
    step_profile.summarize(tmp_path / "x", steps=0)
