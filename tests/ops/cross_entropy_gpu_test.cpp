// CUDA cross_entropy against the CPU kernels on fresh random inputs, f32/bf16/f16, the loss and
// the gradients of the logits (and of soft targets): every reduction, label smoothing,
// ignore_index (out of range and in range, and every row ignored), soft targets, i32 and i64
// targets, widths from 10 to 50304 (warp rows, block rows, element loads), out-of-range targets
// raising the CPU's message, and targets on the wrong device. Tolerances: tests/support/gpu_compare.h's
// per dtype, with atol also capped by the data's scale (expect_scaled_match): the gradients
// (softmax - q) * g of C classes are ~1 / C, below the harness's fixed atol.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "colossal/core/view.h"         // to_device_raw, select_raw, narrow_raw
#include "colossal/ops/loss_kernels.h"  // the vocab-parallel slice stubs
#include "gpu_compare.h"

namespace colossal {
namespace {

using ops::CrossEntropyOptions;
using ops::Reduction;
using testing::expect_close;
using testing::expect_cuda_matches_cpu;
using testing::expect_scaled_match;
using testing::random_input;

constexpr DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};
constexpr Reduction kReductions[] = {Reduction::none, Reduction::mean, Reduction::sum};

const char* name_of(Reduction r) {
  return r == Reduction::none ? "none" : r == Reduction::mean ? "mean" : "sum";
}

/// Class indices for `rows` rows: a fixed pseudo-random pattern over [0, classes), with every
/// `ignore_every`-th row set to ignore_index (0: none ignored).
Tensor class_targets(int64_t rows, int64_t classes, DType dtype, int64_t ignore_every = 0,
                     int64_t ignore_index = -100) {
  std::vector<int64_t> labels(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    labels[static_cast<size_t>(i)] = (i * 7919 + 13) % classes;
    if (ignore_every > 0 && i % ignore_every == 1) labels[static_cast<size_t>(i)] = ignore_index;
  }
  Tensor t = core::from_vector<int64_t>(labels, {rows});
  return dtype == DType::i64 ? t : t.to(dtype);
}

/// Hard targets: logits in [-4, 4); loss and logits' gradient compared. The mean and sum add up to
/// 64 row losses in f64 on both sides, so they match to the rows' own rounding: base tolerance
/// unless `factor` says otherwise.
void check_hard(int64_t rows, int64_t classes, const CrossEntropyOptions& options, DType target_dtype = DType::i64,
                int64_t ignore_every = 0, double factor = 1.0) {
  const Tensor target = class_targets(rows, classes, target_dtype, ignore_every, options.ignore_index);
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(fmt::format("[{}, {}] {} reduction {}, smoothing {}, ignore_index {} (every {})", rows, classes, dtype,
                             name_of(options.reduction), options.label_smoothing, options.ignore_index, ignore_every));
    expect_scaled_match(
        {.make_inputs =
             [=](DType d) {
               return std::vector<Tensor>{random_input({rows, classes}, 31, d, -4, 4), target};
             },
         .fn = [=](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], in[1], options); }},
        dtype, factor, "cross_entropy");
  }
}

TEST(CrossEntropyGpu, HardTargetsEveryOption) {
  COLOSSAL_REQUIRE_GPU();
  for (Reduction reduction : kReductions) {
    for (double smoothing : {0.0, 0.1}) {
      check_hard(64, 10, {.label_smoothing = smoothing, .reduction = reduction});
      check_hard(64, 1000, {.label_smoothing = smoothing, .reduction = reduction}, DType::i32);
      check_hard(33, 37, {.label_smoothing = smoothing, .reduction = reduction}, DType::i64, 3);  // odd, some ignored
      // An in-range ignore_index: rows whose target is 2 are ignored.
      check_hard(40, 129, {.ignore_index = 2, .label_smoothing = smoothing, .reduction = reduction}, DType::i32, 4);
    }
  }
}

