// CUDA where, gather (and index_select), scatter_add and the index check against the CPU kernels,
// in f32, bf16 and f16, forward and backward: repeated indices (their gradients collide), strided
// and broadcast operands, long rows, integer dtypes, the same out-of-range messages as the CPU, and
// tensors on the wrong device.
//
// Tolerance: zero. where and gather copy elements; scatter_add adds each output element's
// contributions in index order, rounding to the element's dtype after every addition, exactly as
// the CPU kernel does; so every dtype agrees to the bit.
#include <gtest/gtest.h>

#include <cmath>

#include "colossal/ops/indexing_kernels.h"  // stubs, for kernel-level bad input
#include "gpu_compare.h"

namespace colossal {
namespace {

using testing::expect_close;
using testing::expect_cuda_matches_cpu;
using testing::random_input;

constexpr DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};
/// tolerance_scale 0: see the file comment.
constexpr double kExact = 0.0;

Device gpu() {
  return core::cuda_device(0);
}

/// Indices uniform in [0, size), many repeated (size is small next to the count).
Tensor random_index(const Shape& shape, int64_t size, uint64_t seed, DType dtype = DType::i64) {
  std::vector<double> u = testing::random_tensor(shape, seed, 0.0, 1.0).to_vector<double>();
  std::vector<int64_t> values(u.size());
  for (size_t i = 0; i < u.size(); ++i) values[i] = std::min<int64_t>(size - 1, static_cast<int64_t>(u[i] * size));
  Tensor index = core::from_vector<int64_t>(values, shape);
  return dtype == DType::i64 ? index : index.to(dtype);
}

Tensor random_mask(const Shape& shape, uint64_t seed) {
  return ops::gt(testing::random_tensor(shape, seed), core::zeros({}, DType::f64));
}

void check(const char* name, const std::function<std::vector<Tensor>(DType)>& make_inputs,
           const std::function<Tensor(const std::vector<Tensor>&)>& fn) {
  for (DType dtype : kDtypes) {
    expect_cuda_matches_cpu({.make_inputs = make_inputs, .fn = fn, .tolerance_scale = kExact}, dtype, name);
  }
}

TEST(IndexingGpu, GatherMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  // Dim 0 with 12 picks out of 7 rows per column: the backward scatter collides often.
  check(
      "gather dim 0",
      [](DType d) {
        return std::vector<Tensor>{random_input({7, 33}, 1, d), random_index({12, 33}, 7, 2)};
      },
      [](const std::vector<Tensor>& in) { return ops::gather(in[0], 0, in[1]); });
  // Index smaller than the input outside dim, i32 indices, 3-D.
  check(
      "gather dim 1, 3-D, i32",
      [](DType d) {
        return std::vector<Tensor>{random_input({3, 9, 5}, 3, d), random_index({2, 14, 4}, 9, 4, DType::i32)};
      },
      [](const std::vector<Tensor>& in) { return ops::gather(in[0], 1, in[1]); });
  check(
      "gather from a transposed input",
      [](DType d) {
        return std::vector<Tensor>{random_input({40, 6}, 5, d), random_index({6, 25}, 40, 6)};
      },
      [](const std::vector<Tensor>& in) { return ops::gather(in[0].t(), 1, in[1]); });
  check(
      "gather along a long row",
      [](DType d) {
        return std::vector<Tensor>{random_input({4, 50304}, 7, d), random_index({4, 300}, 50304, 8)};
      },
      [](const std::vector<Tensor>& in) { return ops::gather(in[0], 1, in[1]); });
  check(
      "gather with a broadcast index",
      [](DType d) {
        return std::vector<Tensor>{random_input({5, 8}, 9, d), random_index({1, 11}, 8, 10)};
      },
      [](const std::vector<Tensor>& in) {
        return ops::gather(in[0], 1, in[1].expand({5, 11}));
      });
}

TEST(IndexingGpu, IndexSelectMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  // 50 picks of 20 rows: repeated indices sum their gradients in the backward pass.
  check(
      "index_select dim 0, repeated",
      [](DType d) {
        return std::vector<Tensor>{random_input({20, 37}, 11, d), random_index({50}, 20, 12)};
      },
      [](const std::vector<Tensor>& in) { return ops::index_select(in[0], 0, in[1]); });
  check(
      "index_select dim 1, 3-D, i32",
      [](DType d) {
        return std::vector<Tensor>{random_input({3, 10, 7}, 13, d), random_index({9}, 10, 14, DType::i32)};
      },
      [](const std::vector<Tensor>& in) { return ops::index_select(in[0], 1, in[1]); });
  check(
      "index_select of embedding rows",
      [](DType d) {
        return std::vector<Tensor>{random_input({1000, 64}, 15, d), random_index({513}, 1000, 16)};
      },
      [](const std::vector<Tensor>& in) { return ops::index_select(in[0], 0, in[1]); });
}

TEST(IndexingGpu, ScatterAddMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  // src larger than index (only its leading part is read), gradients for both input and src.
  check(
      "scatter_add dim 0",
      [](DType d) {
        return std::vector<Tensor>{random_input({6, 10}, 21, d), random_index({9, 10}, 6, 22),
                                   random_input({9, 12}, 23, d)};
      },
      [](const std::vector<Tensor>& in) { return ops::scatter_add(in[0], 0, in[1], in[2]); });
  check(
      "scatter_add dim 2, 3-D",
      [](DType d) {
        return std::vector<Tensor>{random_input({2, 3, 5}, 24, d), random_index({2, 3, 17}, 5, 25),
                                   random_input({2, 3, 17}, 26, d)};
      },
      [](const std::vector<Tensor>& in) { return ops::scatter_add(in[0], 2, in[1], in[2]); });
}

TEST(IndexingGpu, ScatterAddIsTheCpuBitForBit) {
  COLOSSAL_REQUIRE_GPU();
  // Thousands of collisions per output element, f32 and i64: the same bits as the CPU, twice.
  Tensor src = random_input({4096, 64}, 31, DType::f32, -1, 1, false);
  Tensor index = random_index({4096, 64}, 5, 32);
  Tensor cpu = ops::scatter_add(core::zeros({5, 64}, DType::f32), 0, index, src);
  for (int run = 0; run < 2; ++run) {
    Tensor out =
        ops::scatter_add(core::zeros({5, 64}, TensorOptions(DType::f32, gpu())), 0, index.to(gpu()), src.to(gpu()));
    expect_close(out.to(core::kCpu), cpu, 0, 0, "scatter_add f32 run " + std::to_string(run));
  }
  Tensor src_i = random_index({300, 7}, 1000, 33);
  Tensor index_i = random_index({300, 7}, 4, 34);
  Tensor cpu_i = ops::scatter_add(core::zeros({4, 7}, DType::i64), 0, index_i, src_i);
  Tensor gpu_i =
      ops::scatter_add(core::zeros({4, 7}, TensorOptions(DType::i64, gpu())), 0, index_i.to(gpu()), src_i.to(gpu()));
  expect_close(gpu_i.to(core::kCpu), cpu_i, 0, 0, "scatter_add i64");
}

TEST(IndexingGpu, WhereMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  // Same-shape contiguous operands: 16-byte path plus an odd tail.
  check(
      "where, contiguous",
      [](DType d) {
        return std::vector<Tensor>{random_input({3, 50305}, 41, d), random_input({3, 50305}, 42, d)};
      },
      [](const std::vector<Tensor>& in) {
        return ops::where(random_mask({3, 50305}, 43).to(in[0].device()), in[0], in[1]);
      });
  // Broadcast condition and a broadcast b: the strided path.
  check(
      "where, broadcast",
      [](DType d) {
        return std::vector<Tensor>{random_input({7, 33}, 44, d), random_input({1}, 45, d)};
      },
      [](const std::vector<Tensor>& in) {
        return ops::where(random_mask({1, 33}, 46).to(in[0].device()), in[0], in[1]);
      });
  check(
      "where, transposed",
      [](DType d) {
        return std::vector<Tensor>{random_input({33, 7}, 47, d), random_input({7, 33}, 48, d)};
      },
      [](const std::vector<Tensor>& in) {
        return ops::where(random_mask({7, 33}, 49).to(in[0].device()), in[0].t(), in[1]);
      });
  check(
      "masked_fill",
      [](DType d) {
        return std::vector<Tensor>{random_input({5, 129}, 50, d)};
      },
      [](const std::vector<Tensor>& in) {
        return ops::masked_fill(in[0], random_mask({129}, 51).to(in[0].device()), -3.5);
      });
  // Integers: i32 values, bool condition, compared directly.
  Tensor a = random_index({4, 1001}, 1 << 20, 52, DType::i32), b = random_index({4, 1001}, 7, 53, DType::i32);
  Tensor c = random_mask({4, 1001}, 54);
  expect_close(ops::where(c.to(gpu()), a.to(gpu()), b.to(gpu())).to(core::kCpu), ops::where(c, a, b), 0, 0,
               "where i32");
}

TEST(IndexingGpu, OutOfRangeIndicesGiveTheCpuMessage) {
  COLOSSAL_REQUIRE_GPU();
  Tensor a = random_input({2, 3}, 61, DType::f32, -1, 1, false);
  auto both = [&](const std::function<void(Device)>& call, const std::string& expected) {
    EXPECT_ERROR_CONTAINS(call(core::kCpu), expected);
    EXPECT_ERROR_CONTAINS(call(gpu()), expected);
  };
  auto idx = [](const std::vector<int64_t>& v, const Shape& s, Device d) {
    return core::from_vector<int64_t>(v, s).to(d);
  };
  both(
      [&](Device d) {
        ops::gather(a.to(d), 1, idx({0, 5}, {1, 2}, d));
      },
      "gather: index 5 at position [0, 1] of index [1, 2] is out of range for dim 1 of size 3 (valid: 0..2)");
  both(
      [&](Device d) {
        ops::index_select(a.to(d), 1, idx({0, 1, -1, 7}, {4}, d));
      },
      "index_select: index -1 at position [2] of index [4]");
  both(
      [&](Device d) {
        ops::scatter_add(a.to(d), 0, idx({1, 2, 0}, {1, 3}, d), a.to(d));
      },
      "scatter_add: index 2 at position [0, 1]");
  // A broadcast index reports its first bad element at position 0 of the broadcast dims.
  both(
      [&](Device d) {
        ops::gather(a.to(d), 1, idx({1, 3, 4}, {1, 3}, d).expand({2, 3}));
      },
      "gather: index 3 at position [0, 1] of index [2, 3]");
  both(
      [&](Device d) {
        ops::gather(a.to(d), 1, idx({1, 3, 4}, {1, 3}, d).to(DType::i32).expand({2, 3}));
      },
      "gather: index 3 at position [0, 1]");
  // The first bad position in row-major order wins, whatever the thread that found it.
  std::vector<int64_t> many(100000, 0);
  for (size_t i = 77777; i < many.size(); i += 3) many[i] = 9;
  both([&](Device d) { ops::index_select(a.to(d), 1, idx(many, {100000}, d)); },
       "index_select: index 9 at position [77777]");
}

TEST(IndexingGpu, MixedDevicesAreAClearError) {
  COLOSSAL_REQUIRE_GPU();
  Tensor a = core::ones({3, 4}, TensorOptions(DType::f32, gpu()));
  Tensor index_cpu = core::zeros({2, 4}, DType::i64);
  EXPECT_ERROR_CONTAINS(ops::gather(a, 0, index_cpu), "gather: index is on cpu but input is on cuda:0");
  EXPECT_ERROR_CONTAINS(ops::index_select(a, 0, core::zeros({2}, DType::i64)),
                        "index_select: index is on cpu but input is on cuda:0");
  EXPECT_ERROR_CONTAINS(ops::scatter_add(a, 0, index_cpu.to(gpu()), core::ones({2, 4})),
                        "scatter_add: src is on cpu but input is on cuda:0");
  EXPECT_ERROR_CONTAINS(ops::where(core::zeros({3, 4}, DType::boolean), a, a),
                        "where: condition is on cpu but the input is on cuda:0");
  // Kernels called directly with a CPU operand name it.
  Tensor out = core::empty({2, 4}, TensorOptions(DType::f32, gpu()));
  EXPECT_ERROR_CONTAINS(ops::gather_stub(gpu(), out, core::ones({3, 4}), 0, index_cpu.to(gpu())),
                        "gather: input is on cpu but the op runs on cuda:0");
  EXPECT_ERROR_CONTAINS(
      ops::where_stub(gpu(), a, core::zeros({3, 4}, TensorOptions(DType::boolean, gpu())), a, core::ones({3, 4})),
      "where: b is on cpu but the op runs on cuda:0");
}

}  // namespace
}  // namespace colossal
