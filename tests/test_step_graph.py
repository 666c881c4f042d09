"""CPU checks of the step's GPU machinery: the breakdown's aggregation (kernel names, trace
parsing, per-kernel and per-layer tables), the captured step's refresh rules, the parts."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from foxcute import step
from foxcute.lab import breakdown
from foxcute.lab.breakdown import KernelEvent

SIZES = step.StepSizes(B=6, K=3, SH2=10, D=4, Q=5, A_q=5, H_q=7, A=3, H_c=9, I_risk=4, H_risk=6,
                       I_kan=3, O_kan=4, G_kan=5, H_iqn=11)
MODULES = ("column_sum", "naive_q_denoise", "q_denoise", "risk_budget", "_naive", "mamba2", "naive_mamba2",
           "naive_curiosity", "curiosity")
DSL_COLUMN_SUM = ("kernel_cutlass_kernel_foxcutekernelscolumn_sumColumnSum_object_at__tensorptrf32gmemalign16"
                  "o341241_tensorptrf32gmemalign16o31311_0")
DSL_NAIVE_Q = "kernel_cutlass_kernel_foxcutekernelsnaive_q_denoisePerSample_object_at__tensorptrf32gmem_0"
DSL_BATCH_SUM = "kernel_cutlass_kernel_foxcutekernels_naiveBatchSum_object_at__tensorptrf32gmemalign16o1_0"
DSL_ROW_PASS_WGMMA = ("kernel_cutlass_kernel_foxcutekernelscuriosityRowPassWgmma_object_at__tensorptrf32gmemalign16"
                      "o64425641_tensorptri32gmemalign16o1_0")
# a @cute.kernel method other than `kernel` is named too (the row pass's name before 9a3ed39)
DSL_METHOD = ("kernel_cutlass_kernel_wgmma_foxcutekernelscuriosityRowPass_object_at__tensorptrf32gmemalign16"
              "o64425641_tensorptri32gmemalign16o1_0")
TORCH_FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
              "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)")


@pytest.mark.parametrize("name, short", [
    (DSL_COLUMN_SUM, "column_sum.ColumnSum"),
    (DSL_NAIVE_Q, "naive_q_denoise.PerSample"),
    (DSL_BATCH_SUM, "_naive.BatchSum"),
    (DSL_ROW_PASS_WGMMA, "curiosity.RowPassWgmma"),
    (DSL_METHOD, "curiosity.RowPass.kernel_wgmma"),
    (TORCH_FILL, "at::native::vectorized_elementwise_kernel"),
    ("Memset (Device)", "Memset"),
    ("ampere_sgemm_128x64_tn", "ampere_sgemm_128x64_tn"),
])
def test_short_kernel_names(name, short):
    assert breakdown.short_kernel_name(name, MODULES) == short


def test_short_names_use_the_kernel_package_when_no_modules_are_given():
    assert breakdown.short_kernel_name(DSL_COLUMN_SUM) == "column_sum.ColumnSum"
    assert breakdown.short_kernel_name(DSL_NAIVE_Q) == "naive_q_denoise.PerSample"


def test_trace_parsing_keeps_device_activities_only():
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::fill_", "dur": 50.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 4.0},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "dur": 5.0},
        {"ph": "X", "cat": "kernel", "name": DSL_COLUMN_SUM, "dur": 12.5},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "dur": 1.0},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 3},
        {"ph": "M", "name": "process_name", "args": {"name": "python"}},
    ]}
    trace["traceEvents"][3]["ts"] = 1000.5  # device events carry their start
    assert breakdown.events_from_trace(trace, "iqn_bias_grad_reduce") == [
        KernelEvent("iqn_bias_grad_reduce", DSL_COLUMN_SUM, 12.5, 1000.5),
        KernelEvent("iqn_bias_grad_reduce", "Memset (Device)", 1.0)]
    assert breakdown.events_from_trace({}, "x") == []


def test_kernel_table_aggregates_per_layer_and_kernel():
    events = [KernelEvent("mamba2_backward", DSL_COLUMN_SUM, 10.0),
              KernelEvent("mamba2_backward", DSL_NAIVE_Q, 60.0),
              KernelEvent("iqn_bias_grad_reduce", DSL_COLUMN_SUM, 4.0),
              KernelEvent("iqn_bias_grad_reduce", DSL_COLUMN_SUM, 6.0),
              KernelEvent("mamba2_backward", DSL_COLUMN_SUM, 20.0)]
    table = breakdown.kernel_table(events, backend="cute", modules=MODULES)
    assert list(table.columns) == breakdown.TABLE_COLUMNS
    assert table[["layer", "kernel"]].values.tolist() == [
        ["mamba2_backward", "naive_q_denoise.PerSample"], ["mamba2_backward", "column_sum.ColumnSum"],
        ["iqn_bias_grad_reduce", "column_sum.ColumnSum"]]
    assert table["calls per step"].tolist() == [1, 2, 2]
    assert table["us per call"].tolist() == [60.0, 15.0, 5.0]
    assert table["total us"].tolist() == [60.0, 30.0, 10.0]
    assert table["share of step (%)"].tolist() == pytest.approx([60.0, 30.0, 10.0])
    assert set(table["backend"]) == {"cute"} and set(table["method"]) == {breakdown.PROFILER}


def test_launch_table_lists_each_part_in_start_order():
    events = [KernelEvent("seed", DSL_COLUMN_SUM, 4.0, start_us=30.0),
              KernelEvent("fused", DSL_NAIVE_Q, 90.0, start_us=500.0),
              KernelEvent("seed", DSL_NAIVE_Q, 12.0, start_us=10.0),
              KernelEvent("seed", DSL_COLUMN_SUM, 4.0, start_us=20.0),
              KernelEvent("fused", DSL_COLUMN_SUM, 10.0, start_us=600.0)]
    table = breakdown.launch_table(events, modules=MODULES)
    assert list(table.columns) == breakdown.LAUNCH_COLUMNS
    assert table[["part", "launch", "kernel"]].values.tolist() == [
        ["seed", 1, "naive_q_denoise.PerSample"], ["seed", 2, "column_sum.ColumnSum"],
        ["seed", 3, "column_sum.ColumnSum"], ["fused", 1, "naive_q_denoise.PerSample"],
        ["fused", 2, "column_sum.ColumnSum"]]
    assert table["us"].tolist() == [12.0, 4.0, 4.0, 90.0, 10.0]
    assert table["start (us)"].tolist() == [0.0, 10.0, 20.0, 0.0, 100.0]
    assert table["share of part (%)"].tolist() == pytest.approx([60.0, 20.0, 20.0, 90.0, 10.0])
    assert breakdown.launch_table([]).empty


def test_kernel_table_of_no_events_is_empty_with_the_columns():
    table = breakdown.kernel_table([], backend="naive")
    assert table.empty and list(table.columns) == breakdown.TABLE_COLUMNS


def test_part_table_is_labelled_as_the_fallback():
    table = breakdown.part_table({"mamba2_forward": 30.0, "kan_backward": 10.0}, backend="cute")
    assert table["layer"].tolist() == ["mamba2_forward", "kan_backward"]
    assert table["share of step (%)"].tolist() == pytest.approx([75.0, 25.0])
    assert table["calls per step"].isna().all()
    assert set(table["method"]) == {breakdown.BENCH}


def test_layer_ratio_per_part_in_step_order_with_the_step_total():
    naive = breakdown.kernel_table([KernelEvent("kan_backward", "k1", 800.0), KernelEvent("kan_backward", "k2", 200.0),
                                    KernelEvent("mamba2_forward", "k3", 3000.0)], backend="naive", modules=())
    cute = breakdown.kernel_table([KernelEvent("mamba2_forward", "c1", 30.0), KernelEvent("kan_backward", "c2", 5.0)],
                                  backend="cute", modules=())
    ratio = breakdown.layer_ratio(naive, cute)
    assert ratio.index.tolist() == ["mamba2_forward", "kan_backward", "step"]
    assert ratio["naive us"].tolist() == [3000.0, 1000.0, 4000.0]
    assert ratio["cute us"].tolist() == [30.0, 5.0, 35.0]
    assert ratio["naive / cute"].tolist() == pytest.approx([100.0, 200.0, 4000.0 / 35.0])


def test_layer_ratio_keeps_a_part_only_one_side_has():
    naive = breakdown.kernel_table([KernelEvent("kan_backward", "k", 8.0)], backend="naive", modules=())
    cute = breakdown.kernel_table([KernelEvent("kan_backward", "k", 2.0), KernelEvent("risk_budget_forward", "r", 1.0)],
                                  backend="cute", modules=())
    ratio = breakdown.layer_ratio(naive, cute)
    assert ratio.index.tolist() == ["risk_budget_forward", "kan_backward", "step"]
    assert np.isnan(ratio.loc["risk_budget_forward", "naive / cute"])
    assert ratio.loc["kan_backward", "naive / cute"] == 4.0


@pytest.fixture(scope="module")
def inputs():
    return step.make_inputs(SIZES, np.random.default_rng(3))


def test_parts_run_in_the_order_of_PARTS_and_make_the_step(inputs):
    out = {}
    parts = step._parts(step._PublicLayers("reference", "tf32", "fused"), inputs, out)
    assert [name for name, _ in parts] == list(step.PARTS)
    for _, part in parts:
        part()
    whole = step.run(inputs)
    assert list(out) == list(whole)
    for name in whole:
        np.testing.assert_array_equal(out[name], whole[name])


def test_lanes_split_the_parts_and_keep_the_chain_in_one_lane():
    # Each part once, each lane in PARTS order, and the chain (Mamba2 forward -> the parts that
    # take its outputs) in one lane: a chained part on the other stream would race its input.
    main, side = step.LANES
    assert sorted(main + side) == sorted(step.PARTS)
    for lane in step.LANES:
        assert list(lane) == [p for p in step.PARTS if p in lane]
    assert {"mamba2_forward", *step._CHAINING_PARTS} <= set(main)
    assert step.FORK_AFTER in main


def test_kernel_step_forks_the_side_lane_once_FORK_AFTER_is_launched(inputs, monkeypatch):
    # Launch order with the lanes: the main lane up to FORK_AFTER, then the fork (the side
    # lane's parts on its stream), then the rest of the main lane; a fake lane records it.
    launched = []

    def fake_parts(layers, inputs, out, chained=None):
        def part(name):
            def launch():
                launched.append(name)
                out[name] = name
            return launch
        return [(name, part(name)) for name in step.PARTS]

    class FakeLane:
        def run(self, side, main):
            launched.append("fork")
            side()
            launched.append("side lane launched")
            main()

    monkeypatch.setattr(step, "_parts", fake_parts)
    monkeypatch.setattr(step, "_validate", lambda *args: {name: None for name in step.PARTS})
    monkeypatch.setattr(step, "_KernelLayers", lambda *args: None)
    monkeypatch.setattr(step, "side_lane", lambda x: FakeLane())
    outputs = step.kernel_step(inputs)()
    main, side = step.LANES
    fork = main.index(step.FORK_AFTER) + 1
    assert fork < len(main)  # something of the main lane runs beside the side lane
    assert launched == [*main[:fork], "fork", *side, "side lane launched", *main[fork:]]
    assert list(outputs) == list(step.PARTS)  # in run's order, whatever order the lanes filled them


def test_kernel_path_needs_a_gpu_backend(inputs):
    with pytest.raises(ValueError, match="needs a GPU backend"):
        step.kernel_step(inputs, backend="reference")


def test_kernel_step_rejects_an_unknown_part_to_leave_out(inputs):
    with pytest.raises(ValueError, match=r"leave_out names \['iqn'\]"):
        step.kernel_step(inputs, backend="reference", leave_out=("kan_backward", "iqn"))


def test_rel_errors_name_every_output_and_demand_the_same_outputs(inputs):
    reference = step.run(inputs)
    errors = step.rel_errors(reference, reference)
    assert list(errors) == list(reference) and not any(errors.values())
    with pytest.raises(ValueError, match="kan.dx"):
        step.rel_errors({k: v for k, v in reference.items() if k != "kan.dx"}, reference)


def test_refresh_accepts_same_layout_and_rejects_other_scalars_shapes_and_names(inputs):
    other = step.make_inputs(SIZES, np.random.default_rng(4))
    step.check_same_layout(inputs, other)
    moved = {**other, "mamba2": {**other["mamba2"], "sigma": 0.5}}
    with pytest.raises(ValueError, match="mamba2.sigma is fixed at capture"):
        step.check_same_layout(inputs, moved)
    bigger = step.make_inputs(step.StepSizes(**{**SIZES.__dict__, "B": SIZES.B + 1}), np.random.default_rng(4))
    with pytest.raises(ValueError, match=r"must keep shape \(6, 3, 10\)"):
        step.check_same_layout(inputs, bigger)
    wide = {**other, "curiosity": {**other["curiosity"], "a": other["curiosity"]["a"].astype(np.int64)}}
    with pytest.raises(ValueError, match="curiosity.a must keep shape .* and dtype int32"):
        step.check_same_layout(inputs, wide)
    with pytest.raises(ValueError, match="new inputs have layers"):
        step.check_same_layout(inputs, {k: v for k, v in other.items() if k != "iqn"})


def test_to_device_rejects_an_unknown_library(inputs):
    with pytest.raises(ValueError, match="library must be 'torch' or 'cupy'"):
        step.to_device(inputs, "jax")


def test_to_host_copies_and_keeps_scalars(inputs):
    host = step.to_host(inputs)
    assert host["mamba2"]["sigma"] == inputs["mamba2"]["sigma"]
    np.testing.assert_array_equal(host["kan"]["C"], inputs["kan"]["C"])


def test_torch_peer_step_on_the_cpu_matches_the_reference(inputs):
    torch = pytest.importorskip("torch")
    from foxcute.peers.step import Step

    device = {layer: {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}
              for layer, arrays in inputs.items()}
    out = Step("eager", "fp32")(device)
    errors = step.rel_errors(out, step.run(inputs))
    assert max(errors.values()) < 1e-5, errors


def test_step_records_name_the_layer_and_sizes():
    record = breakdown._record("cute", SIZES, "tf32")
    assert (record["layer"], record["pass"], record["impl"]) == ("step", "step", "cute")
    assert record["params"]["B"] == SIZES.B and record["params"]["H_iqn"] == SIZES.H_iqn
    assert record["params"]["precision"] == "tf32"
    assert json.loads(json.dumps(record)) == record  # JSON-ready for the results file


RETURNS = {("mamba2", "forward"): 1, ("mamba2", "backward"): 7, ("curiosity", "forward_backward"): 7,
           ("risk_budget", "forward"): 1, ("q_denoise", "loss_and_grads"): 6, ("kan", "backward"): 3,
           ("column_sum", "column_sum"): 1}


@pytest.mark.parametrize("backend", ["cute", "naive"])
def test_kernel_path_calls_every_kernel_function_as_its_signature_says(inputs, monkeypatch, backend):
    """The kernel path bypasses the layer modules: each kernel function is replaced by a fake
    that binds the call to the real signature (so a wrong argument fails) and records it."""
    import importlib
    import inspect

    calls = []
    for (layer, function), count in RETURNS.items():
        module = importlib.import_module(f"foxcute.kernels.{'' if backend == 'cute' else 'naive_'}{layer}")
        signature = inspect.signature(getattr(module, function))

        def fake(*args, _sig=signature, _name=f"{layer}.{function}", _count=count, **kwargs):
            bound = _sig.bind(*args, **kwargs)
            calls.append((_name, dict(bound.arguments)))
            return np.zeros(2) if _count == 1 else tuple(np.full(2, i) for i in range(_count))
        monkeypatch.setattr(module, function, fake)
    out = {}
    for _, part in step._parts(step._KernelLayers(backend, "fp32", "seed"), inputs, out):
        part()
    assert [name for name, _ in calls] == ["mamba2.forward", "curiosity.forward_backward", "risk_budget.forward",
                                           "q_denoise.loss_and_grads", "column_sum.column_sum",
                                           "column_sum.column_sum", "kan.backward", "mamba2.backward"]
    arguments = dict(calls)
    if backend == "cute":
        assert arguments["mamba2.backward"]["impl"] == "seed" and arguments["kan.backward"]["precision"] == "fp32"
    assert arguments["mamba2.forward"]["sigma"] == inputs["mamba2"]["sigma"]
    assert arguments["risk_budget.forward"]["e"] is out["curiosity.r"]
    assert arguments["curiosity.forward_backward"]["s"] is out["mamba2.out"]
    assert list(out) == list(step.run(inputs))  # the same outputs, named as run names them


def test_marginal_costs_take_each_variants_median_and_subtract_from_the_whole_step(monkeypatch):
    # Fake steps whose time says which parts they launch: part i costs 10 * (i + 1) us, plus
    # a round-dependent offset that the median over three rounds must remove.
    from foxcute.lab import timing

    cost = {part: 10.0 * (i + 1) for i, part in enumerate(step.PARTS)}
    timed = []

    def fake_kernel_step(inputs, *, precision, impl, leave_out):
        return lambda: sum(cost[p] for p in step.PARTS if p not in leave_out)

    def fake_bench(fn, *, library, warmup, reps, calls_per_rep):
        timed.append(fn)
        offset = (0.0, 5.0, -5.0)[(len(timed) - 1) // (1 + 2 * len(step.PARTS))]
        return fn() + offset, []

    monkeypatch.setattr(step, "kernel_step", fake_kernel_step)
    monkeypatch.setattr(timing, "bench", fake_bench)
    monkeypatch.setattr(breakdown, "array_kind", lambda x: "torch")
    table = breakdown.marginal_costs({"mamba2": {"h": None}}, rounds=3)
    assert len(timed) == 3 * (1 + 2 * len(step.PARTS))
    assert list(table.columns) == breakdown.MARGINAL_COLUMNS
    assert table["part"].tolist() == list(step.PARTS)
    whole = sum(cost.values())
    assert (table["step (us)"] == whole).all()
    assert table["alone (us)"].tolist() == [cost[p] for p in step.PARTS]
    assert table["marginal (us)"].tolist() == [cost[p] for p in step.PARTS]
    assert table.set_index("part")["lane"].to_dict() == {p: "side" if p in step.LANES[1] else "main" for p in step.PARTS}


def test_marginal_costs_need_torch_inputs(inputs):
    with pytest.raises(ValueError, match="must be torch CUDA tensors"):
        breakdown.marginal_costs(inputs)


def test_timing_spread_gives_the_median_and_the_10th_and_90th_percentiles():
    from foxcute.lab import timing

    fields = timing.spread([50.0, 10.0, 30.0, 20.0, 40.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0])
    assert fields == {"time_us": 60.0, "time_us_p10": 20.0, "time_us_p90": 100.0}
    assert timing.spread([7.0]) == {"time_us": 7.0, "time_us_p10": 7.0, "time_us_p90": 7.0}
    assert timing.spread([1.0, 2.0])["time_us_p90"] == pytest.approx(1.9)
    with pytest.raises(ValueError, match="no samples"):
        timing.spread([])


def test_step_records_time_the_compiled_torch_peers_from_a_graph_and_keep_the_spread(monkeypatch):
    # which implementations are captured and replayed, and what a record keeps of the samples
    from foxcute.lab import timing

    graphs = {}

    def fake_step_function(name, device, precision, impl):
        graph = name in ("cute", "torch_compile", "torch_max_autotune")
        return (lambda: {"x": np.ones(2)}), graph

    def fake_bench(fn, *, graph, library, **settings):
        graphs[len(graphs)] = graph
        return 2.0, [1.0, 2.0, 3.0]

    monkeypatch.setattr(breakdown, "_step_function", fake_step_function)
    monkeypatch.setattr(timing, "bench", fake_bench)
    monkeypatch.setattr(timing, "check_graph_replay", lambda fn, library: None)
    monkeypatch.setattr(step, "make_inputs", lambda sizes, rng: {})
    monkeypatch.setattr(step, "to_device", lambda host, library: {})
    monkeypatch.setattr(step, "reference_given", lambda reference, host, outputs: outputs)
    records = breakdown.step_records(SIZES, impls=("cute", "torch_eager", "torch_compile", "torch_max_autotune"),
                                     reference={"x": np.ones(2)})
    assert all((r["rel_err"], r["elem_err"], r["rel_err_end_to_end"]) == (0.0, 0.0, 0.0) for r in records)
    assert [r["timing"] for r in records] == [breakdown.GRAPH_REPLAY, "plain calls", breakdown.GRAPH_REPLAY,
                                              breakdown.GRAPH_REPLAY]
    assert all((r["time_us"], r["time_us_p10"], r["time_us_p90"]) == (2.0, pytest.approx(1.2), pytest.approx(2.8))
               for r in records)
    assert "torch_max_autotune" in breakdown.STEP_IMPLS and "torch_compile_cudagraphs" not in breakdown.STEP_IMPLS


def test_unknown_step_implementation_names_the_known_ones():
    with pytest.raises(ValueError, match="torch_max_autotune"):
        breakdown._step_function("torch_jit", {}, "tf32", "fused")


def test_lane_frame_puts_each_stream_in_its_lane_from_the_first_start():
    events = [KernelEvent("step", DSL_NAIVE_Q, 5.0, start_us=130.0, stream=13),
              KernelEvent("step", DSL_COLUMN_SUM, 10.0, start_us=100.0, stream=7),
              KernelEvent("step", TORCH_FILL, 2.0, start_us=120.0, stream=7)]
    frame = breakdown.lane_frame(events, MODULES)
    assert list(frame.columns) == breakdown.LANE_COLUMNS
    assert frame.values.tolist() == [["main", "column_sum.ColumnSum", 0.0, 10.0],
                                     ["main", "at::native::vectorized_elementwise_kernel", 20.0, 2.0],
                                     ["side", "naive_q_denoise.PerSample", 30.0, 5.0]]
    three = breakdown.lane_frame(events + [KernelEvent("step", "Memset (Device)", 1.0, 140.0, 21)], MODULES)
    assert three["lane"].tolist() == ["main", "main", "stream 13", "stream 21"]
    assert breakdown.lane_frame([]).empty


def test_trace_events_carry_their_stream():
    trace = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "dur": 1.0, "ts": 2.0, "tid": 7,
                              "args": {"stream": 13}},
                             {"ph": "X", "cat": "kernel", "name": "k", "dur": 1.0, "ts": 3.0, "tid": "stream 7"}]}
    assert [e.stream for e in breakdown.events_from_trace(trace, "step")] == [13, None]


def test_join_kernel_report_sets_each_launched_kernel_beside_its_compiled_configurations():
    launches = pd.DataFrame({"part": ["column_sum.forward[N=3]|cute", "column_sum.forward[N=3]|cute",
                                      "kan.backward|cute"],
                             "kernel": ["column_sum.ColumnSum", "Memset", "kan.Backward"],
                             "us": [4.0, 1.0, 9.0]})
    report = pd.DataFrame({"module": ["column_sum", "column_sum", "kan"],
                           "kernel": ["column_sum_N3", "column_sum_N128", "kan_backward_tf32"],
                           "kernel class": ["column_sum.ColumnSum", "column_sum.ColumnSum", "kan.Backward"],
                           "registers": [32, 40, 128], "mma_sync_tf32": [0, 0, 24], "wgmma_tf32": [0, 0, 0],
                           "ld_st_local": [0, 0, 0]})
    joined = breakdown.join_kernel_report(launches, report)
    assert list(joined.columns) == breakdown.REPORT_JOIN_COLUMNS
    assert joined[["case", "impl", "kernel"]].values.tolist() == [
        ["column_sum.forward[N=3]", "cute", "column_sum.ColumnSum"], ["column_sum.forward[N=3]", "cute", "column_sum.ColumnSum"],
        ["column_sum.forward[N=3]", "cute", "Memset"], ["kan.backward", "cute", "kan.Backward"]]
    assert joined["compiled as"].fillna("-").tolist() == ["column_sum_N3", "column_sum_N128", "-", "kan_backward_tf32"]
    assert joined["registers"].fillna(-1).tolist() == [32, 40, -1, 128]
    assert joined["device us"].tolist() == [4.0, 4.0, 1.0, 9.0]
    assert breakdown.join_kernel_report(launches.iloc[:0], report).empty


def test_batch_sweep_times_each_impl_at_each_batch_and_skips_a_rejected_size(monkeypatch):
    from foxcute._arrays import FoxcuteInputError
    from foxcute.lab import benchmarks, timing

    case = next(c for c in benchmarks.CASES if c.name == "q_denoise.loss_and_grads")

    def make(case, x):
        def fn():
            if x["q"].shape[0] > 64:
                raise FoxcuteInputError("B too large for this fake")
            return x["q"]
        return fn

    def broken(case, x):
        raise RuntimeError("no compiler")

    impls = [benchmarks.Impl("fake", "numpy", make), benchmarks.Impl("broken", "numpy", broken),
             benchmarks.Impl("other layer", "numpy", make, applies=lambda c: c.layer == "kan")]
    monkeypatch.setattr(benchmarks, "to_device", lambda inputs, library: inputs)
    monkeypatch.setattr(timing, "check_graph_replay", lambda fn, library: fn())
    monkeypatch.setattr(timing, "bench", lambda fn, library, reps: (None, [float(fn().shape[0])] * reps))
    lines = []
    rows = benchmarks.batch_sweep([case], (1, 64, 512), impls, 4.0, log=lines.append, reps=3)
    frame = pd.DataFrame(rows, columns=benchmarks.SWEEP_COLUMNS)
    assert frame[["impl", "B"]].values.tolist() == [["fake", 1], ["broken", 1], ["fake", 64], ["broken", 64],
                                                    ["fake", 512], ["broken", 512]]
    assert frame["time_us"].fillna(-1).tolist()[::2] == [1.0, 64.0, -1]
    assert frame["per_sample_us"].fillna(-1).tolist()[::2] == [1.0, 1.0, -1]
    assert frame["skipped"].tolist()[::2] == ["", "", "B too large for this fake"]
    assert set(frame["error"].tolist()[1::2]) == {"RuntimeError: no compiler"}
    assert frame["floor_us"].tolist()[::2] == [timing.floor_us(case.bytes_moved(case.scaled(b)), 4.0) for b in (1, 64, 512)]
    assert len(lines) == 6 and "skipped (B too large for this fake)" in lines[4]
