// CUDA scaled_dot_product_attention against the CPU kernel on fresh random inputs: forward output
// and the gradients of q, k and v, in f32/bf16/f16 (and f64 for the simple kernels), causal or
// not, Tq != Tk both ways, lengths that are not multiples of any tile, head dimensions 64 and 128
// (the flash kernels), 40 and 33 (padded to 64; 33 also packed), 160 and 256 (the simple
// kernels), value_dim != head_dim, broadcast heads, a transposed [B, T, H, D] query, a misaligned
// view, and bad input; then the problems cuDNN's fused engine takes, through it (CudnnFusedEngine).
//
// Tolerances (tests/support/gpu_compare.h gives the per-dtype base):
// - f32 and f64 run the simple kernels, which compute as the CPU does in the same precision, in
//   another order: the base tolerance, doubled for the 1024-long rows.
// - bf16/f16 run the flash kernels, which round P (in [0, 1]) to the dtype before P V and dS
//   before dS K / dS^T Q, as every flash kernel does, and take rowsum(dO * O) from the rounded O.
//   Each of those is one rounding (2^-9 bf16, 2^-12 f16 relative) of terms whose absolute sum is
//   about the size of the result, so the errors stay near one output rounding; 2x the base leaves
//   room for the gradients, whose terms partly cancel. The forward alone fits the base tolerance:
//   TailKeysAreMasked checks it there, where a mask error would show.
#include <gtest/gtest.h>

#include <optional>
#include <tuple>
#include <vector>

#include "colossal/ops/cuda/attention_cudnn.h"  // the engine switch and its call counter
#include "gpu_compare.h"

