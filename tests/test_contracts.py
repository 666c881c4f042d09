"""Each layer names its kernel modules, and each kernel module's CONTRACT matches its code:
the passes it declares are functions of the module, and its check_sizes takes exactly the
options the contract says change the supported sizes."""

import inspect

import numpy as np

import pytest

from foxcute import _layer, curiosity, kan, mamba2, q_denoise, reduction, risk_budget
from foxcute.lab import benchmarks

LAYERS = {"mamba2": mamba2, "q_denoise": q_denoise, "kan": kan, "curiosity": curiosity,
          "risk_budget": risk_budget, "column_sum": reduction}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layer_names_a_kernel_module_per_gpu_backend(layer):
    modules = LAYERS[layer].kernel_modules()
    assert tuple(modules) == _layer.GPU_BACKENDS
    assert modules["cute"].__name__ == f"foxcute.kernels.{layer}"
    assert modules["naive"].__name__ == f"foxcute.kernels.naive_{layer}"


@pytest.mark.parametrize("layer", sorted(LAYERS))
@pytest.mark.parametrize("backend", _layer.GPU_BACKENDS)
def test_contract_matches_the_module(layer, backend):
    module = LAYERS[layer].kernel_modules()[backend]
    contract = module.CONTRACT
    assert contract.passes and all(callable(getattr(module, name, None)) for name in contract.passes)
    for name in contract.passes:
        keywords = {p.name for p in inspect.signature(getattr(module, name)).parameters.values()
                    if p.kind is inspect.Parameter.KEYWORD_ONLY}
        assert set(contract.options) <= keywords, f"{module.__name__}.{name} lacks an option keyword"
    sizing = [p for p in inspect.signature(module.check_sizes).parameters][1:]
    assert sizing == list(contract.sized_by)
    assert set(contract.sized_by) <= set(contract.options)
    if backend == "naive":
        assert contract.options == {}


def test_variants_are_the_product_of_the_options():
    case = next(c for c in benchmarks.CASES if c.layer == "mamba2")
    assert benchmarks.variants(case, "cute") == [
        {"impl": impl, "precision": p} for impl in ("fused", "seed") for p in ("tf32", "fp32")]
    assert benchmarks.variants(case, "naive") == [{}]
    column = next(c for c in benchmarks.CASES if c.layer == "column_sum")
    assert benchmarks.variants(column, "cute") == [{}]


def test_take_keeps_only_the_declared_options():
    contract = _layer.KernelContract(passes=("forward",), options={"precision": _layer.PRECISIONS})
    assert contract.take({"precision": "fp32", "impl": "fused"}) == {"precision": "fp32"}


@pytest.mark.parametrize("case", [*benchmarks.CASES, *benchmarks.GEMM_CASES], ids=lambda c: c.name)
def test_bytes_moved_counts_every_array_once(case):
    """A pass's compulsory bytes, counted here from the arrays themselves: every input array
    read once and every output written once, 4 bytes an element (scalar arguments such as
    sigma and b2 travel in the launch, not through memory)."""
    rng = np.random.default_rng(0)
    inputs = case.make(rng, case.odd_sizes)
    outputs = benchmarks.reference(case, inputs)
    read = sum(np.asarray(v).size for v in inputs.values() if isinstance(v, np.ndarray))
    written = sum(np.asarray(o).size for o in outputs)
    assert case.bytes_moved(case.odd_sizes) == 4 * (read + written)


def test_record_bytes_finds_each_records_case_and_the_step_sums_its_passes():
    """A results record's bytes by today's count (README's headline counts a run's floors
    again with it): its case by layer, pass and variant at the record's sizes; the step's as
    the sum of the passes it runs (KAN backward, not KAN forward); None where a size is
    missing or no case matches."""
    odd = lambda name: next(c for c in (*benchmarks.CASES, *benchmarks.GEMM_CASES) if c.name == name)  # noqa: E731
    mamba = odd("mamba2.backward")
    assert benchmarks.record_bytes("mamba2", "backward", mamba.odd_sizes) == mamba.bytes_moved(mamba.odd_sizes)
    wide = odd("column_sum.forward[N=128]")
    assert (benchmarks.record_bytes("column_sum", "forward", {**wide.odd_sizes, "variant": "N=128"})
            == wide.bytes_moved(wide.odd_sizes))
    assert benchmarks.record_bytes("mamba2", "backward", {"B": 8}) is None
    assert benchmarks.record_bytes("c_export", "step", {"B": 8}) is None
    parts = [c for c in benchmarks.CASES if c.name != "kan.forward"]
    assert len(parts) == len(benchmarks.CASES) - 1
    assert benchmarks.record_bytes("step", "step", {"B": 64}) == sum(c.bytes_moved(c.scaled(64)) for c in parts)
