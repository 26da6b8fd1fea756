// multi_tensor_copy on CUDA: every (destination, source) pair of one dtype pair in one launch of
// the multi-tensor tables (Note [Fused optimizer kernels]), 8 elements per access. Used by mixed
// precision to move 16-bit gradients into f32 and f32 master weights into the 16-bit model.
#include <map>
#include <utility>

#include "colossal/core/view.h"                        // copy_stub
#include "colossal/optim/cuda/multi_tensor_apply.cuh"  // TensorTable, for_each_table, tensor_of_block
#include "colossal/optim/optimizer.h"                  // multi_tensor_copy_stub

namespace colossal::optim {
namespace {

using namespace cuda_detail;
using CopyTable = TensorTable<2, float, 1>;

template <class Dst, class Src>
__global__ void __launch_bounds__(kBlockThreads) multi_tensor_copy_kernel(const __grid_constant__ CopyTable table) {
  constexpr int kVec = 8;
  using VD = core::cuda_detail::Vec<Dst, kVec>;
  using VS = core::cuda_detail::Vec<Src, kVec>;
  const int block = static_cast<int>(blockIdx.x);
  const int t = tensor_of_block(table, block);
  const int64_t begin = int64_t{block - (t > 0 ? table.block_end[t - 1] : 0)} * kChunkElements;
  const int n = static_cast<int>(min(kChunkElements, table.numel[t] - begin));
  Dst* dst = static_cast<Dst*>(table.data[0][t]) + begin;
  const Src* src = static_cast<const Src*>(table.data[1][t]) + begin;
  int scalar_start = static_cast<int>(threadIdx.x);
  if (reinterpret_cast<uintptr_t>(dst) % sizeof(VD) == 0 && reinterpret_cast<uintptr_t>(src) % sizeof(VS) == 0) {
    const int n_vec = n / kVec;
    for (int i = static_cast<int>(threadIdx.x); i < n_vec; i += kBlockThreads) {
      const VS s = reinterpret_cast<const VS*>(src)[i];
      VD d;
#pragma unroll
      for (int j = 0; j < kVec; ++j) d.v[j] = to_storage<Dst>(static_cast<float>(s.v[j]));
      reinterpret_cast<VD*>(dst)[i] = d;
    }
    scalar_start += n_vec * kVec;
  }
  for (int i = scalar_start; i < n; i += kBlockThreads) dst[i] = to_storage<Dst>(static_cast<float>(src[i]));
}

template <class Dst, class Src>
void launch_copy(const std::vector<TensorArgs<CopyTable>>& args, cudaStream_t stream) {
  for_each_table(args, [&](const CopyTable& table, int blocks, int64_t) {
    multi_tensor_copy_kernel<Dst, Src><<<blocks, kBlockThreads, 0, stream>>>(table);
    COLOSSAL_CUDA_CHECK_LAUNCH();
  });
}

/// Calls f.template operator()<T>() for the dtypes the kernel converts between; false for others.
template <class F>
bool dispatch_copy_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      f.template operator()<float>();
      return true;
    case DType::bf16:
      f.template operator()<core::BFloat16>();
      return true;
    case DType::f16:
      f.template operator()<core::Half>();
      return true;
    default:
      return false;
  }
}

void multi_tensor_copy_cuda(const std::vector<Tensor>& dst, const std::vector<Tensor>& src) {
  const Device device = dst.front().device();
  core::cuda::DeviceGuard guard(device);
  const cudaStream_t stream = core::cuda_detail::stream_of(dst.front());
  // Pairs grouped by (destination dtype, source dtype), each group in list order.
  std::map<std::pair<DType, DType>, std::vector<TensorArgs<CopyTable>>> groups;
  for (size_t i = 0; i < dst.size(); ++i) {
    if (dst[i].numel() == 0) continue;
    TensorArgs<CopyTable> a;
    a.data = {dst[i].raw_data(), const_cast<void*>(src[i].raw_data())};
    a.numel = dst[i].numel();
    groups[{dst[i].dtype(), src[i].dtype()}].push_back(a);
  }
  for (const auto& [dtypes, args] : groups) {
    bool launched = false;
    dispatch_copy_dtype(dtypes.first, [&]<class Dst>() {
      launched = dispatch_copy_dtype(dtypes.second, [&]<class Src>() { launch_copy<Dst, Src>(args, stream); });
    });
    if (launched) continue;
    // Other dtypes (f64, integers): one copy each.
    for (size_t i = 0; i < dst.size(); ++i) {
      if (dst[i].numel() > 0 && dst[i].dtype() == dtypes.first && src[i].dtype() == dtypes.second) {
        core::copy_stub(device, dst[i], src[i]);
      }
    }
  }
}

COLOSSAL_REGISTER_KERNEL(multi_tensor_copy_stub, core::DeviceType::cuda, multi_tensor_copy_cuda);

}  // namespace
}  // namespace colossal::optim
