// Attention dropout inside cuDNN's fused engine (Note [cuDNN attention dropout] in
// ops/cuda/attention_cudnn.cpp), checked against the unfused computation given the kernel's own
// mask: a test-only plan stores the RNG node's output for the same seed and offset, and the CPU
// recomputes softmax(q k^T * scale [+ causal]) * mask / (1 - p) then v in f64, forward and backward.
// Also: the keep rate, masks independent across heads and rows, the same bits for one seed and
// different bits for another (gradients too, and a broadcast output gradient), packed qkv, and the
// problems cuDNN declines running unfused (equal to the CPU, whose ops::dropout mask is the GPU's
// bit for bit).
//
// Tolerances (tests/support/gpu_compare.h's per-dtype base, as attention_gpu_test.cpp): the engine
// rounds P * M / (1 - p) to bf16/f16 before P V and dS before dS K / dS^T Q, as without dropout:
// one rounding of terms whose absolute sum is about the result's size. The reference gets the same
// rounded inputs in f64, so the forward fits 2x the base and the gradients (partly cancelling
// sums, now of terms up to 1 / (1 - p) = 1.25 larger) 3x.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "colossal/ops/cuda/attention_cudnn.h"  // the engine switch, its counter, the forward with mask
#include "gpu_compare.h"

namespace colossal {
namespace {

using testing::expect_close;
using testing::random_input;
using testing::tolerance_for;

constexpr double kP = 0.2;

struct EngineOn {
  EngineOn() { ops::cuda::set_cudnn_attention_enabled(true); }
};

Device gpu() {
  return core::cuda_device(0);
}

/// softmax(q k^T * scale [+ causal]) * mask / (1 - p), then v: f64 CPU ops (differentiable).
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal, double p) {
  const int64_t t = q.size(-2);
  Tensor scores = ops::mul(ops::matmul(q, k.transpose(-2, -1)), 1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  if (causal) {
    std::vector<double> additive(static_cast<size_t>(t * t), 0.0);
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t j = i + 1; j < t; ++j) additive[i * t + j] = -std::numeric_limits<double>::infinity();
    }
    scores = ops::add(scores, core::from_vector(additive, {t, t}));
  }
  const Tensor dropped = ops::mul(ops::mul(ops::softmax(scores, -1), mask), 1.0 / (1.0 - p));
  return ops::matmul(dropped, v);
}

/// The mask cuDNN draws for (seed, offset) on q's problem, through the test-only plan: f64 on the CPU.
/// Entries the kernel never computes (the tiles a causal mask skips whole) keep the fill 0.5.
Tensor kernel_mask(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double p, uint64_t seed,
                   uint64_t offset) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  ops::AttentionParams params;
  params.scale = 1.0 / std::sqrt(static_cast<double>(d));
  params.causal = causal;
  params.dropout_p = p;
  params.dropout_seed = seed;
  params.dropout_offset = offset;
  const Tensor out = core::empty({b, h, t, d}, TensorOptions(q.dtype(), gpu()));
  const Tensor lse = core::empty({b, h, t}, TensorOptions(DType::f32, gpu()));
  const Tensor mask = core::full({b, h, t, t}, 0.5, TensorOptions(DType::f32, gpu()));
  EXPECT_TRUE(ops::cuda::cudnn_attention_forward_with_mask(out, lse, mask, q, k, v, params))
      << "the plan that stores the mask was declined";
  return mask.to(core::kCpu).to(DType::f64);
}

/// 1 where query i sees key j (j <= i when causal), else 0: [T, T] f64.
Tensor visible(int64_t t, bool causal) {
  std::vector<double> seen(static_cast<size_t>(t * t), 1.0);
  for (int64_t i = 0; causal && i < t; ++i) {
    for (int64_t j = i + 1; j < t; ++j) seen[i * t + j] = 0.0;
  }
  return core::from_vector(seen, {t, t});
}

double max_abs(const Tensor& t) {
  return ops::max(ops::abs(t)).item<double>();
}

/// |actual - expected| <= factor * (atol + rtol * |expected|) with the dtype's base tolerance.
void expect_matches(const Tensor& actual, const Tensor& expected, DType dtype, double factor, const std::string& what) {
  const testing::Tolerance base = tolerance_for(dtype);
  expect_close(actual.to(core::kCpu).to(DType::f64), expected.detach(), factor * base.atol, factor * base.rtol, what);
}