TEST(CrossEntropyGpu, EveryRowIgnored) {
  COLOSSAL_REQUIRE_GPU();
  // mean over no counted rows is nan on both devices; the gradient is 0 (Note [Cross entropy over no targets]).
  Tensor logits = random_input({4, 10}, 32, DType::f32, -1, 1);
  Tensor target = core::full({4}, -100, DType::i64);
  Tensor gpu_logits = logits.detach().to(core::cuda_device(0)).set_requires_grad(true);
  Tensor loss = ops::cross_entropy(gpu_logits, target.to(core::cuda_device(0)));
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  autograd::backward(loss);
  expect_close(gpu_logits.grad().to(core::kCpu), core::zeros({4, 10}), 0, 0, "gradient with every row ignored");
  // sum over no rows is 0.
  EXPECT_EQ(
      ops::cross_entropy(gpu_logits, target.to(core::cuda_device(0)), {.reduction = Reduction::sum}).item<double>(),
      0.0);
}

TEST(CrossEntropyGpu, SoftTargets) {
  COLOSSAL_REQUIRE_GPU();
  for (Reduction reduction : kReductions) {
    for (double smoothing : {0.0, 0.2}) {
      for (int64_t classes : {10, 1000, 129}) {
        for (DType dtype : kDtypes) {
          SCOPED_TRACE(fmt::format("soft [24, {}] {} reduction {}, smoothing {}", classes, dtype, name_of(reduction),
                                   smoothing));
          // Unnormalised positive probabilities (as mixup can give), both inputs differentiated.
          expect_scaled_match({.make_inputs =
                                   [=](DType d) {
                                     return std::vector<Tensor>{random_input({24, classes}, 33, d, -4, 4),
                                                                random_input({24, classes}, 34, d, 0.0, 2.0 / classes)};
                                   },
                               .fn =
                                   [=](const std::vector<Tensor>& in) {
                                     return ops::cross_entropy(in[0], in[1],
                                                               {.label_smoothing = smoothing, .reduction = reduction});
                                   }},
                              dtype, 1.0, "cross_entropy (soft targets)");
        }
      }
    }
  }
}

TEST(CrossEntropyGpu, UnbatchedLogits) {
  COLOSSAL_REQUIRE_GPU();
  for (DType dtype : kDtypes) {
    expect_cuda_matches_cpu(
        {.make_inputs = [](DType d) { return std::vector<Tensor>{random_input({50}, 35, d, -4, 4)}; },
         .fn =
             [](const std::vector<Tensor>& in) {
               return ops::cross_entropy(in[0], core::from_vector<int64_t>({7}, {}).to(in[0].device()),
                                         {.label_smoothing = 0.1});
             }},
        dtype, "cross_entropy of [C] logits");
  }
}

// GPT-2's vocabulary: one block per row, logits read once. Sums of 50304 terms in a different
// order: 4x the base tolerance, as for the reduction tests.
TEST(CrossEntropyGpu, VocabularyRows) {
  COLOSSAL_REQUIRE_GPU();
  for (Reduction reduction : kReductions) {
    check_hard(8, 50304, {.label_smoothing = 0.1, .reduction = reduction}, DType::i64, 0, 4.0);
  }
  check_hard(6, 50257, {.reduction = Reduction::mean}, DType::i64, 3, 4.0);  // odd width, one row ignored
}

