// CUDA dropout against the CPU kernel: for the same (seed, offset) the output and the gradient are
// equal bit for bit (same Philox words, same integer threshold, the same single f32/f64 product
// rounded once), in f32/bf16/f16/f64, for sizes with a tail of 1-3 elements, misaligned inputs
// (element path), p = 1, and the same bits on a second run.
#include <gtest/gtest.h>

#include <cmath>

#include "gpu_compare.h"

namespace colossal {
namespace {

using testing::expect_close;
using testing::random_input;

constexpr DType kDtypes[] = {DType::f32, DType::bf16, DType::f16, DType::f64};

/// dropout(x, p) on both devices from generators with one seed, output and gradient compared
/// exactly. gpu_x holds cpu_x's values (default: a copy).
void check_equal(const Tensor& cpu_x, double p, uint64_t seed, const std::string& what,
                 const Tensor& gpu_x = Tensor()) {
  const Device gpu = core::cuda_device(0);
  Tensor x = cpu_x.detach().set_requires_grad(true);
  Tensor gx = (gpu_x.defined() ? gpu_x : cpu_x.to(gpu)).detach().set_requires_grad(true);
  core::Generator cpu_gen(seed), gpu_gen(seed);
  Tensor y = ops::dropout(x, p, true, &cpu_gen);
  Tensor gy = ops::dropout(gx, p, true, &gpu_gen);
  expect_close(gy.to(core::kCpu), y, 0, 0, what + " output");
  Tensor upstream = random_input(cpu_x.shape(), 41, cpu_x.dtype(), 0.5, 1.5, false);
  autograd::backward(y, upstream);
  autograd::backward(gy, upstream.to(gpu));
  expect_close(gx.grad().to(core::kCpu), x.grad(), 0, 0, what + " gradient");
}

// The fused dropout_add against the CPU: the same mask; the sum residual + x * scale may be one
// fused multiply-add on the GPU (nvcc contracts it) where the CPU rounds the product first, so the
// output is held to one rounding of the dtype (relative 2^-23 in f32, 2^-8 in bf16); the gradients
// (the residual's the upstream, x's dropout's backward) are exact.
TEST(DropoutGpu, DropoutAddMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t n : {int64_t{5}, int64_t{4099}, int64_t{1} << 20}) {
      SCOPED_TRACE(fmt::format("dropout_add n={} ({})", n, dtype));
      const Tensor x = random_input({n}, 44, dtype, 0.5, 1.5), r = random_input({n}, 45, dtype, -1, 1);
      Tensor gx = x.to(gpu).detach().set_requires_grad(true), gr = r.to(gpu).detach().set_requires_grad(true);
      core::Generator cpu_gen(77), gpu_gen(77);
      const Tensor y = ops::dropout_add(x, r, 0.2, true, &cpu_gen);
      const Tensor gy = ops::dropout_add(gx, gr, 0.2, true, &gpu_gen);
      const double ulp = dtype == DType::bf16 ? 1.0 / 256 : std::ldexp(1.0, -23);
      expect_close(gy.to(core::kCpu).to(DType::f64), y.to(DType::f64), ulp, ulp, "output");
      const Tensor upstream = random_input({n}, 46, dtype, 0.5, 1.5, false);
      autograd::backward(y, upstream);
      autograd::backward(gy, upstream.to(gpu));
      expect_close(gx.grad().to(core::kCpu), x.grad(), 0, 0, "x's gradient");
      expect_close(gr.grad().to(core::kCpu), r.grad(), 0, 0, "the residual's gradient");
    }
  }
}

TEST(DropoutGpu, MatchesCpuBitForBit) {
  COLOSSAL_REQUIRE_GPU();
  for (DType dtype : kDtypes) {
    for (int64_t n : {1, 3, 4, 1001, 4099, 1 << 20}) {
      for (double p : {0.1, 0.5, 0.9}) {
        // Inputs away from 0, so that a kept element never looks dropped.
        check_equal(random_input({n}, 42, dtype, 0.5, 1.5, false), p, 1234 + static_cast<uint64_t>(n),
                    fmt::format("dropout n={} p={} ({})", n, p, dtype));
      }
    }
    check_equal(random_input({37, 129}, 43, dtype, 0.5, 1.5, false), 0.3, 99,
                fmt::format("dropout [37, 129] ({})", dtype));
  }
}

TEST(DropoutGpu, MisalignedInput) {
  COLOSSAL_REQUIRE_GPU();
  // A contiguous view one element into its storage: groups of four are not aligned, so the
  // kernel takes element accesses; the mask still follows the element index.
  for (DType dtype : kDtypes) {
    Tensor storage = random_input({4099}, 44, dtype, 0.5, 1.5, false);
    Tensor gpu_storage = storage.to(core::cuda_device(0));
    check_equal(storage.narrow(0, 1, 4098), 0.5, 7, fmt::format("misaligned dropout ({})", dtype),
                gpu_storage.narrow(0, 1, 4098));
  }
}

TEST(DropoutGpu, HighOffsetAndSeed) {
  COLOSSAL_REQUIRE_GPU();
  // Seeds and offsets beyond 32 bits reach both halves of Philox's key and counter.
  const Device gpu = core::cuda_device(0);
  Tensor x = random_input({10007}, 45, DType::f32, 0.5, 1.5, false);
  core::Generator cpu_gen(0x123456789abcdefull), gpu_gen(0x123456789abcdefull);
  const core::GeneratorState high{0x123456789abcdefull, 0xfedcba9876ull};
  cpu_gen.set_state(high);
  gpu_gen.set_state(high);
  expect_close(ops::dropout(x.to(gpu), 0.4, true, &gpu_gen).to(core::kCpu), ops::dropout(x, 0.4, true, &cpu_gen), 0, 0,
               "dropout at a high offset");
}

TEST(DropoutGpu, SameSeedSameBitsAndPOne) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  Tensor x = random_input({3, 1000}, 46, DType::bf16, 0.5, 1.5, false).to(gpu);
  core::Generator a(5), b(5);
  expect_close(ops::dropout(x, 0.5, true, &a).to(core::kCpu), ops::dropout(x, 0.5, true, &b).to(core::kCpu), 0, 0,
               "same seed twice");
  expect_close(ops::dropout(x, 1.0, true, &a).to(core::kCpu), core::zeros({3, 1000}, DType::bf16), 0, 0, "p = 1");
}

}  // namespace
}  // namespace colossal
