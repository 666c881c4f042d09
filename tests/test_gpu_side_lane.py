"""_arrays.SideLane on the H200: the side lane's work is done before the current stream's next
work starts (eagerly and replayed from a CUDA graph), both lanes' results come back, and
side_lane gives each current stream, and a fork nested in another's main lane, a side stream of
its own."""

import numpy as np
import pytest

from foxcute import _arrays

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

N = 1 << 24  # 64 MB: a side lane of many passes over it takes milliseconds
PASSES = 64


def slow_sum_on_side(x):
    """x + PASSES on the lane's stream, by PASSES dependent passes over 64 MB."""
    for _ in range(PASSES):
        x = x + 1.0
    return x


def test_current_stream_waits_for_the_side_lane():
    lane = _arrays.SideLane("cupy", 0)
    zero = cp.zeros(N, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        side, main = lane.run(lambda: slow_sum_on_side(zero), lambda: zero + 2.0)
        total = side + main  # on `stream`: must see both lanes' finished work
    stream.synchronize()
    assert float(total.min()) == float(total.max()) == PASSES + 2.0


def test_lanes_in_a_captured_graph_replay_in_order():
    lane = _arrays.SideLane("cupy", 0)
    x = cp.zeros(N, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture(cp.cuda.runtime.streamCaptureModeRelaxed)
        side, main = lane.run(lambda: slow_sum_on_side(x), lambda: x * 3.0)
        total = side + main
        graph = stream.end_capture()
        x[...] = 5.0  # not captured: the replay must read it
        graph.launch(stream)
    stream.synchronize()
    assert float(total.min()) == float(total.max()) == (5.0 + PASSES) + 15.0


def test_each_current_stream_has_its_own_side_stream():
    x = cp.zeros(4, dtype=cp.float32)
    first, second = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with first:
        lane = _arrays.side_lane(x)
        assert _arrays.side_lane(x) is lane
        assert lane.stream.ptr != first.ptr
    with second:
        other = _arrays.side_lane(x)
    assert other is not lane and other.stream.ptr not in (first.ptr, second.ptr, lane.stream.ptr)


def test_a_fork_from_the_main_lane_gets_a_side_stream_of_its_own():
    x = cp.zeros(4, dtype=cp.float32)
    with cp.cuda.Stream(non_blocking=True):
        outer = _arrays.side_lane(x)
        seen = {}

        def main():
            seen["inner"] = _arrays.side_lane(x)  # same current stream, outer lane busy
            seen["inner"].run(lambda: None, lambda: None)

        def side():
            seen["from_side"] = _arrays.side_lane(x)  # current stream: the outer lane's

        outer.run(side, main)
        assert _arrays.side_lane(x) is outer  # free again
    streams = {outer.stream.ptr, seen["inner"].stream.ptr, seen["from_side"].stream.ptr}
    assert len(streams) == 3 and seen["inner"] is not outer


def test_torch_side_lane_results_and_order():
    torch = pytest.importorskip("torch", reason="torch is needed for the torch lane")
    lane = _arrays.SideLane("torch", 0)
    zero = torch.zeros(N, device="cuda")
    side, main = lane.run(lambda: slow_sum_on_side(zero), lambda: zero - 1.0)
    total = (side + main).cpu().numpy()
    np.testing.assert_array_equal(total, np.full(N, PASSES - 1.0, dtype=np.float32))