TEST(CrossEntropyGpu, OutOfRangeTargets) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  Tensor logits = random_input({3, 4}, 37, DType::f32, -1, 1, false).to(gpu);
  // The check is deferred (Note [Deferred device checks]): the call returns without stopping the
  // host, and the host's next read of a result throws the CPU kernel's message, naming the first
  // bad row.
  Tensor loss;
  EXPECT_NO_THROW(loss = ops::cross_entropy(logits, core::from_vector<int64_t>({0, 4, 7}, {3}).to(gpu)));
  EXPECT_ERROR_CONTAINS(
      loss.item<double>(),
      "cross_entropy: target 4 at row 1 is out of range for 4 classes (valid: 0..3, or ignore_index -100)");
  EXPECT_ERROR_CONTAINS(
      {
        ops::cross_entropy(logits, core::from_vector<int32_t>({-1, 0, 1}, {3}).to(gpu));
        core::cuda::synchronize(gpu);
      },
      "target -1 at row 0 is out of range");
  EXPECT_ERROR_CONTAINS(
      {
        ops::cross_entropy(logits, core::from_vector<int64_t>({0, 1, -5}, {3}).to(gpu), {.ignore_index = 1});
        core::cuda::synchronize(gpu);
      },
      "target -5 at row 2 is out of range for 4 classes (valid: 0..3, or ignore_index 1)");
  // The long-row kernel checks too.
  Tensor wide = random_input({2, 5000}, 38, DType::bf16, -1, 1, false).to(gpu);
  EXPECT_ERROR_CONTAINS(
      {
        ops::cross_entropy(wide, core::from_vector<int64_t>({4999, 5000}, {2}).to(gpu));
        core::cuda::synchronize(gpu);
      },
      "target 5000 at row 1 is out of range for 5000 classes");
  // A valid call afterwards still works (the error left no state behind).
  EXPECT_FALSE(
      std::isnan(ops::cross_entropy(logits, core::from_vector<int64_t>({0, 1, 3}, {3}).to(gpu)).item<double>()));
}