struct Problem {
  Shape shape;  // [B, H, T, D] of q, k and v
  bool causal;
};

TEST(AttentionDropoutGpu, FusedMatchesTheReferenceWithItsMask) {
  COLOSSAL_REQUIRE_GPU();
  EngineOn engine;
  for (const Problem& c : {Problem{{2, 3, 128, 64}, false}, Problem{{2, 3, 128, 64}, true},
                           Problem{{1, 2, 197, 64}, true}, Problem{{1, 2, 130, 128}, false}}) {
    for (DType dtype : {DType::bf16, DType::f16}) {
      const std::string what = fmt::format("q {} causal {} ({})", c.shape, c.causal, core::dtype_name(dtype));
      SCOPED_TRACE(what);
      const Tensor q_cpu = random_input(c.shape, 1, dtype, -1.5, 1.5),
                   k_cpu = random_input(c.shape, 2, dtype, -1.5, 1.5);
      const Tensor v_cpu = random_input(c.shape, 3, dtype), grad_out = random_input(c.shape, 4, dtype, -1, 1, false);
      Tensor q = q_cpu.detach().to(gpu()).set_requires_grad(true), k = k_cpu.detach().to(gpu()).set_requires_grad(true);
      Tensor v = v_cpu.detach().to(gpu()).set_requires_grad(true);

      core::Generator generator(1234);
      const core::GeneratorState before = generator.state();
      const int64_t calls = ops::cuda::cudnn_attention_counter.load();
      const Tensor out =
          ops::scaled_dot_product_attention(q, k, v, {.causal = c.causal, .dropout_p = kP, .generator = &generator});
      autograd::backward(out, grad_out.to(gpu()));
      EXPECT_EQ(ops::cuda::cudnn_attention_counter.load() - calls, 2) << "forward and backward on cuDNN";
      const uint64_t scores = static_cast<uint64_t>(c.shape[0] * c.shape[1] * c.shape[2] * c.shape[2]);
      EXPECT_EQ(generator.state().offset, before.offset + scores) << "the op reserves B * H * T * T offsets";

      const Tensor mask = kernel_mask(q.detach(), k.detach(), v.detach(), c.causal, kP, before.seed, before.offset);
      // Over the entries the kernel uses (a causal mask's skipped tiles are never drawn).
      const Tensor seen = visible(c.shape[2], c.causal);
      const double kept = ops::sum(ops::mul(mask, seen)).item<double>();
      const double total = static_cast<double>(c.shape[0] * c.shape[1]) * ops::sum(seen).item<double>();
      EXPECT_EQ(ops::sum(ops::mul(ops::mul(mask, ops::add(mask, -1.0)), seen)).item<double>(), 0.0)
          << "a mask of 0s and 1s";
      EXPECT_NEAR(kept / total, 1.0 - kP, 6.0 * std::sqrt(kP * (1.0 - kP) / total));

      Tensor q64 = q_cpu.detach().to(DType::f64).set_requires_grad(true);
      Tensor k64 = k_cpu.detach().to(DType::f64).set_requires_grad(true);
      Tensor v64 = v_cpu.detach().to(DType::f64).set_requires_grad(true);
      const Tensor expected = reference(q64, k64, v64, mask, c.causal, kP);
      autograd::backward(expected, grad_out.to(DType::f64));
      expect_matches(out, expected, dtype, 2.0, what + " output");
      expect_matches(q.grad(), q64.grad(), dtype, 3.0, what + " grad q");
      expect_matches(k.grad(), k64.grad(), dtype, 3.0, what + " grad k");
      expect_matches(v.grad(), v64.grad(), dtype, 3.0, what + " grad v");
      // Without the mask (a wrong one) the output is off by far more than the tolerance.
      const Tensor undropped =
          reference(q64.detach(), k64.detach(), v64.detach(), core::ones(mask.shape(), DType::f64), c.causal, 0.0);
      EXPECT_GT(max_abs(ops::sub(out.to(core::kCpu).to(DType::f64), undropped)), 0.1);
    }
  }
}

