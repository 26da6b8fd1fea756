// CPU dropout kernel for f32, f64, f16 and bf16: out = [residual +] (keep(i) ? x * scale : 0) with the keep rule
// of Note [Dropout mask] (ops/dropout.cpp). Blocks of four elements share one Philox call, and any
// thread computes any block, so the split over threads cannot change the mask.
#include <algorithm>

#include "colossal/core/parallel_for.h"  // parallel_for
#include "colossal/ops/loss_kernels.h"

namespace colossal::ops {
namespace {

void dropout_cpu(const Tensor& out, const Tensor& x, const Tensor& residual, const DropoutParams& params) {
  core::dispatch_floating(x.dtype(), "dropout", [&]<class T>() {
    using Acc = core::acc_t<T>;
    const T* in = x.data<T>();
    const T* add = residual.defined() ? residual.data<T>() : nullptr;
    T* y = out.data<T>();
    const int64_t n = x.numel();
    const Acc scale = static_cast<Acc>(params.scale);
    // Philox costs about as much as a few dozen multiplies, hence a finer grain than plain copies.
    core::parallel_for(0, (n + 3) / 4, 2048, [&](int64_t begin, int64_t end) {
      for (int64_t block = begin; block < end; ++block) {
        const core::PhiloxBlock bits = core::philox_block(params.seed, params.offset, static_cast<uint64_t>(block));
        const int64_t first = block * 4;
        const int count = static_cast<int>(std::min<int64_t>(4, n - first));
        for (int w = 0; w < count; ++w) {
          const Acc kept =
              dropout_keeps(bits.x[w], params.keep_threshold) ? static_cast<Acc>(in[first + w]) * scale : Acc(0);
          y[first + w] = static_cast<T>(add ? static_cast<Acc>(add[first + w]) + kept : kept);
        }
      }
    });
  });
}

COLOSSAL_REGISTER_KERNEL(dropout_stub, core::DeviceType::cpu, dropout_cpu);

}  // namespace
}  // namespace colossal::ops