// The vocab-parallel slice kernels (ops/loss_kernels.h, used by parallel/tp/cross_entropy.h) against
// the CPU ones: a slice of real columns only, the last rank's slice of GPT-2's padded vocabulary (25105
// real of 25152: the masked vector in the middle of a row), a short warp row with padding, an odd width
// (element loads); targets on this slice, on others and ignored; with and without label smoothing.
// Statistics: the logsumexp from f32 sums of up to 25152 terms in another order, rtol 4e-5; the
// target's logit exact; the smoothing's sum of logits as stated below. Gradients: computed in f32
// on both sides and rounded to the logits' dtype, so f32 1e-5 relative to the row's largest entry and
// bf16 one rounding step (2^-8) of the largest entry.
TEST(CrossEntropyGpu, VocabShardKernels) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  struct Slice {
    int64_t columns, class_start, real_columns, classes;
  };
  for (const Slice slice : {Slice{25152, 0, 25152, 50257}, Slice{25152, 25152, 25105, 50257}, Slice{40, 40, 13, 53},
                            Slice{37, 0, 37, 74}}) {
    for (const double smoothing : {0.0, 0.1}) {
      for (const DType dtype : {DType::f32, DType::bf16}) {
        SCOPED_TRACE(fmt::format("slice of {} columns from class {} ({} real, vocabulary {}), {}, smoothing {}",
                                 slice.columns, slice.class_start, slice.real_columns, slice.classes, dtype,
                                 smoothing));
        const int64_t rows = 24;
        std::vector<int64_t> labels;
        for (int64_t i = 0; i < rows; ++i) {
          // every third row on this slice, one ignored, the rest anywhere in the vocabulary
          labels.push_back(i % 7 == 5   ? -100
                           : i % 3 == 0 ? slice.class_start + (i * 31) % slice.real_columns
                                        : (i * 7919 + 13) % slice.classes);
        }
        const Tensor target = core::from_vector<int64_t>(labels, {rows});
        const Tensor logits = random_input({rows, slice.columns}, 41, dtype, -4, 4, false);
        const ops::VocabShardParams params{.class_start = slice.class_start,
                                           .real_columns = slice.real_columns,
                                           .classes = slice.classes,
                                           .label_smoothing = smoothing};
        const Tensor stats = core::empty({3, rows}, TensorOptions(DType::f32, core::kCpu));
        ops::vocab_shard_cross_entropy_forward_stub(core::kCpu, stats, logits, target, params);
        const Tensor gpu_stats = core::empty({3, rows}, TensorOptions(DType::f32, gpu));
        ops::vocab_shard_cross_entropy_forward_stub(gpu, gpu_stats, logits.to(gpu), target.to(gpu), params);
        const Tensor got = gpu_stats.to(core::kCpu);
        for (int64_t r = 0; r < 2; ++r) {
          expect_close(core::select_raw(got, 0, r), core::select_raw(stats, 0, r), 1e-5, 4e-5,
                       r == 0 ? "the slice's logsumexp" : "the target's logit");
        }
        // The sum of a row's logits in f32 (label smoothing): its rounding grows with the terms' sizes,
        // not the sum's (random signs cancel): ~sqrt(n) eps of sum |x|; held to 1e-6 sum |x| (one
        // logit missed or counted twice is ~4 / sum |x| = 1e-4 of it at these widths).
        const double magnitude =
            ops::max(ops::sum(ops::abs(core::narrow_raw(logits.to(DType::f32), 1, 0, slice.real_columns)), {1}))
                .item<double>();
        expect_close(core::select_raw(got, 0, 2), core::select_raw(stats, 0, 2), 1e-6 * magnitude, 0.0,
                     "the sum of the real logits");

        // Any lse at least the slice's makes a valid softmax slice; the row scales vary in sign.
        const Tensor lse = ops::add(core::select_raw(stats, 0, 0), 0.7).contiguous();
        const Tensor scale = random_input({rows}, 42, DType::f32, -2, 2, false);
        const Tensor grad = core::empty({rows, slice.columns}, TensorOptions(dtype, core::kCpu));
        ops::vocab_shard_cross_entropy_backward_stub(core::kCpu, grad, logits, target, lse, scale, params);
        const Tensor gpu_grad = core::empty({rows, slice.columns}, TensorOptions(dtype, gpu));
        ops::vocab_shard_cross_entropy_backward_stub(gpu, gpu_grad, logits.to(gpu), target.to(gpu), lse.to(gpu),
                                                     scale.to(gpu), params);
        const double largest = ops::max(ops::abs(grad.to(DType::f32))).item<double>();
        const double step = dtype == DType::bf16 ? std::ldexp(1.0, -8) : 1e-5;
        expect_close(gpu_grad.to(core::kCpu).to(DType::f32), grad.to(DType::f32), step * largest, step, "gradient");
        // Padding columns get an exact 0.
        if (slice.real_columns < slice.columns) {
          const Tensor padding = core::narrow_raw(gpu_grad.to(core::kCpu).to(DType::f32), 1, slice.real_columns,
                                                  slice.columns - slice.real_columns);
          EXPECT_EQ(ops::max(ops::abs(padding)).item<double>(), 0.0);
        }
      }
    }
  }
  // A target outside the whole vocabulary is named (deferred, at the next host read).
  const Tensor stats = core::empty({3, 2}, TensorOptions(DType::f32, gpu));
  EXPECT_ERROR_CONTAINS(
      {
        ops::vocab_shard_cross_entropy_forward_stub(
            gpu, stats, random_input({2, 8}, 43, DType::f32, -1, 1, false).to(gpu),
            core::from_vector<int64_t>({3, 16}, {2}).to(gpu),
            ops::VocabShardParams{.class_start = 8, .real_columns = 8, .classes = 16});
        core::cuda::synchronize(gpu);
      },
      "vocab_parallel_cross_entropy: target 16 at row 1 is out of range for a vocabulary of 16 (valid: 0..15");
}

TEST(CrossEntropyGpu, TargetOnAnotherDevice) {
  COLOSSAL_REQUIRE_GPU();
  Tensor logits = core::ones({2, 3}, TensorOptions(DType::f32, core::cuda_device(0)));
  EXPECT_ERROR_CONTAINS(ops::cross_entropy(logits, core::from_vector<int64_t>({0, 1}, {2})),
                        "cross_entropy: logits are on cuda:0 but target is on cpu");
}

}  // namespace
}  // namespace colossal
