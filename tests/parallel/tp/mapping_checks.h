// The checks of Megatron's tensor-parallel mappings (parallel/tp/mappings.h) over any process group,
// shared by the MPI ranks on the CPU (mappings_mpi_test.cpp) and the NCCL ranks on GPUs
// (mappings_multigpu_test.cpp): forward values and hand-derived adjoints against references every rank
// computes from every member's inputs (functions of (rank, index)), and finite differences in f64 of
// scalar losses built from the mappings across ranks. Tensors live on group.device().
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "collective_reference.h"  // make_input, values_equal
#include "colossal/core/view.h"    // permute_raw, contiguous_raw
#include "colossal/ops.h"
#include "colossal/parallel/tp/mappings.h"
#include "gradcheck.h"  // random_tensor

namespace colossal::parallel::tp::mapping_checks {

using comm::ProcessGroup;
using comm::testing::make_input;
using comm::testing::values_equal;

/// t moved to the group's device.
inline Tensor on(const ProcessGroup& group, const Tensor& t) {
  return t.to(group.device());
}

/// The upstream gradient of rank r is input r + kGradientSalt: other values than any rank's input.
constexpr int kGradientSalt = 50;

/// What each mapping computes, written with ops (cat, narrow, add) on every member's f64 tensors:
/// `parts[p]` is group rank p's tensor. The references for forward and for the hand-derived adjoint.
inline Tensor sum_of(const std::vector<Tensor>& parts) {
  Tensor total = parts[0];
  for (size_t p = 1; p < parts.size(); ++p) total = ops::add(total, parts[p]);
  return total;
}
inline Tensor cat_of(const std::vector<Tensor>& parts, int64_t dim) {
  return ops::cat(parts, dim);
}
inline Tensor chunk_of(const Tensor& t, int64_t dim, int rank, int size) {
  const int64_t length = t.size(dim) / size;
  return ops::narrow(t, dim, rank * length, length).contiguous();
}

struct Mapping {
  std::string name;
  std::function<Tensor(const Tensor& x, int64_t dim, ProcessGroup& group)> apply;
  /// Rank `rank`'s output from every member's input.
  std::function<Tensor(const std::vector<Tensor>& inputs, int64_t dim, int rank)> forward;
  /// Rank `rank`'s gradient of x from every member's gradient of the output (Megatron's adjoint).
  std::function<Tensor(const std::vector<Tensor>& grads, int64_t dim, int rank)> backward;
  /// Note [Replicated and per-rank tensors] in mappings.h: whether x, and the output, stand for one
  /// tensor held by every rank (true) or for one tensor per rank (false).
  bool replicated_input;
  bool replicated_output;
};

inline std::vector<Mapping> all_mappings() {
  auto size_of = [](const std::vector<Tensor>& parts) { return static_cast<int>(parts.size()); };
  return {
      {"copy_to_region", [](const Tensor& x, int64_t, ProcessGroup& g) { return copy_to_region(x, g); },
       [](const std::vector<Tensor>& in, int64_t, int rank) { return in[rank]; },
       [](const std::vector<Tensor>& grads, int64_t, int) { return sum_of(grads); }, true, false},
      {"reduce_from_region", [](const Tensor& x, int64_t, ProcessGroup& g) { return reduce_from_region(x, g); },
       [](const std::vector<Tensor>& in, int64_t, int) { return sum_of(in); },
       [](const std::vector<Tensor>& grads, int64_t, int rank) { return grads[rank]; }, false, true},
      {"scatter_to_region", [](const Tensor& x, int64_t d, ProcessGroup& g) { return scatter_to_region(x, d, g); },
       [=](const std::vector<Tensor>& in, int64_t d, int rank) { return chunk_of(in[rank], d, rank, size_of(in)); },
       [](const std::vector<Tensor>& grads, int64_t d, int) { return cat_of(grads, d); }, true, false},
      {"gather_from_region", [](const Tensor& x, int64_t d, ProcessGroup& g) { return gather_from_region(x, d, g); },
       [](const std::vector<Tensor>& in, int64_t d, int) { return cat_of(in, d); },
       [=](const std::vector<Tensor>& grads, int64_t d, int rank) {
         return chunk_of(grads[rank], d, rank, size_of(grads));
       },
       false, true},
      {"gather_from_sequence_region",
       [](const Tensor& x, int64_t d, ProcessGroup& g) { return gather_from_sequence_region(x, d, g); },
       [](const std::vector<Tensor>& in, int64_t d, int) { return cat_of(in, d); },
       [=](const std::vector<Tensor>& grads, int64_t d, int rank) {
         return chunk_of(sum_of(grads), d, rank, size_of(grads));
       },
       false, false},
      {"reduce_scatter_to_sequence_region",
       [](const Tensor& x, int64_t d, ProcessGroup& g) { return reduce_scatter_to_sequence_region(x, d, g); },
       [=](const std::vector<Tensor>& in, int64_t d, int rank) { return chunk_of(sum_of(in), d, rank, size_of(in)); },
       [](const std::vector<Tensor>& grads, int64_t d, int) { return cat_of(grads, d); }, false, false},
  };
}

/// A 3-d shape whose size along dim is two chunks per rank, so every mapping can split it.
inline Shape shape_for(int64_t dim, int group_size) {
  Shape shape{3, 4, 5};
  shape[static_cast<size_t>(dim < 0 ? dim + 3 : dim)] = 2 * group_size;
  return shape;
}

/// The same values as t in strides reversed, so no dimension is contiguous.
inline Tensor non_contiguous(const Tensor& t) {
  const Tensor reversed = core::contiguous_raw(core::permute_raw(t, {2, 1, 0}));
  Tensor view = core::permute_raw(reversed, {2, 1, 0});
  EXPECT_FALSE(view.is_contiguous());
  return view;
}

inline std::vector<double> values_of(const Tensor& t) {
  return t.contiguous().to(core::kCpu).to(DType::f64).to_vector<double>();
}

/// Every member's f64 input (or upstream gradient, with a salt) of `shape`: each rank computes all of
/// them, so the references need no communication. Values are halves in [-8, 8.5] whose sums over four
/// ranks are exact in every dtype (tests/support/collective_reference.h), so comparisons are exact.
inline std::vector<Tensor> members_tensors(const ProcessGroup& group, const Shape& shape, int salt) {
  std::vector<Tensor> out;
  for (int global_rank : group.global_ranks()) out.push_back(make_input(DType::f64, global_rank + salt, shape));
  return out;
}

/// One mapping at one dtype, dim and layout: forward values, then backward from an upstream gradient
/// that differs per rank, both against the references.
inline void check_forward_and_backward(const Mapping& m, ProcessGroup& group, DType dtype, int64_t dim,
                                       bool contiguous) {
  SCOPED_TRACE(m.name + " " + std::string(core::dtype_name(dtype)) + " dim " + std::to_string(dim) +
               (contiguous ? " contiguous" : " strided") + " over " + group.describe());
  const int me = group.rank();
  const Shape shape = shape_for(dim, group.size());
  const int64_t d = dim < 0 ? dim + 3 : dim;
  const std::vector<Tensor> inputs = members_tensors(group, shape, 0);
  Tensor x = inputs[static_cast<size_t>(me)].to(dtype).to(group.device());
  if (!contiguous) x = non_contiguous(x);
  x.set_requires_grad(true);

  const Tensor y = m.apply(x, dim, group);
  const Tensor expected_y = m.forward(inputs, d, me);
  ASSERT_EQ(y.shape(), expected_y.shape());
  EXPECT_EQ(y.dtype(), dtype);
  EXPECT_TRUE(values_equal(y, values_of(expected_y)));

  const std::vector<Tensor> grads = members_tensors(group, expected_y.shape(), kGradientSalt);
  const Tensor upstream = grads[static_cast<size_t>(me)].to(dtype).to(group.device());
  autograd::backward(y, upstream);
  const Tensor expected_grad = m.backward(grads, d, me);
  ASSERT_TRUE(x.grad().defined());
  ASSERT_EQ(x.grad().shape(), shape);
  EXPECT_EQ(x.grad().dtype(), dtype);
  EXPECT_TRUE(values_equal(x.grad(), values_of(expected_grad)));
  // Neither the input nor the caller's gradient may serve as a collective's buffer.
  EXPECT_TRUE(values_equal(x, values_of(inputs[static_cast<size_t>(me)])));
  EXPECT_TRUE(values_equal(upstream, values_of(grads[static_cast<size_t>(me)])));
}

inline void check_all(ProcessGroup& group) {
  for (const Mapping& m : all_mappings()) {
    for (DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
      for (int64_t dim : {0, 1, -1}) {
        for (bool contiguous : {true, false}) check_forward_and_backward(m, group, dtype, dim, contiguous);
      }
    }
  }
}

// ---- finite differences

/// Sum over the group of every rank's `local` (a one-element f64 tensor), as a double.
inline double sum_over_group(const Tensor& local, ProcessGroup& group) {
  Tensor total = local.detach().contiguous().clone();
  group.all_reduce(total);
  return total.item<double>();
}

/// The loss of Note [Replicated and per-rank tensors] for an output y: sum(w * y * y), where w is the
/// same on every rank when y is replicated (the loss counts the one y once), and differs per rank
/// otherwise (the loss is the sum of every rank's term). Returns this rank's term, differentiable.
inline Tensor local_loss(const Tensor& y, const Tensor& w) {
  return ops::sum(ops::mul(w, ops::mul(y, y)));
}

/// How far to step and how close the central difference must come (relative to 1 + |dL/dv|).
struct Differencing {
  double eps;
  double tolerance;
};
/// f a mapping alone: L is quadratic in x (the mappings are linear), so central differences have no
/// truncation error and only rounding remains: |L| ~ 1e2 in f64 (ulp ~ 1e-14) over eps = 1e-3 is
/// ~1e-11, and 1e-8 leaves three orders of margin; a wrong adjoint is off by O(1).
constexpr Differencing kQuadratic{1e-3, 1e-8};
/// f with tanh inside: truncation eps^2 / 6 * |L'''| (~1e-10 * O(10) at eps = 1e-5) and rounding
/// ulp(L) / eps (~1e-15 / 1e-5 = 1e-10) stay near 1e-9, and 1e-7 leaves two orders of margin.
constexpr Differencing kSmooth{1e-5, 1e-7};

/// Checks the gradient of L(x) = loss(f(x)) across ranks against central differences along random
/// directions (each rank perturbs its own x; replicated inputs are perturbed alike on every rank).
inline void check_finite_differences(const std::string& name, ProcessGroup& group, const Shape& shape,
                                     bool replicated_input, bool replicated_output, Differencing differencing,
                                     const std::function<Tensor(const Tensor&)>& f) {
  SCOPED_TRACE(name + " over " + group.describe());
  const int me = group.rank();
  // Replicated tensors are seeded alike on every rank; per-rank ones by rank.
  const uint64_t input_seed = replicated_input ? 0 : static_cast<uint64_t>(me + 1);
  const Tensor x0 = on(group, colossal::testing::random_tensor(shape, 100 + input_seed));
  Tensor x = x0.clone().set_requires_grad(true);
  const Tensor y = f(x);
  const Tensor w = on(group, colossal::testing::random_tensor(
                                 y.shape(), 200 + (replicated_output ? 0 : static_cast<uint64_t>(me + 1))));
  auto total_loss = [&](const Tensor& local) {
    return replicated_output ? local.item<double>() : sum_over_group(local, group);
  };
  autograd::backward(local_loss(y, w));
  ASSERT_TRUE(x.grad().defined());

  const double eps = differencing.eps;
  for (uint64_t direction = 0; direction < 3; ++direction) {
    const Tensor v = on(group, colossal::testing::random_tensor(shape, 300 + 10 * direction + input_seed));
    double plus = 0.0;
    double minus = 0.0;
    {
      autograd::NoGradGuard no_grad;
      plus = total_loss(local_loss(f(ops::add(x0, v, eps)), w));
      minus = total_loss(local_loss(f(ops::add(x0, v, -eps)), w));
    }
    const double numeric = (plus - minus) / (2 * eps);
    // dL/dx . v: a replicated x is one tensor, whose gradient every rank holds; per-rank x's are
    // one each, so their terms add up over the group.
    const Tensor local_directional = ops::sum(ops::mul(x.grad(), v));
    const double analytic =
        replicated_input ? local_directional.item<double>() : sum_over_group(local_directional, group);
    EXPECT_NEAR(analytic, numeric, differencing.tolerance * (1.0 + std::abs(numeric))) << "direction " << direction;
  }
}

/// Finite differences of each mapping alone, along dims 0, 1 and -1.
inline void check_finite_differences_of_each_mapping(ProcessGroup& group) {
  for (const Mapping& m : all_mappings()) {
    for (int64_t dim : {0, 1, -1}) {
      check_finite_differences(m.name + " dim " + std::to_string(dim), group, shape_for(dim, group.size()),
                               m.replicated_input, m.replicated_output, kQuadratic,
                               [&](const Tensor& x) { return m.apply(x, dim, group); });
    }
  }
}

/// Finite differences through the patterns the layers build: f and g around per-rank work, scatter
/// and gather, and the sequence-parallel pair.
inline void check_finite_differences_of_megatron_blocks(ProcessGroup& group) {
  const int me = group.rank();
  // Each rank's own "weights": what a column- or row-sharded layer holds.
  const Tensor w_rank = on(group, colossal::testing::random_tensor({3, 4, 5}, 400 + static_cast<uint64_t>(me)));
  // The MLP pattern: a replicated input enters the region (f), each rank works on it with its own
  // weights, and the partial results leave it summed (g).
  check_finite_differences("copy, per-rank tanh, reduce", group, {3, 4, 5}, true, true, kSmooth, [&](const Tensor& x) {
    return reduce_from_region(ops::tanh(ops::mul(copy_to_region(x, group), w_rank)), group);
  });
  // Split a replicated activation, transform each chunk, gather it back.
  const Shape split_shape = shape_for(-1, group.size());
  const Tensor w_chunk = on(group, colossal::testing::random_tensor({3, 4, 2}, 500 + static_cast<uint64_t>(me)));
  check_finite_differences(
      "scatter, per-rank tanh, gather", group, split_shape, true, true, kSmooth, [&](const Tensor& x) {
        return gather_from_region(ops::tanh(ops::mul(scatter_to_region(x, -1, group), w_chunk)), -1, group);
      });
  // Sequence parallelism: sequence shards gathered into the region, per-rank work, and the partial
  // results reduce-scattered back onto sequence shards.
  check_finite_differences(
      "sequence gather, per-rank tanh, reduce-scatter", group, {2, 4, 5}, false, false, kSmooth, [&](const Tensor& x) {
        const Tensor full = gather_from_sequence_region(x, 0, group);
        const Tensor w_full =
            on(group, colossal::testing::random_tensor(full.shape(), 600 + static_cast<uint64_t>(me)));
        return reduce_scatter_to_sequence_region(ops::tanh(ops::mul(full, w_full)), 0, group);
      });
}

}  // namespace colossal::parallel::tp::mapping_checks
