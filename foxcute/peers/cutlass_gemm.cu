// CUTLASS C++ peer of foxcute.kernels.gemm on Hopper's TF32 warpgroup MMA, float32 storage, as
// CUTLASS 3's collective builders assemble it (TMA loads, warp-specialized persistent kernels,
// stage count chosen by the builder):
//   matmul       D [M, N] = A [M, K] @ B_t [N, K]^T: both operands K-major, read by wgmma
//                straight from shared memory (SS);
//   weight grad  dW [N, K] = dY^T X for dY [M, N], X [M, K] (a reduction over the M rows): both
//                operands MN-major, which TF32 wgmma does not read from shared memory, so the
//                builder picks its register-A mainloop (dY^T transposed on the way through
//                registers); split over the reduction (split-K), the splits of a tile summed
//                in K order (CUTLASS's deterministic turnstile).
// foxcute/peers/cutlass_gemm.py builds this file with nvcc and calls it through ctypes.

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;

namespace {

using RowMajor = cutlass::layout::RowMajor;
using ColumnMajor = cutlass::layout::ColumnMajor;
using StreamKParams = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamKParams;

template <int TileN, class LayoutA, class LayoutB, class Schedule, class TileScheduler>
struct Tf32Gemm {
  using TileShape = Shape<_128, Int<TileN>, _32>;  // 32 floats of K: one 128-byte swizzle row
  using ClusterShape = Shape<_1, _1, _1>;          // no TMA multicast: the matmul's B_t is a few KB
  static constexpr int kAlign = 4;                 // 16-byte accesses

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, RowMajor, kAlign,  // no source C: D = A B
      float, RowMajor, kAlign,
      cutlass::epilogue::collective::EpilogueScheduleAuto>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      float, LayoutA, kAlign, float, LayoutB, kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      Schedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, TileScheduler>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// A [M, K] row-major; B [K, N] column-major = B_t [N, K] row-major
template <int TileN>
using MatmulGemm = Tf32Gemm<TileN, RowMajor, ColumnMajor, cutlass::gemm::collective::KernelScheduleAuto, void>;
// A = dY^T [N, M] column-major = dY [M, N] row-major; B = X [M, K] row-major; split-K needs the
// cooperative schedule's stream-K scheduler
template <int TileN>
using WeightGradGemm = Tf32Gemm<TileN, ColumnMajor, RowMajor, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                cutlass::gemm::StreamKScheduler>;

// A problem bound to its pointers: initialized once (kernel attributes, parameters, workspace),
// so that a launch is the GEMM's kernels on the given stream and can be captured in a CUDA graph.
// This library links its own CUDA runtime, whose current device is its own: each call sets the
// device the arrays live on.
struct Plan {
  int device = 0;
  virtual ~Plan() = default;
  virtual cutlass::Status launch(cudaStream_t stream) = 0;
};

template <class G>
struct PlanFor final : Plan {
  typename G::Device gemm;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  ~PlanFor() override {
    cudaSetDevice(device);
    cudaFree(workspace);
  }

  cutlass::Status init(typename G::Device::Arguments args) {
    if (cudaSetDevice(device) != cudaSuccess) return cutlass::Status::kErrorInternal;
    args.hw_info = cutlass::KernelHardwareInfo::make_kernel_hardware_info<typename G::Kernel>(device);
    cutlass::Status status = gemm.can_implement(args);
    if (status != cutlass::Status::kSuccess) return status;
    workspace_bytes = G::Device::get_workspace_size(args);
    if (workspace_bytes > 0 && cudaMalloc(&workspace, workspace_bytes) != cudaSuccess) {
      return cutlass::Status::kErrorWorkspaceNull;
    }
    return gemm.initialize(args, workspace);
  }

