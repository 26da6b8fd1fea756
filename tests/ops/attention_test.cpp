// scaled_dot_product_attention: gradient checks (causal or not, Tq != Tk, broadcast heads, strided
// inputs), values derived by hand, agreement with a reference composed of matmul and softmax,
// f32/half agreement with f64, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>

#include "gradcheck.h"

namespace colossal {
namespace {

using testing::check_gradients;
using testing::expect_close;
using testing::expect_values;
using testing::random_leaf;
using testing::random_tensor;

ops::AttentionOptions options(bool causal, std::optional<double> scale = std::nullopt) {
  return {.causal = causal, .scale = scale};
}

/// softmax(q k^T * scale + mask) v from matmul, softmax and an additive -inf mask (bottom-right
/// aligned when causal). Rows that see no key come out as 0, like the fused kernel.
Tensor reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  const int64_t tq = q.size(-2), tk = k.size(-2);
  Tensor scores = ops::mul(ops::matmul(q, k.transpose(-1, -2)), scale);
  if (!causal) return ops::matmul(ops::softmax(scores, -1), v);
  std::vector<double> mask(static_cast<size_t>(tq * tk)), row_visible(static_cast<size_t>(tq));
  for (int64_t i = 0; i < tq; ++i) {
    row_visible[i] = i + (tk - tq) >= 0 ? 1.0 : 0.0;
    for (int64_t j = 0; j < tk; ++j) {
      // A fully masked row gets a zero mask and is zeroed below instead (softmax of -inf is nan).
      mask[i * tk + j] = j <= i + (tk - tq) || row_visible[i] == 0 ? 0.0 : -std::numeric_limits<double>::infinity();
    }
  }
  Tensor probs = ops::softmax(ops::add(scores, core::from_vector(mask, {tq, tk}).to(q.dtype())), -1);
  probs = ops::mul(probs, core::from_vector(row_visible, {tq, 1}).to(q.dtype()));
  return ops::matmul(probs, v);
}

struct AttentionCase {
  Shape q, k, v;
  bool causal;
};

void check_attention_gradients(const AttentionCase& c) {
  SCOPED_TRACE(fmt::format("q {} k {} v {} causal {}", c.q, c.k, c.v, c.causal));
  check_gradients({.make_inputs =
                       [=] {
                         return std::vector<Tensor>{random_leaf(c.q, 1, -1.5, 1.5), random_leaf(c.k, 2, -1.5, 1.5),
                                                    random_leaf(c.v, 3)};
                       },
                   .fn =
                       [=](const std::vector<Tensor>& in) {
                         return ops::scaled_dot_product_attention(in[0], in[1], in[2], options(c.causal));
                       }});
}

TEST(GradCheck, scaled_dot_product_attention) {
  check_attention_gradients({{2, 3, 4}, {2, 5, 4}, {2, 5, 3}, false});  // Tq < Tk, Dv != D
  check_attention_gradients({{2, 4, 3}, {2, 4, 3}, {2, 4, 2}, true});   // square causal
  check_attention_gradients({{1, 3, 4}, {1, 5, 4}, {1, 5, 2}, true});   // causal, Tq < Tk
  check_attention_gradients({{1, 5, 2}, {1, 3, 2}, {1, 3, 2}, true});   // causal, first rows see nothing
}
TEST(GradCheck, scaled_dot_product_attention_broadcast_heads) {
  // One key/value head shared by two query heads: its gradient sums over them.
  check_attention_gradients({{2, 2, 3, 4}, {2, 1, 4, 4}, {2, 1, 4, 3}, false});
}
TEST(GradCheck, scaled_dot_product_attention_strided_inputs) {
  // q as it comes out of a [B, T, H, D] projection transposed to [B, H, T, D], with a custom scale.
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({1, 3, 2, 4}, 4), random_leaf({1, 2, 3, 4}, 5),
                                                    random_leaf({1, 2, 3, 4}, 6)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         return ops::scaled_dot_product_attention(in[0].transpose(1, 2), in[1], in[2],
                                                                  options(true, 0.7));
                       }});
}

TEST(GradCheck, packed_qkv_attention) {
  // qkv [B, T, 3 * H * D] with H = 2, D = 3; causal and not, and a custom scale.
  for (bool causal : {false, true}) {
    SCOPED_TRACE(fmt::format("causal {}", causal));
    check_gradients({.make_inputs =
                         [] {
                           return std::vector<Tensor>{random_leaf({2, 4, 18}, 7, -1.5, 1.5)};
                         },
                     .fn =
                         [=](const std::vector<Tensor>& in) {
                           return ops::packed_qkv_attention(in[0], 2, {.causal = causal, .scale = 0.6});
                         }});
  }
}

