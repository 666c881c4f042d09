// CUTLASS C++ peer of foxcute.kernels.gemm.matmul: D [M, N] = A [M, K] @ B_t [N, K]^T in
// float32 storage on Hopper's TF32 warpgroup MMA, as CUTLASS 3's collective builders assemble
// it (TMA loads, warp-specialized persistent kernel, stage count and schedule chosen by the
// builder). Both operands are K-major, the only layout TF32 wgmma reads from shared memory.
// foxcute/peers/cutlass_gemm.py builds this file with nvcc and calls it through ctypes.

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;

namespace {

template <int TileN>
struct Tf32Gemm {
  using TileShape = Shape<_128, Int<TileN>, _32>;  // 32 floats of K: one 128-byte swizzle row
  using ClusterShape = Shape<_1, _1, _1>;          // B_t is a few KB: nothing to multicast
  static constexpr int kAlign = 4;                 // 16-byte accesses

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, cutlass::layout::RowMajor, kAlign,  // no source C: D = A B
      float, cutlass::layout::RowMajor, kAlign,
      cutlass::epilogue::collective::EpilogueScheduleAuto>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      float, cutlass::layout::RowMajor, kAlign,     // A [M, K]
      float, cutlass::layout::ColumnMajor, kAlign,  // B [K, N] column-major = B_t [N, K] row-major
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::collective::KernelScheduleAuto>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// A problem bound to its pointers: initialized once (kernel attributes, parameters), so that a
// launch is one kernel on the given stream and can be captured in a CUDA graph.
struct Plan {
  virtual ~Plan() = default;
  virtual cutlass::Status launch(cudaStream_t stream) = 0;
};

template <int TileN>
struct PlanFor final : Plan {
  using G = Tf32Gemm<TileN>;
  typename G::Device gemm;
  void* workspace = nullptr;

  ~PlanFor() override { cudaFree(workspace); }

  cutlass::Status init(const float* a, const float* b_t, float* d, int m, int n, int k) {
    using Kern = typename G::Kernel;
    auto stride_a = cutlass::make_cute_packed_stride(typename Kern::StrideA{}, {m, k, 1});
    auto stride_b = cutlass::make_cute_packed_stride(typename Kern::StrideB{}, {n, k, 1});
    auto stride_d = cutlass::make_cute_packed_stride(typename Kern::StrideD{}, {m, n, 1});
    typename G::Device::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {a, stride_a, b_t, stride_b},
        {{1.0f, 0.0f}, nullptr, stride_d, d, stride_d}};
    int device = 0;
    cudaGetDevice(&device);
    args.hw_info = cutlass::KernelHardwareInfo::make_kernel_hardware_info<Kern>(device);
    cutlass::Status status = gemm.can_implement(args);
    if (status != cutlass::Status::kSuccess) return status;
    size_t bytes = G::Device::get_workspace_size(args);
    if (bytes > 0 && cudaMalloc(&workspace, bytes) != cudaSuccess) return cutlass::Status::kErrorWorkspaceNull;
    return gemm.initialize(args, workspace);
  }

  cutlass::Status launch(cudaStream_t stream) override { return gemm.run(stream); }
};

template <int TileN>
Plan* make_plan(const float* a, const float* b_t, float* d, int m, int n, int k, int* status) {
  auto* plan = new PlanFor<TileN>();
  cutlass::Status s = plan->init(a, b_t, d, m, n, k);
  *status = static_cast<int>(s);
  if (s != cutlass::Status::kSuccess) {
    delete plan;
    return nullptr;
  }
  return plan;
}

}  // namespace

extern "C" {

// The tile widths this library holds, narrowest first; foxcute picks the narrowest >= N.
int foxcute_cutlass_tile_ns(int* out, int capacity) {
  const int tiles[] = {32, 64, 128};
  int count = static_cast<int>(sizeof(tiles) / sizeof(tiles[0]));
  for (int i = 0; i < count && i < capacity; ++i) out[i] = tiles[i];
  return count;
}

// A plan for D = A @ B_t^T with the given tile width, or null with *status the CUTLASS status
// (cutlass::Status) that refused it.
void* foxcute_cutlass_plan(int tile_n, const float* a, const float* b_t, float* d, int m, int n, int k, int* status) {
  switch (tile_n) {
    case 32: return make_plan<32>(a, b_t, d, m, n, k, status);
    case 64: return make_plan<64>(a, b_t, d, m, n, k, status);
    case 128: return make_plan<128>(a, b_t, d, m, n, k, status);
    default: *status = static_cast<int>(cutlass::Status::kErrorNotSupported); return nullptr;
  }
}

// Launches the plan's GEMM on `stream` (a cudaStream_t); returns its cutlass::Status, or
// 1000 + the CUDA error the launch left.
int foxcute_cutlass_launch(void* plan, void* stream) {
  cutlass::Status s = static_cast<Plan*>(plan)->launch(static_cast<cudaStream_t>(stream));
  if (s != cutlass::Status::kSuccess) return static_cast<int>(s);
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : 1000 + static_cast<int>(err);
}

void foxcute_cutlass_free(void* plan) { delete static_cast<Plan*>(plan); }

}  // extern "C"