  // The split-K turnstile's locks count up to a tile's k-blocks and are not reset by the kernel:
  // each launch zeroes the workspace first (on the stream: a memset node in a graph), as
  // CUTLASS's own initialize does before a run
  cutlass::Status launch(cudaStream_t stream) override {
    if (cudaSetDevice(device) != cudaSuccess) return cutlass::Status::kErrorInternal;
    if (workspace_bytes > 0 && cudaMemsetAsync(workspace, 0, workspace_bytes, stream) != cudaSuccess) {
      return cutlass::Status::kErrorInternal;
    }
    return gemm.run(stream);
  }
};

template <class G>
Plan* make_plan(int device, typename G::Device::Arguments const& args, int* status) {
  auto* plan = new PlanFor<G>();
  plan->device = device;
  cutlass::Status s = plan->init(args);
  *status = static_cast<int>(s);
  if (s != cutlass::Status::kSuccess) {
    delete plan;
    return nullptr;
  }
  return plan;
}

template <int TileN>
Plan* matmul_plan(int device, const float* a, const float* b_t, float* d, int m, int n, int k, int* status) {
  using G = MatmulGemm<TileN>;
  using K = typename G::Kernel;
  auto stride_d = cutlass::make_cute_packed_stride(typename K::StrideD{}, {m, n, 1});
  typename G::Device::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {m, n, k, 1},
      {a, cutlass::make_cute_packed_stride(typename K::StrideA{}, {m, k, 1}),
       b_t, cutlass::make_cute_packed_stride(typename K::StrideB{}, {n, k, 1})},
      {{1.0f, 0.0f}, nullptr, stride_d, d, stride_d}};
  return make_plan<G>(device, args, status);
}

// dW [n, k] = dY^T X over `rows` rows: the GEMM (M, N, K) = (n, k, rows)
template <int TileN>
Plan* weight_grad_plan(int device, const float* dy, const float* x, float* dw, int rows, int n, int k, int splits,
                       int* status) {
  using G = WeightGradGemm<TileN>;
  using K = typename G::Kernel;
  auto stride_d = cutlass::make_cute_packed_stride(typename K::StrideD{}, {n, k, 1});
  typename G::Device::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {n, k, rows, 1},
      {dy, cutlass::make_cute_packed_stride(typename K::StrideA{}, {n, rows, 1}),
       x, cutlass::make_cute_packed_stride(typename K::StrideB{}, {k, rows, 1})},
      {{1.0f, 0.0f}, nullptr, stride_d, dw, stride_d}};
  args.scheduler.splits = splits;
  args.scheduler.decomposition_mode = StreamKParams::DecompositionMode::SplitK;
  args.scheduler.reduction_mode = StreamKParams::ReductionMode::Deterministic;
  return make_plan<G>(device, args, status);
}

constexpr int kTileNs[] = {32, 64, 128};

}  // namespace

extern "C" {

// The tile widths this library holds, narrowest first; foxcute picks the narrowest >= N.
int foxcute_cutlass_tile_ns(int* out, int capacity) {
  int count = static_cast<int>(sizeof(kTileNs) / sizeof(kTileNs[0]));
  for (int i = 0; i < count && i < capacity; ++i) out[i] = kTileNs[i];
  return count;
}

// A plan on CUDA device `device` for D = A @ B_t^T with the given tile width, or null with
// *status the CUTLASS status (cutlass::Status) that refused it.
void* foxcute_cutlass_matmul_plan(int device, int tile_n, const float* a, const float* b_t, float* d, int m, int n,
                                  int k, int* status) {
  switch (tile_n) {
    case 32: return matmul_plan<32>(device, a, b_t, d, m, n, k, status);
    case 64: return matmul_plan<64>(device, a, b_t, d, m, n, k, status);
    case 128: return matmul_plan<128>(device, a, b_t, d, m, n, k, status);
    default: *status = static_cast<int>(cutlass::Status::kErrorNotSupported); return nullptr;
  }
}

// A plan for dW [n, k] = dY^T X (dY [rows, n], X [rows, k]) split `splits` ways over the rows.
void* foxcute_cutlass_weight_grad_plan(int device, int tile_n, const float* dy, const float* x, float* dw, int rows,
                                       int n, int k, int splits, int* status) {
  switch (tile_n) {
    case 32: return weight_grad_plan<32>(device, dy, x, dw, rows, n, k, splits, status);
    case 64: return weight_grad_plan<64>(device, dy, x, dw, rows, n, k, splits, status);
    case 128: return weight_grad_plan<128>(device, dy, x, dw, rows, n, k, splits, status);
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