/// The unfused form of packed_qkv_attention: split qkv into heads, attend, merge.
Tensor split_attend_merge(const Tensor& qkv, int64_t heads, bool causal) {
  const int64_t b = qkv.size(0), t = qkv.size(1), c = qkv.size(2) / 3, d = c / heads;
  const Tensor split = qkv.reshape({b, t, 3, heads, d}).permute({2, 0, 3, 1, 4});
  const Tensor out =
      ops::scaled_dot_product_attention(split.select(0, 0), split.select(0, 1), split.select(0, 2), options(causal));
  return out.transpose(1, 2).reshape({b, t, c});
}

TEST(Attention, PackedQkvEqualsSplitAttendMerge) {
  // The same kernel on the same strided q, k, v; only where the output and gradient land differs,
  // so forward and backward agree exactly.
  for (bool causal : {false, true}) {
    auto run = [&](bool packed) {
      Tensor qkv = random_tensor({3, 7, 3 * 4 * 5}, 50, -2, 2);
      qkv.set_requires_grad(true);
      Tensor out = packed ? ops::packed_qkv_attention(qkv, 4, options(causal)) : split_attend_merge(qkv, 4, causal);
      autograd::backward(out, random_tensor(out.shape(), 51));
      return std::pair{out.detach(), qkv.grad()};
    };
    const auto [out, grad] = run(true);
    const auto [ref_out, ref_grad] = run(false);
    EXPECT_EQ(out.shape(), (Shape{3, 7, 20}));
    expect_close(out, ref_out, 0, 0, fmt::format("output, causal {}", causal));
    expect_close(grad, ref_grad, 0, 0, fmt::format("qkv gradient, causal {}", causal));
  }
}

