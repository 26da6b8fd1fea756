// Adam and AdamW's mixed-precision step on CUDA (multi_tensor_mixed_kernel; Note [Fused
// mixed-precision step] in amp/mixed_precision_optimizer.cpp): f32 masters stepped from bf16 / f16 /
// f32 gradients, unscaled and clipped inside the update, written through into 16-bit copies, against
// the CPU reference doing the same and against the CUDA three-pass step (multi_tensor_copy in,
// sum_of_squares' in-place unscale, the one-dtype kernel, multi_tensor_copy out): bit for bit, over
// more tensors than one launch holds, tensors of several chunks, odd sizes and views that start off
// a vector boundary. And the sums of squares of 16-bit tensors against those of their f32 copies,
// which the fused step's overflow check and clipping norm rely on (Note [Sums of squares in one
// order] in optim/cuda/clip_grad_kernels.cu).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "colossal/core/view.h"        // cast_raw, narrow_raw
#include "colossal/ops/elementwise.h"  // mul
#include "colossal/optim/adam.h"       // Adam, AdamW
#include "colossal/optim/clip_grad.h"  // sum_of_squares
#include "gpu_compare.h"               // COLOSSAL_REQUIRE_GPU, random_input

namespace colossal::optim {
namespace {

using colossal::testing::random_input;

struct MixedCase {
  std::string name;
  DType grad_dtype;  // f32: ZeRO's shard gradient, only the write-through is mixed
  DType copy_dtype;
  bool decoupled;
  double weight_decay;
  bool amsgrad;
  double unscale;  // 1: none
  double clip;     // 1: none
};

std::vector<MixedCase> mixed_cases() {
  return {
      {"bf16 AdamW", DType::bf16, DType::bf16, true, 0.1, false, 1.0, 1.0},
      {"bf16 AdamW clipped amsgrad", DType::bf16, DType::bf16, true, 0.1, true, 1.0, 0.37},
      {"bf16 Adam L2", DType::bf16, DType::bf16, false, 0.05, false, 1.0, 1.0},
      {"f16 AdamW unscaled clipped", DType::f16, DType::f16, true, 0.1, false, 1.0 / 1024, 0.43},
      {"f16 Adam unscaled by 1/3000 amsgrad", DType::f16, DType::f16, false, 0.0, true, 1.0 / 3000, 1.0},
      {"f32 gradient into a bf16 copy (ZeRO's shard)", DType::f32, DType::bf16, true, 0.1, false, 1.0, 0.61},
  };
}

/// 80 tensors (more than one launch of the six-column table holds): mostly odd sizes, every 23rd
/// of several chunks with a ragged tail.
std::vector<int64_t> sizes() {
  std::vector<int64_t> out;
  for (int i = 0; i < 80; ++i) out.push_back(i % 23 == 0 ? 2 * 65536 + 77 : 1 + (i * 37) % 301);
  return out;
}

/// A tensor of `numel` elements on `device` that every fifth index starts three elements into a
/// buffer (no vector access fits), else a tensor of its own.
Tensor maybe_misaligned(const Tensor& values, int i, Device device) {
  const int64_t numel = values.numel();
  if (i % 5 != 0) return values.to(device).clone();
  Tensor buffer = core::zeros({numel + 3}, TensorOptions(values.dtype(), device));
  Tensor view = core::narrow_raw(buffer, 0, 3, numel);
  view.copy_(values.to(device));
  return view;
}

/// One of the three runs: masters (f32, leaves), copies, the optimizer.
struct MixedRun {
  std::vector<Tensor> masters, copies;
  std::unique_ptr<Optimizer> optimizer;
};

MixedRun make_run(const MixedCase& c, Device device) {
  MixedRun run;
  const std::vector<int64_t> n = sizes();
  for (size_t i = 0; i < n.size(); ++i) {
    Tensor master = random_input({n[i]}, 10 + i, DType::f32, -1, 1, false).to(device).clone();
    master.set_requires_grad(true);
    run.masters.push_back(master);
    run.copies.push_back(maybe_misaligned(core::cast_raw(master.to(core::kCpu), c.copy_dtype), int(i) + 1, device));
  }
  const AdamOptions options{.lr = 1e-2, .weight_decay = c.weight_decay, .amsgrad = c.amsgrad};
  if (c.decoupled) {
    run.optimizer = std::make_unique<AdamW>(run.masters, options);
  } else {
    run.optimizer = std::make_unique<Adam>(run.masters, options);
  }
  return run;
}

void expect_same(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  ASSERT_EQ(actual.to(core::kCpu).to_vector<double>(), expected.to(core::kCpu).to_vector<double>()) << what;
}

TEST(AdamMixedPrecisionGpu, FusedMatchesTheCpuAndTheThreePasses) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  for (const MixedCase& c : mixed_cases()) {
    SCOPED_TRACE(c.name);
    MixedRun cpu = make_run(c, core::kCpu);
    MixedRun fused = make_run(c, gpu);
    MixedRun three = make_run(c, gpu);
    const std::vector<int64_t> n = sizes();
    for (int step = 1; step <= 3; ++step) {
      std::vector<Tensor> grads_cpu;  // what a scaled backward leaves; tensor 4 gets none in step 2
      for (size_t i = 0; i < n.size(); ++i) {
        const bool has_grad = !(i == 4 && step == 2);
        grads_cpu.push_back(
            has_grad ? core::cast_raw(random_input({n[i]}, 1000 * step + i, DType::f32, -1, 1, false), c.grad_dtype)
                     : Tensor());
        if (has_grad && c.unscale != 1.0)
          grads_cpu.back() =
              core::cast_raw(ops::mul(core::cast_raw(grads_cpu.back(), DType::f32), 0.5 / c.unscale), c.grad_dtype);
      }
      // The fused step on both devices: the gradients as they are, the hand-overs.
      for (MixedRun* run : {&cpu, &fused}) {
        const Device device = run->masters.front().device();
        for (size_t i = 0; i < n.size(); ++i) {
          run->masters[i].set_grad(grads_cpu[i].defined() ? maybe_misaligned(grads_cpu[i], int(i), device) : Tensor());
        }
        if (c.unscale != 1.0) run->optimizer->unscale_gradients_in_next_step(c.unscale);
        if (c.clip != 1.0) {
          run->optimizer->scale_gradients_in_next_step(core::full({}, c.clip, TensorOptions(DType::f64, device)));
        }
        run->optimizer->write_through_in_next_step(run->masters, run->copies);
        run->optimizer->step();
      }
      // The three passes on the GPU.
      std::vector<Tensor> grads32, grads16;
      for (size_t i = 0; i < n.size(); ++i) {
        if (!grads_cpu[i].defined()) {
          three.masters[i].set_grad(Tensor());
          continue;
        }
        three.masters[i].set_grad(core::empty({n[i]}, TensorOptions(DType::f32, gpu)));
        grads32.push_back(three.masters[i].grad());
        grads16.push_back(maybe_misaligned(grads_cpu[i], int(i), gpu));
      }
      multi_tensor_copy(grads32, grads16);
      if (c.unscale != 1.0) sum_of_squares(grads32, c.unscale);
      if (c.clip != 1.0)
        three.optimizer->scale_gradients_in_next_step(core::full({}, c.clip, TensorOptions(DType::f64, gpu)));
      three.optimizer->step();
      multi_tensor_copy(three.copies, three.masters);

      for (size_t i = 0; i < n.size(); ++i) {
        const std::string what = "step " + std::to_string(step) + ", tensor " + std::to_string(i);
        expect_same(fused.masters[i], cpu.masters[i], what + ": master, fused vs CPU");
        expect_same(fused.copies[i], cpu.copies[i], what + ": copy, fused vs CPU");
        expect_same(fused.masters[i], three.masters[i], what + ": master, fused vs three passes");
        expect_same(fused.copies[i], three.copies[i], what + ": copy, fused vs three passes");
        for (const auto& [name, buffer] : three.optimizer->state(0, i).buffers) {
          expect_same(fused.optimizer->state(0, i).buffers.at(name), buffer, what + ": " + name);
          expect_same(fused.optimizer->state(0, i).buffers.at(name), cpu.optimizer->state(0, i).buffers.at(name),
                      what + ": " + name + " vs CPU");
        }
      }
    }
  }
}

TEST(ClipGradGpu, SixteenBitSumOfSquaresEqualsThatOfItsF32Copy) {
  // The fused step's overflow check and clipping norm sum the squares of the 16-bit gradients where
  // the three passes summed those of their f32 copies: the same values, so the same bits, whatever
  // the alignment. Under fp16 the gradients carry a power-of-two scale, which the sum carries squared.
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  for (DType dtype : {DType::bf16, DType::f16}) {
    std::vector<Tensor> narrow, wide;
    for (int i = 0; i < 300; ++i) {
      const int64_t numel = i % 41 == 0 ? 3 * 65536 + 123 : 1 + (i * 37) % 300;
      const Tensor values = random_input({numel}, 700 + i, dtype, -4, 4, false);
      narrow.push_back(maybe_misaligned(values, i, gpu));
      wide.push_back(core::cast_raw(values, DType::f32).to(gpu).clone());  // fresh, aligned: amp's f32 gradient
    }
    const double sum16 = sum_of_squares(narrow).item<double>();
    EXPECT_EQ(sum16, sum_of_squares(wide).item<double>()) << core::dtype_name(dtype);
    const double inv = 1.0 / 1024;
    EXPECT_EQ(sum16 * inv * inv, sum_of_squares(wide, inv).item<double>()) << core::dtype_name(dtype) << " unscaled";
  }
}

}  // namespace
}  // namespace colossal::optim