TEST(AttentionDropoutGpu, KeepRateAndIndependence) {
  COLOSSAL_REQUIRE_GPU();
  EngineOn engine;
  // 8.4M draws: the kept fraction's standard deviation is sqrt(p (1 - p) / N) ~ 1e-4 at p = 0.1.
  for (double p : {0.1, 0.5}) {
    const Shape shape = {4, 8, 512, 64};
    const Tensor q = random_input(shape, 5, DType::bf16, -1, 1, false).to(gpu());
    const Tensor mask = kernel_mask(q, q, q, false, p, 99, 12345);
    const double total = static_cast<double>(mask.numel()), kept = ops::sum(mask).item<double>();
    const double sigma = std::sqrt(p * (1.0 - p) / total);
    EXPECT_NEAR(kept / total, 1.0 - p, 6.0 * sigma) << fmt::format("p {}: kept {} of {}", p, kept, total);
    // Two independent Bernoulli masks agree at a fraction p^2 + (1 - p)^2 of positions; a mask
    // repeated across heads, batch entries or rows would agree everywhere.
    const double agree = p * p + (1.0 - p) * (1.0 - p);
    auto agreement = [&](const Tensor& a, const Tensor& b) {
      return 1.0 - ops::mean(ops::abs(ops::sub(a, b))).item<double>();
    };
    const double slack = 0.01;  // ~50 sigma of a fraction over 262144 positions
    EXPECT_NEAR(agreement(mask.select(1, 0), mask.select(1, 1)), agree, slack) << "heads 0 and 1";
    EXPECT_NEAR(agreement(mask.select(0, 0), mask.select(0, 1)), agree, slack) << "batch entries 0 and 1";
    EXPECT_NEAR(agreement(mask.narrow(2, 0, 256), mask.narrow(2, 256, 256)), agree, slack) << "rows i and i + 256";
    EXPECT_NEAR(agreement(mask.narrow(3, 0, 256), mask.narrow(3, 256, 256)), agree, slack) << "columns j and j + 256";
  }
}

TEST(AttentionDropoutGpu, OneSeedOneMask) {
  COLOSSAL_REQUIRE_GPU();
  EngineOn engine;
  const Shape shape = {2, 4, 256, 64};
  const Tensor q = random_input(shape, 6, DType::bf16, -1.5, 1.5, false).to(gpu());
  const Tensor k = random_input(shape, 7, DType::bf16, -1.5, 1.5, false).to(gpu());
  const Tensor v = random_input(shape, 8, DType::bf16, -1, 1, false).to(gpu());
  auto run = [&](core::Generator& generator) {
    return ops::scaled_dot_product_attention(q, k, v, {.causal = true, .dropout_p = kP, .generator = &generator})
        .to(core::kCpu);
  };
  core::Generator first(42), again(42), other(43);
  const Tensor a = run(first), b = run(again), c = run(other), d = run(first);  // d: first's next offset
  expect_close(b, a, 0, 0, "the same seed twice");
  EXPECT_GT(max_abs(ops::sub(c.to(DType::f64), a.to(DType::f64))), 0.05) << "another seed";
  EXPECT_GT(max_abs(ops::sub(d.to(DType::f64), a.to(DType::f64))), 0.05) << "the next offset of one generator";
  const Tensor mask_a = kernel_mask(q, k, v, true, kP, 42, 0), mask_c = kernel_mask(q, k, v, true, kP, 43, 0);
  EXPECT_LT(ops::mean(ops::abs(ops::sub(mask_a, mask_c))).item<double>() - 2 * kP * (1 - kP), 0.01);
  EXPECT_GT(ops::mean(ops::abs(ops::sub(mask_a, mask_c))).item<double>(), 0.1) << "seeds 42 and 43 give other masks";
  // Seeds above 2^53 are folded, not truncated: 2^60 and 2^60 + 1 still differ.
  const uint64_t big = uint64_t{1} << 60;
  EXPECT_GT(
      ops::mean(ops::abs(ops::sub(kernel_mask(q, k, v, true, kP, big, 0), kernel_mask(q, k, v, true, kP, big + 1, 0))))
          .item<double>(),
      0.1);

  // The gradients too: the backward draws the forward's mask again from the saved seed and offset.
  auto gradients = [&](uint64_t seed) {
    Tensor ql = q.detach().set_requires_grad(true);
    core::Generator generator(seed);
    const Tensor out =
        ops::scaled_dot_product_attention(ql, k, v, {.causal = true, .dropout_p = kP, .generator = &generator});
    autograd::backward(out, core::ones(out.shape(), TensorOptions(out.dtype(), gpu())));
    return ql.grad().to(core::kCpu);
  };
  // dQ is accumulated in f32 across key tiles (atomically), in an order that may vary: equal to
  // within one bf16 rounding, not necessarily bit for bit. A different mask would miss by far more.
  const testing::Tolerance bf16 = tolerance_for(DType::bf16);
  expect_close(gradients(42), gradients(42), bf16.atol, bf16.rtol, "the same seed's gradients");
  EXPECT_GT(max_abs(ops::sub(gradients(42).to(DType::f64), gradients(43).to(DType::f64))), 0.02);

  // The gradient of a sum arrives broadcast (stride 0), which the kernel cannot read in place: the
  // op hands it a contiguous copy, and the result is the dense ones' gradient.
  Tensor ql = q.detach().set_requires_grad(true);
  core::Generator generator(42);
  autograd::backward(ops::sum(
      ops::scaled_dot_product_attention(ql, k, v, {.causal = true, .dropout_p = kP, .generator = &generator})));
  expect_close(ql.grad().to(core::kCpu), gradients(42), bf16.atol, bf16.rtol, "the gradient of a sum");
}