namespace colossal {
namespace {

using testing::DeviceCase;
using testing::expect_cuda_matches_cpu;
using testing::random_input;

const std::vector<DType> kDtypes = {DType::f32, DType::bf16, DType::f16};

struct AttentionCase {
  Shape q, k, v;
  bool causal;
  std::optional<double> scale = std::nullopt;
};

double tolerance_scale(DType dtype) {
  return dtype == DType::bf16 || dtype == DType::f16 ? 2.0 : 1.0;
}

void check(const AttentionCase& c, const std::vector<DType>& dtypes = kDtypes, double extra_scale = 1.0) {
  for (DType dtype : dtypes) {
    const std::string what =
        fmt::format("attention q {} k {} v {} causal {} ({})", c.q, c.k, c.v, c.causal, core::dtype_name(dtype));
    SCOPED_TRACE(what);
    expect_cuda_matches_cpu(
        {.make_inputs =
             [&](DType d) {
               return std::vector<Tensor>{random_input(c.q, 1, d, -1.5, 1.5), random_input(c.k, 2, d, -1.5, 1.5),
                                          random_input(c.v, 3, d)};
             },
         .fn =
             [&](const std::vector<Tensor>& in) {
               return ops::scaled_dot_product_attention(in[0], in[1], in[2], {.causal = c.causal, .scale = c.scale});
             },
         .tolerance_scale = tolerance_scale(dtype) * extra_scale},
        dtype, what);
  }
}

/// q, k and v as they come out of a [B, T, H, D] projection ([2, tokens, 3, 64]), transposed to
/// [B, H, T, D]: rows H * D apart, read in place; a custom scale.
void check_transposed_inputs(DType dtype, int64_t tokens, bool causal, const std::string& what) {
  expect_cuda_matches_cpu({.make_inputs =
                               [=](DType d) {
                                 return std::vector<Tensor>{random_input({2, tokens, 3, 64}, 4, d, -1.5, 1.5),
                                                            random_input({2, tokens, 3, 64}, 5, d, -1.5, 1.5),
                                                            random_input({2, tokens, 3, 64}, 6, d)};
                               },
                           .fn =
                               [=](const std::vector<Tensor>& in) {
                                 return ops::scaled_dot_product_attention(in[0].transpose(1, 2), in[1].transpose(1, 2),
                                                                          in[2].transpose(1, 2),
                                                                          {.causal = causal, .scale = 0.3});
                               },
                           .tolerance_scale = tolerance_scale(dtype)},
                          dtype, what);
}

// Every test but CudnnFusedEngine runs our own kernels: cuDNN's engine would take most of these
// problems (attention_cudnn.h) and leave the flash kernels untested.
class OwnKernelsOnly : public ::testing::Environment {
 public:
  void SetUp() override { ops::cuda::set_cudnn_attention_enabled(false); }
};
[[maybe_unused]] const auto* const kOwnKernelsOnly = ::testing::AddGlobalTestEnvironment(new OwnKernelsOnly);

/// cuDNN's fused engine for one test's scope.
struct CudnnAttentionScope {
  CudnnAttentionScope() { ops::cuda::set_cudnn_attention_enabled(true); }
  ~CudnnAttentionScope() { ops::cuda::set_cudnn_attention_enabled(false); }
};

TEST(AttentionGpu, CudnnFusedEngine) {
  COLOSSAL_REQUIRE_GPU();
  // The same checks against the CPU through cuDNN's engine, which rounds P and dS to the dtype
  // before the second products as the flash kernels do (the same tolerances). Each check runs one
  // forward and one backward per dtype on the GPU, and all of them must have gone to cuDNN.
  CudnnAttentionScope scope;
  const std::vector<DType> half_types = {DType::bf16, DType::f16};
  auto expect_cudnn_calls = [&](const AttentionCase& c, int64_t calls, double extra_scale = 1.0) {
    const int64_t before = ops::cuda::cudnn_attention_counter.load();
    check(c, half_types, extra_scale);
    EXPECT_EQ(ops::cuda::cudnn_attention_counter.load() - before, calls)
        << fmt::format("q {} k {} v {} causal {}", c.q, c.k, c.v, c.causal);
  };
  for (bool causal : {false, true}) {
    expect_cudnn_calls({{2, 3, 128, 64}, {2, 3, 128, 64}, {2, 3, 128, 64}, causal}, 4);
    expect_cudnn_calls({{2, 2, 197, 64}, {2, 2, 197, 64}, {2, 2, 197, 64}, causal}, 4);  // ViT's 197 tokens
    expect_cudnn_calls({{1, 2, 130, 128}, {1, 2, 130, 128}, {1, 2, 130, 128}, causal, 0.2}, 4);
    expect_cudnn_calls({{1, 2, 77, 40}, {1, 2, 77, 40}, {1, 2, 77, 40}, causal}, 4);
  }
  expect_cudnn_calls({{1, 2, 1024, 64}, {1, 2, 1024, 64}, {1, 2, 1024, 64}, true}, 4, 2.0);
  // What the engine does not take runs on our kernels: Tq != Tk, value_dim != head_dim, odd head
  // dimensions, stride-0 (broadcast) heads, f32.
  expect_cudnn_calls({{1, 2, 64, 64}, {1, 2, 200, 64}, {1, 2, 200, 64}, true}, 0);
  expect_cudnn_calls({{2, 2, 77, 64}, {2, 2, 77, 64}, {2, 2, 77, 32}, false}, 0);
  expect_cudnn_calls({{2, 2, 77, 33}, {2, 2, 77, 33}, {2, 2, 77, 33}, false}, 0);
  expect_cudnn_calls({{2, 4, 77, 64}, {2, 1, 77, 64}, {2, 1, 77, 64}, true}, 0);
  const int64_t before_f32 = ops::cuda::cudnn_attention_counter.load();
  check({{2, 3, 77, 64}, {2, 3, 77, 64}, {2, 3, 77, 64}, true}, {DType::f32});
  EXPECT_EQ(ops::cuda::cudnn_attention_counter.load(), before_f32);
  // q, k and v as a [B, T, H, D] projection gives them, transposed: read in place.
  for (DType dtype : half_types) {
    for (bool causal : {false, true}) {
      const int64_t before = ops::cuda::cudnn_attention_counter.load();
      check_transposed_inputs(dtype, 97, causal, "cuDNN attention on transposed inputs");
      EXPECT_EQ(ops::cuda::cudnn_attention_counter.load() - before, 2);
    }
  }
}

TEST(AttentionGpu, FlashHeadDim64) {
  COLOSSAL_REQUIRE_GPU();
  for (bool causal : {false, true}) {
    check({{2, 3, 77, 64}, {2, 3, 77, 64}, {2, 3, 77, 64}, causal});     // one partial tile
    check({{2, 3, 129, 64}, {2, 3, 129, 64}, {2, 3, 129, 64}, causal});  // 128 + 1
    check({{1, 2, 64, 64}, {1, 2, 200, 64}, {1, 2, 200, 64}, causal});   // Tq < Tk
    check({{1, 2, 200, 64}, {1, 2, 70, 64}, {1, 2, 70, 64}, causal});    // Tq > Tk: causal rows that see nothing
  }
}

TEST(AttentionGpu, FlashHeadDim128) {
  COLOSSAL_REQUIRE_GPU();
  for (bool causal : {false, true}) {
    check({{2, 2, 129, 128}, {2, 2, 129, 128}, {2, 2, 129, 128}, causal});
    check({{1, 3, 77, 128}, {1, 3, 150, 128}, {1, 3, 150, 128}, causal});
  }
}

TEST(AttentionGpu, PaddedHeadDims) {
  COLOSSAL_REQUIRE_GPU();
  check({{2, 2, 77, 40}, {2, 2, 77, 40}, {2, 2, 77, 40}, true});      // padded to 64 in place
  check({{2, 2, 77, 33}, {2, 2, 90, 33}, {2, 2, 90, 33}, false});     // odd rows: packed, then padded
  check({{2, 2, 77, 64}, {2, 2, 77, 64}, {2, 2, 77, 32}, true});      // value_dim < head_dim
  check({{1, 2, 100, 24}, {1, 2, 100, 24}, {1, 2, 100, 96}, false});  // value_dim > head_dim, to 128
  check({{1, 2, 65, 64}, {1, 2, 65, 64}, {1, 2, 65, 20}, true});      // value_dim 20: packed v and dO
}

TEST(AttentionGpu, WideHeadsTakeTheSimpleKernels) {
  COLOSSAL_REQUIRE_GPU();
  check({{1, 2, 77, 160}, {1, 2, 77, 160}, {1, 2, 77, 160}, true});
  check({{1, 1, 40, 256}, {1, 1, 50, 256}, {1, 1, 50, 200}, false});
}

TEST(AttentionGpu, Float64) {
  COLOSSAL_REQUIRE_GPU();
  check({{2, 2, 77, 64}, {2, 2, 77, 64}, {2, 2, 77, 64}, true}, {DType::f64});
  check({{1, 2, 33, 256}, {1, 2, 47, 256}, {1, 2, 47, 256}, false}, {DType::f64});  // the largest shared tiles
}

TEST(AttentionGpu, LongCausalRows) {
  COLOSSAL_REQUIRE_GPU();
  // The benchmark's row length: 16 query tiles, causal masking on the diagonal tiles only.
  check({{1, 2, 1024, 64}, {1, 2, 1024, 64}, {1, 2, 1024, 64}, true}, kDtypes, 2.0);
}

TEST(AttentionGpu, BroadcastHeads) {
  COLOSSAL_REQUIRE_GPU();
  // One key/value head shared by four query heads: stride-0 heads, whose gradients sum on the CPU
  // and GPU alike (through sum_to).
  for (bool causal : {false, true}) {
    check({{2, 4, 77, 64}, {2, 1, 77, 64}, {2, 1, 77, 64}, causal});
    check({{2, 4, 50, 33}, {2, 1, 50, 33}, {2, 1, 50, 33}, causal}, {DType::bf16});  // packed from stride 0
  }
}

TEST(AttentionGpu, StridedInputs) {
  COLOSSAL_REQUIRE_GPU();
  // q, k and v as they come out of a [B, T, H, D] projection, transposed to [B, H, T, D]: rows
  // H * D apart, which the flash kernels read in place; a custom scale.
  for (DType dtype : kDtypes) {
    for (bool causal : {false, true}) {
      check_transposed_inputs(dtype, 77, causal, "attention on transposed inputs");
    }
  }
}

TEST(AttentionGpu, PackedQkv) {
  COLOSSAL_REQUIRE_GPU();
  // ops::packed_qkv_attention: q, k, v read from [B, T, 3, H, D], the output written as [B, T, H, D]
  // and the gradient as [B, T, 3, H, D], in place (flash kernels, bf16/f16) or through contiguous
  // buffers (simple kernels, f32). D = 64 and D = 40 (padded, so q, k, v are packed first).
  for (const auto& [heads, head_dim, tokens] : {std::tuple<int64_t, int64_t, int64_t>{3, 64, 77}, {2, 40, 50}}) {
    for (DType dtype : kDtypes) {
      for (bool causal : {false, true}) {
        const std::string what = fmt::format("packed qkv H {} D {} T {} causal {} ({})", heads, head_dim, tokens,
                                             causal, core::dtype_name(dtype));
        SCOPED_TRACE(what);
        expect_cuda_matches_cpu(
            {.make_inputs =
                 [&](DType d) {
                   return std::vector<Tensor>{random_input({2, tokens, 3 * heads * head_dim}, 8, d, -1.5, 1.5)};
                 },
             .fn =
                 [&](const std::vector<Tensor>& in) {
                   return ops::packed_qkv_attention(in[0], heads, {.causal = causal});
                 },
             .tolerance_scale = tolerance_scale(dtype)},
            dtype, what);
      }
    }
  }
}

TEST(AttentionGpu, StridedGradOut) {
  COLOSSAL_REQUIRE_GPU();
  // A transposed output ([B, H, T, D] viewed as [B, T, H, D]) gets its gradient strided: the
  // backward reads it in place.
  for (DType dtype : {DType::bf16, DType::f32}) {
    expect_cuda_matches_cpu(
        {.make_inputs =
             [](DType d) {
               return std::vector<Tensor>{random_input({2, 3, 65, 64}, 9, d, -1.5, 1.5),
                                          random_input({2, 3, 65, 64}, 10, d, -1.5, 1.5),
                                          random_input({2, 3, 65, 64}, 11, d)};
             },
         .fn =
             [](const std::vector<Tensor>& in) {
               return ops::scaled_dot_product_attention(in[0], in[1], in[2], {.causal = true}).transpose(1, 2);
             },
         .tolerance_scale = tolerance_scale(dtype)},
        dtype, "attention with a transposed output");
  }
}

TEST(AttentionGpu, MisalignedView) {
  COLOSSAL_REQUIRE_GPU();
  // Every row of q starts one element into a row of 65: neither 16-byte aligned nor a multiple of
  // 8 apart, so the flash path packs it first.
  for (DType dtype : kDtypes) {
    expect_cuda_matches_cpu({.make_inputs =
                                 [](DType d) {
                                   return std::vector<Tensor>{random_input({2, 2, 77, 65}, 7, d, -1.5, 1.5),
                                                              random_input({2, 2, 77, 64}, 8, d, -1.5, 1.5),
                                                              random_input({2, 2, 77, 64}, 9, d)};
                                 },
                             .fn =
                                 [](const std::vector<Tensor>& in) {
                                   return ops::scaled_dot_product_attention(in[0].narrow(-1, 1, 64), in[1], in[2],
                                                                            {.causal = true});
                                 },
                             .tolerance_scale = tolerance_scale(dtype)},
                            dtype, "attention on a misaligned view");
  }
}

// Values in [0.5, 1.5] make every output about 1, so a key past Tk (zero-filled: score 0, value 0)
// counted with weight exp(0 - max) would pull outputs down by ~1/Tk (~1e-2): ten times f16's
// tolerance. The forward's error model fits the base tolerance (see the top of this file).
TEST(AttentionGpu, TailKeysAreMasked) {
  COLOSSAL_REQUIRE_GPU();
  for (int64_t tk : {77, 129, 200}) {
    for (DType dtype : {DType::f16, DType::bf16}) {
      expect_cuda_matches_cpu(
          {.make_inputs =
               [=](DType d) {
                 return std::vector<Tensor>{random_input({2, 2, 64, 64}, 10, d, -1, 1),
                                            random_input({2, 2, tk, 64}, 11, d, -1, 1),
                                            random_input({2, 2, tk, 64}, 12, d, 0.5, 1.5)};
               },
           .fn = [](const std::vector<Tensor>& in) { return ops::scaled_dot_product_attention(in[0], in[1], in[2]); },
           .check_backward = false},
          dtype, fmt::format("attention with {} keys", tk));
    }
  }
}

TEST(AttentionGpu, BadInput) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  const Tensor q = core::ones({1, 8, 64}, TensorOptions(DType::bf16, gpu));
  EXPECT_ERROR_CONTAINS(ops::scaled_dot_product_attention(q, core::ones({1, 8, 64}, DType::bf16),
                                                          core::ones({1, 8, 64}, TensorOptions(DType::bf16, gpu))),
                        "must be on one device");
  const Tensor wide = core::ones({1, 8, 300}, TensorOptions(DType::bf16, gpu));
  EXPECT_ERROR_CONTAINS(ops::scaled_dot_product_attention(wide, wide, wide), "head dimensions up to 256");
  const Tensor wide_values = core::ones({1, 8, 257}, TensorOptions(DType::f32, gpu));
  const Tensor narrow = core::ones({1, 8, 64}, TensorOptions(DType::f32, gpu));
  EXPECT_ERROR_CONTAINS(ops::scaled_dot_product_attention(narrow, narrow, wide_values), "value_dim 257");
}

}  // namespace
}  // namespace colossal
