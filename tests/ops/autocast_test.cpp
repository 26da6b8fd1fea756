// Autocast: inside AutocastGuard(f16 / bf16) the matrix-product ops compute in the 16-bit dtype from
// f32 operands (exactly the result of casting the operands first), the range-sensitive ops compute
// in f32 from 16-bit inputs, gradients reach f32 parameters in f32, and the guard is per thread and
// restores what it replaced.
#include "colossal/ops/autocast.h"

#include <gtest/gtest.h>

#include <thread>

#include "colossal/autograd/engine.h"
#include "colossal/core/error.h"
#include "colossal/core/random.h"
#include "colossal/ops.h"

namespace colossal::ops {
namespace {

Tensor random(const Shape& shape, uint64_t seed, bool requires_grad = false) {
  core::Generator gen(seed);
  Tensor t = core::rand(shape, DType::f32, &gen);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

std::vector<float> values(const Tensor& t) {
  return t.to(DType::f32).to_vector<float>();
}

TEST(Autocast, MatrixProductsComputeInTheGuardsDtype) {
  const Tensor x = random({4, 8}, 1), w = random({6, 8}, 2), b = random({6}, 3);
  for (const DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(core::dtype_name(dtype));
    Tensor y, expected = linear(x.to(dtype), w.to(dtype), b.to(dtype));
    {
      const AutocastGuard guard(dtype);
      y = linear(x, w, b);
      EXPECT_EQ(matmul(x, w.transpose(0, 1)).dtype(), dtype);
      EXPECT_EQ(bmm(x.reshape({1, 4, 8}), w.transpose(0, 1).reshape({1, 8, 6})).dtype(), dtype);
      EXPECT_EQ(linear_gelu(x, w, b).dtype(), dtype);
      EXPECT_EQ(gelu_mlp(x, w, b, w.transpose(0, 1), random({8}, 8)).dtype(), dtype);
      const Tensor image = random({1, 2, 5, 5}, 4), kernel = random({3, 2, 3, 3}, 5);
      EXPECT_EQ(conv2d(image, kernel).dtype(), dtype);
      const Tensor q = random({1, 2, 4, 8}, 6);
      EXPECT_EQ(scaled_dot_product_attention(q, q, q).dtype(), dtype);
    }
    EXPECT_EQ(y.dtype(), dtype);
    EXPECT_EQ(values(y), values(expected));
    EXPECT_EQ(linear(x, w, b).dtype(), DType::f32) << "the guard did not restore f32";
  }
}

TEST(Autocast, RangeSensitiveOpsComputeInF32) {
  const AutocastGuard guard(DType::f16);
  const Tensor h = random({4, 6}, 7).to(DType::f16);
  EXPECT_EQ(softmax(h, -1).dtype(), DType::f32);
  EXPECT_EQ(log_softmax(h, -1).dtype(), DType::f32);
  EXPECT_EQ(layer_norm(h, {6}, core::ones({6}), core::zeros({6})).dtype(), DType::f32);
  const Tensor labels = core::from_vector<int64_t>({0, 1, 2, 3}, {4});
  const Tensor loss = cross_entropy(h, labels);
  EXPECT_EQ(loss.dtype(), DType::f32);
  {
    const AutocastGuard off(std::nullopt);
    EXPECT_FLOAT_EQ(loss.item<float>(), cross_entropy(h.to(DType::f32), labels).item<float>());
  }
  // f32 and f64 inputs are left alone.
  EXPECT_EQ(softmax(core::rand({2, 3}, DType::f64), -1).dtype(), DType::f64);
}

// A two-layer network under autocast: the parameters stay f32 and get f32 gradients close to the f32
// network's (f16 keeps 11 significant bits: a few units of 2^-11 relative per product, summed over 8
// to 16 terms, stays under 1e-2 relative by norm).
TEST(Autocast, GradientsReachF32ParametersInF32) {
  const Tensor x = random({8, 8}, 11);
  const auto run = [&](bool autocast, Tensor& w1, Tensor& w2) {
    std::optional<AutocastGuard> guard;
    if (autocast) guard.emplace(DType::f16);
    const Tensor hidden = gelu(linear(x, w1));
    const Tensor out = linear(hidden, w2);
    const Tensor loss = cross_entropy(out, core::from_vector<int64_t>({0, 1, 2, 0, 1, 2, 0, 1}, {8}));
    autograd::backward(loss);
    return loss.item<double>();
  };
  Tensor a1 = random({16, 8}, 12, true), a2 = random({3, 16}, 13, true);
  Tensor b1 = random({16, 8}, 12, true), b2 = random({3, 16}, 13, true);
  const double mixed = run(true, a1, a2), reference = run(false, b1, b2);
  EXPECT_NEAR(mixed, reference, 1e-2 * std::abs(reference));
  for (const auto& [got, want] : {std::pair{a1, b1}, std::pair{a2, b2}}) {
    ASSERT_EQ(got.grad().dtype(), DType::f32);
    const std::vector<float> g = values(got.grad()), r = values(want.grad());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      diff += (g[i] - r[i]) * (g[i] - r[i]);
      norm += r[i] * r[i];
    }
    EXPECT_LT(std::sqrt(diff / norm), 1e-2);
    EXPECT_GT(std::sqrt(diff / norm), 0.0) << "no 16-bit rounding at all: autocast did nothing";
  }
}

// A class token (f32 parameter) beside f16 patch embeddings: cat promotes under autocast only.
TEST(Autocast, CatPromotesMixedDtypesUnderAutocastOnly) {
  const Tensor token = random({1, 4}, 21), patches = random({3, 4}, 22).to(DType::f16);
  EXPECT_THROW(cat({token, patches}, 0), Error);
  const AutocastGuard guard(DType::f16);
  const Tensor joined = cat({token, patches}, 0);
  EXPECT_EQ(joined.dtype(), DType::f32);
  EXPECT_EQ(joined.shape(), (Shape{4, 4}));
  EXPECT_EQ(values(joined.narrow(0, 1, 3)), values(patches));
}

TEST(Autocast, GuardsNestPerThreadAndRejectOtherDtypes) {
  EXPECT_FALSE(autocast_dtype().has_value());
  {
    const AutocastGuard outer(DType::bf16);
    {
      const AutocastGuard inner(DType::f16);
      EXPECT_EQ(autocast_dtype(), DType::f16);
      std::optional<DType> seen = DType::f32;
      std::thread([&] { seen = autocast_dtype(); }).join();
      EXPECT_FALSE(seen.has_value()) << "autocast leaked into another thread";
    }
    EXPECT_EQ(autocast_dtype(), DType::bf16);
  }
  EXPECT_FALSE(autocast_dtype().has_value());
  EXPECT_THROW(AutocastGuard{DType::f64}, Error);
}

}  // namespace
}  // namespace colossal::ops
