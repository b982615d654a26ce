"""benchmarks.cuda_kernels: its table and report from the profiler's kernels, its profiler read on this machine's
PyTorch, and its refusal without CUDA (the figures need a GPU)."""

import pytest
import torch

from benchmarks import cuda_kernels


def test_kernels_are_summed_by_name_per_replay_the_longest_first():
    seen = [("conv", 30.0), ("softmax", 2.0), ("conv", 34.0), ("softmax", 2.5), ("copy", 1.0), ("softmax", 2.5)]
    table = cuda_kernels.kernel_table(seen, runs=2)
    assert table["gpu_us"] == 36.0  # 72 µs over two replays
    assert [row["kernel"] for row in table["kernels"]] == ["conv", "softmax", "copy"]
    assert table["kernels"][1] == {"kernel": "softmax", "launches": 1.5, "us": 3.5}


def test_the_report_shows_each_variant_or_why_it_has_no_figures():
    table = cuda_kernels.kernel_table([("k" * 200, 10.0), ("short", 1.0)], runs=1)
    report = {
        "device": "a GPU",
        "graph": "mnist/capsnet.onnx",
        "when": "2026-11-26 16:00",
        "runs": 1,
        "rows": [{"variant": "cuda graph", "wall_ms": 0.9, **table}, {"variant": "cuda graph, fp16", "error": "no"}],
    }
    text = cuda_kernels.markdown(report)
    assert "## cuda graph\n\nWall 0.9 ms a replay; on the GPU 11.0 µs, 2 kernels and copies." in text
    assert f"| `{'k' * cuda_kernels.NAME_CHARS}` | 1 | 10.0 |" in text
    assert "## cuda graph, fp16\n\nNo figures: no" in text


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_the_profiler_is_read_by_device_name_and_time():
    """PyTorch's profiler as the benchmark reads it (events, their device, name and time range): on the CPU
    each matrix product is an event of its own, and none is the GPU's."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: its kernels would be seen")
    a = torch.ones(256, 256)
    on_cpu = cuda_kernels.profiled(lambda: a @ a, runs=3, device="CPU")
    products = [us for name, us in on_cpu if name == "aten::mm"]
    assert len(products) == 3 and all(us > 0 for us in products)
    assert cuda_kernels.profiled(lambda: a @ a, runs=3) == []


def test_without_cuda_it_says_what_it_needs(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(SystemExit, match="needs onnxruntime-gpu and a CUDA device"):
        cuda_kernels.main(["--out", str(tmp_path / "k.json")])


def test_every_variant_has_its_graph():
    """Each variant names run_binding's options and a graph made from the folded one; the engine's (the
    convolution as a matmul) comes first."""
    assert cuda_kernels.VARIANTS[0] == "cuda graph, conv as matmul"
    for variant in cuda_kernels.VARIANTS:
        assert cuda_kernels.CUDA_VARIANTS.get(variant, ({}, "fp32"))[1] in cuda_kernels.GRAPHS