TEST(AttentionDropoutGpu, PackedQkvOnTheFusedPath) {
  COLOSSAL_REQUIRE_GPU();
  EngineOn engine;
  // GPT-2's call: qkv [B, T, 3 * H * D] read in place. Against scaled_dot_product_attention on the
  // same [B, H, T, D] views and the same generator state: the same mask (a function of (b, h, i, j)).
  const int64_t batch = 2, tokens = 128, heads = 3, head_dim = 64;
  const Tensor qkv_cpu = random_input({batch, tokens, 3 * heads * head_dim}, 9, DType::bf16, -1.5, 1.5, false);
  const Tensor grad_cpu = random_input({batch, tokens, heads * head_dim}, 10, DType::bf16, -1, 1, false);
  for (bool causal : {false, true}) {
    Tensor packed_in = qkv_cpu.to(gpu()).set_requires_grad(true), split_in = qkv_cpu.to(gpu()).set_requires_grad(true);
    core::Generator packed_generator(7), split_generator(7);
    const int64_t calls = ops::cuda::cudnn_attention_counter.load();
    const Tensor packed = ops::packed_qkv_attention(
        packed_in, heads, {.causal = causal, .dropout_p = kP, .generator = &packed_generator});
    autograd::backward(packed, grad_cpu.to(gpu()));
    EXPECT_EQ(ops::cuda::cudnn_attention_counter.load() - calls, 2);
    const Tensor views = split_in.reshape({batch, tokens, 3, heads, head_dim}).permute({2, 0, 3, 1, 4});
    const Tensor split =
        ops::scaled_dot_product_attention(views.select(0, 0), views.select(0, 1), views.select(0, 2),
                                          {.causal = causal, .dropout_p = kP, .generator = &split_generator})
            .transpose(1, 2)
            .reshape({batch, tokens, heads * head_dim});
    autograd::backward(split, grad_cpu.to(gpu()));
    EXPECT_EQ(packed_generator.state(), split_generator.state());
    expect_matches(packed, split.to(core::kCpu).to(DType::f64), DType::bf16, 1.0, "packed output");
    expect_matches(packed_in.grad(), split_in.grad().to(core::kCpu).to(DType::f64), DType::bf16, 1.0, "packed grad");
  }
}

