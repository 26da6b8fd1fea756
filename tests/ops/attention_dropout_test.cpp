// Attention dropout on the unfused path, the one the CPU always takes (Note [Attention dropout] in
// ops/attention.cpp): scaled_dot_product_attention and packed_qkv_attention with dropout_p equal,
// bit for bit, the composition softmax -> ops::dropout -> matmul drawn from a generator with the same
// seed, and draw one generator offset per call; gradients by finite differences with the mask held
// fixed; p = 0 draws nothing; p = 1 gives zeros; a dropout_p outside [0, 1] is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "gradcheck.h"

namespace colossal {
namespace {

using testing::check_gradients;
using testing::expect_close;
using testing::random_leaf;
using testing::random_tensor;

/// softmax(q k^T * scale + causal mask) -> dropout(p, generator) -> v, spelled out (causal with
/// Tq <= Tk only: every row sees a key).
Tensor composed(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double p, core::Generator& generator) {
  const int64_t tq = q.size(-2), tk = k.size(-2);
  Tensor scores = ops::mul(ops::matmul(q, k.transpose(-2, -1)), 1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  if (causal) {
    std::vector<double> mask(static_cast<size_t>(tq * tk), 0.0);
    for (int64_t i = 0; i < tq; ++i) {
      for (int64_t j = i + (tk - tq) + 1; j < tk; ++j) mask[i * tk + j] = -std::numeric_limits<double>::infinity();
    }
    scores = ops::add(scores, core::from_vector(mask, {tq, tk}, TensorOptions(scores.dtype())));
  }
  return ops::matmul(ops::dropout(ops::softmax(scores, -1), p, true, &generator), v);
}

TEST(AttentionDropout, EqualsTheComposition) {
  struct Case {
    Shape q, k;
    bool causal;
  };
  for (const Case& c : {Case{{2, 3, 9, 8}, {2, 3, 9, 8}, true}, Case{{2, 3, 9, 8}, {2, 3, 9, 8}, false},
                        Case{{1, 2, 5, 8}, {1, 2, 11, 8}, true}, Case{{2, 1, 6, 8}, {2, 1, 4, 8}, false}}) {
    for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
      SCOPED_TRACE(fmt::format("q {} k {} causal {} ({})", c.q, c.k, c.causal, core::dtype_name(dtype)));
      const Tensor q = random_tensor(c.q, 1, -1.5, 1.5, dtype), k = random_tensor(c.k, 2, -1.5, 1.5, dtype);
      const Tensor v = random_tensor(c.k, 3, -1.0, 1.0, dtype);
      core::Generator generator(17), reference_generator(17);
      const Tensor out =
          ops::scaled_dot_product_attention(q, k, v, {.causal = c.causal, .dropout_p = 0.3, .generator = &generator});
      expect_close(out, composed(q, k, v, c.causal, 0.3, reference_generator), 0, 0, "output");
      EXPECT_EQ(generator.state(), reference_generator.state());  // one offset per call, as ops::dropout
      EXPECT_EQ(generator.state().offset, 1u);
    }
  }
}

TEST(AttentionDropout, CausalRowsThatSeeNoKeyAreZero) {
  // Tq > Tk: the first Tq - Tk query rows see no key, and come out as 0 (as without dropout).
  const Tensor q = random_tensor({1, 2, 7, 4}, 4), k = random_tensor({1, 2, 3, 4}, 5),
               v = random_tensor({1, 2, 3, 4}, 6);
  core::Generator generator(3);
  const Tensor out =
      ops::scaled_dot_product_attention(q, k, v, {.causal = true, .dropout_p = 0.2, .generator = &generator});
  expect_close(out.narrow(-2, 0, 4), core::zeros({1, 2, 4, 4}, DType::f64), 0, 0, "rows that see no key");
}

TEST(AttentionDropout, PackedQkvEqualsTheComposition) {
  // [B, T, 3, H, D] split into heads, as multihead_attention did before the op took dropout: the
  // same ops in the same order, so the same bits and the same draw.
  const int64_t batch = 2, tokens = 6, heads = 3, head_dim = 4;
  for (bool causal : {false, true}) {
    const Tensor qkv = random_tensor({batch, tokens, 3 * heads * head_dim}, 7);
    core::Generator generator(5), reference_generator(5);
    const Tensor out =
        ops::packed_qkv_attention(qkv, heads, {.causal = causal, .dropout_p = 0.25, .generator = &generator});
    const Tensor split = qkv.reshape({batch, tokens, 3, heads, head_dim}).permute({2, 0, 3, 1, 4});
    const Tensor expected =
        composed(split.select(0, 0), split.select(0, 1), split.select(0, 2), causal, 0.25, reference_generator)
            .transpose(1, 2)
            .reshape({batch, tokens, heads * head_dim});
    expect_close(out, expected, 0, 0, fmt::format("packed qkv, causal {}", causal));
    EXPECT_EQ(generator.state(), reference_generator.state());
  }
}

TEST(AttentionDropout, ZeroProbabilityDrawsNothing) {
  const Tensor q = random_tensor({1, 2, 5, 8}, 8), k = random_tensor({1, 2, 5, 8}, 9),
               v = random_tensor({1, 2, 5, 8}, 10);
  core::Generator generator(1);
  const Tensor out =
      ops::scaled_dot_product_attention(q, k, v, {.causal = true, .dropout_p = 0.0, .generator = &generator});
  expect_close(out, ops::scaled_dot_product_attention(q, k, v, {.causal = true}), 0, 0, "p = 0");
  EXPECT_EQ(generator.state().offset, 0u);
}

TEST(AttentionDropout, ProbabilityOneGivesZeros) {
  const Tensor q = random_tensor({1, 2, 5, 8}, 11), k = random_tensor({1, 2, 5, 8}, 12),
               v = random_tensor({1, 2, 5, 8}, 13);
  const Tensor out = ops::scaled_dot_product_attention(q, k, v, {.dropout_p = 1.0});
  expect_close(out, core::zeros({1, 2, 5, 8}, DType::f64), 0, 0, "p = 1");
}

TEST(GradCheck, scaled_dot_product_attention_dropout) {
  // A fresh generator per evaluation holds the mask fixed, so the function is smooth in q, k, v.
  for (bool causal : {false, true}) {
    check_gradients({.make_inputs =
                         [] {
                           return std::vector<Tensor>{random_leaf({2, 2, 5, 4}, 14, -1.5, 1.5),
                                                      random_leaf({2, 2, 5, 4}, 15, -1.5, 1.5),
                                                      random_leaf({2, 2, 5, 4}, 16)};
                         },
                     .fn =
                         [causal](const std::vector<Tensor>& in) {
                           core::Generator generator(21);
                           return ops::scaled_dot_product_attention(
                               in[0], in[1], in[2], {.causal = causal, .dropout_p = 0.4, .generator = &generator});
                         }});
  }
}

TEST(GradCheck, packed_qkv_attention_dropout) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 4, 3 * 2 * 4}, 17, -1.5, 1.5)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         core::Generator generator(22);
                         return ops::packed_qkv_attention(in[0], 2,
                                                          {.causal = true, .dropout_p = 0.3, .generator = &generator});
                       }});
}

TEST(AttentionDropout, BadProbability) {
  const Tensor x = random_tensor({1, 1, 4, 8}, 18);
  for (double p : {-0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_ERROR_CONTAINS(ops::scaled_dot_product_attention(x, x, x, {.dropout_p = p}), "dropout_p must be in [0, 1]");
    EXPECT_ERROR_CONTAINS(ops::packed_qkv_attention(random_tensor({1, 4, 24}, 19), 2, {.dropout_p = p}),
                          "dropout_p must be in [0, 1]");
  }
}

}  // namespace
}  // namespace colossal