TEST(Attention, PackedQkvBadInput) {
  const Tensor qkv = random_tensor({2, 5, 18}, 1);
  EXPECT_THROW(
      {
        try {
          ops::packed_qkv_attention(qkv, 4);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("not 3 * num_heads (4) * head_dim"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  EXPECT_THROW(ops::packed_qkv_attention(random_tensor({5, 18}, 1), 2), Error);
  EXPECT_THROW(ops::packed_qkv_attention(qkv, 0), Error);
}

TEST(Attention, KnownValues) {
  // One query, keys with scores 0 and ln 3 (scale 1): probabilities [1/4, 3/4], so the output is
  // 1/4 * [4, 0] + 3/4 * [8, 4] = [7, 3].
  Tensor q = core::from_vector<double>({1}, {1, 1});
  Tensor k = core::from_vector<double>({0, std::log(3.0)}, {2, 1});
  Tensor v = core::from_vector<double>({4, 0, 8, 4}, {2, 2});
  // f64 exp/log of O(1) numbers: a few ulp; 1e-14 is margin.
  expect_values(ops::scaled_dot_product_attention(q, k, v, options(false, 1.0)), {7, 3}, 1e-14);
  // Causal with Tq = Tk = 2 and all-zero scores: row 0 sees key 0 only (v[0] = 1), row 1 averages
  // both keys ((1 + 3) / 2 = 2).
  Tensor q2 = core::from_vector<double>({0.5, -0.5}, {2, 1});
  Tensor k2 = core::from_vector<double>({0, 0}, {2, 1});
  Tensor v2 = core::from_vector<double>({1, 3}, {2, 1});
  expect_values(ops::scaled_dot_product_attention(q2, k2, v2, options(true)), {1, 2}, 1e-14);
  // Causal with Tq = 3 > Tk = 2: query 0 sees no key (output 0), query 1 sees key 0, query 2 both.
  Tensor q3 = core::from_vector<double>({1, 2, 3}, {3, 1});
  expect_values(ops::scaled_dot_product_attention(q3, k2, v2, options(true)), {0, 1, 2}, 1e-14);
}

TEST(Attention, MatchesComposedReference) {
  for (bool causal : {false, true}) {
    for (const auto& [tq, tk] : {std::pair<int64_t, int64_t>{5, 5}, {3, 6}, {6, 4}}) {
      Tensor q = random_tensor({2, 3, tq, 8}, 10, -2, 2);
      Tensor k = random_tensor({2, 3, tk, 8}, 11, -2, 2);
      Tensor v = random_tensor({2, 3, tk, 5}, 12);
      const double scale = 1.0 / std::sqrt(8.0);
      // Both in f64 over O(1) values and at most 8-term dot products: rounding ~1e-15; 1e-12 is margin.
      expect_close(ops::scaled_dot_product_attention(q, k, v, options(causal)),
                   reference_attention(q, k, v, causal, scale), 1e-12, 0,
                   fmt::format("causal {} tq {} tk {}", causal, tq, tk));
    }
  }
}

TEST(Attention, ManyHeadsMatchComposedReference) {
  // 64 (batch, head) problems with Tq = Tk: every head's buffers are reused for the next.
  auto run = [](bool fused) {
    Tensor q = random_tensor({4, 16, 8, 16}, 40, -2, 2), k = random_tensor({4, 16, 8, 16}, 41, -2, 2);
    Tensor v = random_tensor({4, 16, 8, 16}, 42);
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
    Tensor out =
        fused ? ops::scaled_dot_product_attention(q, k, v, options(true)) : reference_attention(q, k, v, true, 0.25);
    autograd::backward(out, random_tensor(out.shape(), 43));
    return std::vector<Tensor>{out.detach(), q.grad(), k.grad(), v.grad()};
  };
  const auto fused = run(true), reference = run(false);
  for (size_t i = 0; i < fused.size(); ++i) {
    // f64 throughout, O(1) values, 16-term dot products: 1e-12 is far above rounding.
    expect_close(fused[i], reference[i], 1e-12, 0, fmt::format("output {}", i));
  }
}

TEST(Attention, GradientsMatchComposedReference) {
  // A larger case than the gradient checks, through autograd of the composed reference.
  auto grads = [](bool fused) {
    Tensor q = random_tensor({2, 6, 8}, 20, -2, 2), k = random_tensor({2, 9, 8}, 21, -2, 2);
    Tensor v = random_tensor({2, 9, 4}, 22);
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
    Tensor out = fused ? ops::scaled_dot_product_attention(q, k, v, options(true))
                       : reference_attention(q, k, v, true, 1.0 / std::sqrt(8.0));
    autograd::backward(out, random_tensor(out.shape(), 23));
    return std::vector<Tensor>{q.grad(), k.grad(), v.grad()};
  };
  const auto fused = grads(true), reference = grads(false);
  for (size_t i = 0; i < 3; ++i) {
    // f64 throughout, O(1) values: 1e-12 leaves three orders above rounding.
    expect_close(fused[i], reference[i], 1e-12, 0, fmt::format("gradient {}", i));
  }
}

TEST(Attention, F32AndHalfAgreeWithF64) {
  Tensor q = random_tensor({2, 7, 16}, 30, -2, 2), k = random_tensor({2, 7, 16}, 31, -2, 2);
  Tensor v = random_tensor({2, 7, 16}, 32);
  const Tensor reference = ops::scaled_dot_product_attention(q, k, v, options(true));
  // f32: scores are 16-term dot products (error ~1e-6 relative), outputs convex combinations of
  // values in [-1, 1]; 1e-5 covers the propagated error.
  expect_close(ops::scaled_dot_product_attention(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), options(true)),
               reference, 1e-5, 0, "f32");
  for (DType dtype : {DType::f16, DType::bf16}) {
    Tensor qh = q.to(dtype), kh = k.to(dtype), vh = v.to(dtype);
    // Against f64 on the same rounded inputs, computed in f32, only the output rounding remains:
    // |out| <= 1, so 2^-11 (f16) or a whole bf16 ulp 2^-8 bounds it.
    const double tolerance = dtype == DType::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    Tensor out = ops::scaled_dot_product_attention(qh, kh, vh, options(true));
    EXPECT_EQ(out.dtype(), dtype);
    expect_close(
        out, ops::scaled_dot_product_attention(qh.to(DType::f64), kh.to(DType::f64), vh.to(DType::f64), options(true)),
        tolerance, 0, std::string(core::dtype_name(dtype)));
  }
}

TEST(Attention, BadInput) {
  using ops::scaled_dot_product_attention;
  EXPECT_ERROR_CONTAINS(
      scaled_dot_product_attention(core::ones({2, 3, 4}), core::ones({2, 5, 3}), core::ones({2, 5, 3})),
      "q [2, 3, 4] and k [2, 5, 3]");
  EXPECT_ERROR_CONTAINS(
      scaled_dot_product_attention(core::ones({2, 3, 4}), core::ones({2, 5, 4}), core::ones({2, 6, 3})),
      "k [2, 5, 4] and v [2, 6, 3]");
  EXPECT_ERROR_CONTAINS(
      scaled_dot_product_attention(core::ones({2, 3, 4}), core::ones({3, 5, 4}), core::ones({3, 5, 4})),
      "cannot be broadcast");
  EXPECT_ERROR_CONTAINS(scaled_dot_product_attention(core::ones({4}), core::ones({4}), core::ones({4})),
                        "at least 2 dimensions");
  EXPECT_ERROR_CONTAINS(scaled_dot_product_attention(core::ones({3, 4}, DType::i64), core::ones({3, 4}, DType::i64),
                                                     core::ones({3, 4}, DType::i64)),
                        "i64");
  EXPECT_ERROR_CONTAINS(
      scaled_dot_product_attention(core::ones({3, 4}), core::ones({3, 4}, DType::f64), core::ones({3, 4})),
      "share a dtype");
}

}  // namespace
}  // namespace colossal