TEST(AttentionDropoutGpu, DeclinedProblemsRunUnfused) {
  COLOSSAL_REQUIRE_GPU();
  EngineOn engine;
  // f32, an odd head dimension and Tq != Tk are not cuDNN's: the op materialises the probabilities
  // and uses ops::dropout, whose mask is the CPU's, so the GPU equals the CPU (a fresh generator per
  // run). The tolerances are attention_gpu_test.cpp's for our kernels' path (2x base for half).
  struct Case {
    Shape q, k;
    DType dtype;
  };
  for (const Case& c :
       {Case{{2, 2, 77, 64}, {2, 2, 77, 64}, DType::f32}, Case{{2, 2, 77, 33}, {2, 2, 77, 33}, DType::bf16},
        Case{{1, 2, 64, 64}, {1, 2, 100, 64}, DType::bf16}}) {
    for (bool causal : {false, true}) {
      const std::string what = fmt::format("q {} k {} causal {} ({})", c.q, c.k, causal, core::dtype_name(c.dtype));
      const int64_t calls = ops::cuda::cudnn_attention_counter.load();
      testing::expect_cuda_matches_cpu(
          {.make_inputs =
               [&](DType d) {
                 return std::vector<Tensor>{random_input(c.q, 11, d, -1.5, 1.5), random_input(c.k, 12, d, -1.5, 1.5),
                                            random_input(c.k, 13, d)};
               },
           .fn =
               [&](const std::vector<Tensor>& in) {
                 core::Generator generator(31);
                 return ops::scaled_dot_product_attention(in[0], in[1], in[2],
                                                          {.causal = causal, .dropout_p = kP, .generator = &generator});
               },
           .tolerance_scale = c.dtype == DType::f32 ? 1.0 : 2.0},
          c.dtype, what);
      EXPECT_EQ(ops::cuda::cudnn_attention_counter.load(), calls) << what;
    }
  }
  // p = 1 drops everything (no kernel is asked: its scale would be infinite).
  const Tensor x = random_input({1, 2, 64, 64}, 14, DType::bf16, -1, 1, false).to(gpu());
  EXPECT_EQ(max_abs(ops::scaled_dot_product_attention(x, x, x, {.dropout_p = 1.0}).to(core::kCpu).to(DType::f64)), 0.0);
}

// Not a check: GPT-2-sized attention, forward + backward, with and without dropout. Run with
// --gtest_also_run_disabled_tests --gtest_filter='*Timing*'.
TEST(AttentionDropoutGpu, DISABLED_Timing) {
  COLOSSAL_REQUIRE_GPU();
  const int64_t batch = 16, tokens = 1024, heads = 12, head_dim = 64;
  const Tensor qkv_data = random_input({batch, tokens, 3 * heads * head_dim}, 15, DType::bf16, -1, 1, false).to(gpu());
  const Tensor grad = random_input({batch, tokens, heads * head_dim}, 16, DType::bf16, -1, 1, false).to(gpu());
  auto time_ms = [&](double p, bool cudnn) {
    ops::cuda::set_cudnn_attention_enabled(cudnn);
    core::Generator generator(1);
    auto step = [&] {
      Tensor qkv = qkv_data.detach().set_requires_grad(true);
      const Tensor out =
          ops::packed_qkv_attention(qkv, heads, {.causal = true, .dropout_p = p, .generator = &generator});
      autograd::backward(out, grad);
    };
    for (int i = 0; i < 3; ++i) step();
    core::cuda::synchronize(gpu());
    const core::Stream stream = core::cuda::current_stream(gpu());
    core::cuda::Event start(true), end(true);
    const int iterations = 20;
    start.record(stream);
    for (int i = 0; i < iterations; ++i) step();
    end.record(stream);
    end.synchronize();
    ops::cuda::set_cudnn_attention_enabled(true);
    return start.elapsed_ms(end) / iterations;
  };
  const double plain = time_ms(0.0, true), fused = time_ms(0.1, true), unfused = time_ms(0.1, false);
  const double own = time_ms(0.0, false);
  std::printf(
      "attention fwd+bwd B%lld H%lld T%lld D%lld bf16 causal (packed qkv): p=0 cuDNN %.3f ms | p=0.1 cuDNN fused %.3f "
      "ms | p=0.1 unfused %.3f ms | p=0 own flash %.3f ms\n",
      static_cast<long long>(batch), static_cast<long long>(heads), static_cast<long long>(tokens),
      static_cast<long long>(head_dim), plain, fused, unfused, own);
}

}  // namespace
}  // namespace colossal
