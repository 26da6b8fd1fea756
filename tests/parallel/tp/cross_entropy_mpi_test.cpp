// The vocab-parallel cross-entropy (parallel/tp/cross_entropy.h) under MPI, the whole world as the
// tensor-parallel group (2 and 4 ranks): on each rank's slice of the vocabulary it gives the serial
// ops::cross_entropy's value and, slice by slice, its gradient — with mean, sum and no reduction,
// label smoothing, ignored targets, targets on every rank's slice, and 3-d logits.
//
// Tolerance: f64, 1e-12 relative. Both compute log-sum-exp from the row maximum; the parallel one
// sums the exponentials per slice first (a different order of the same additions).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include "../../comm/mpi_test_main.h"
#include "colossal/autograd/engine.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/parallel/tp/cross_entropy.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

#include "tp_test_util.h"

namespace colossal::parallel::tp {
namespace {

using comm::testing::world;
using testing::relative_error;

constexpr double kTolerance = 1e-12;

/// Logits [rows, vocab] (f64, varied) and targets hitting every rank's slice, two of them ignored.
Tensor serial_logits(int64_t rows, int64_t vocab) {
  std::vector<double> v;
  for (int64_t i = 0; i < rows * vocab; ++i) v.push_back(3.0 * std::sin(0.71 * static_cast<double>(i) + 0.3));
  Tensor t = core::from_vector<double>(v, {rows, vocab});
  t.set_requires_grad(true);
  return t;
}

Tensor targets(int64_t rows, int64_t vocab, int64_t ignore) {
  std::vector<int64_t> v;
  for (int64_t r = 0; r < rows; ++r) v.push_back(r % 5 == 3 ? ignore : (r * 7 + 2) % vocab);
  return core::from_vector<int64_t>(v, {rows});
}

/// This rank's slice of the vocabulary, as a leaf of its own.
Tensor my_slice(const Tensor& full) {
  const int64_t local = full.shape().back() / world().size();
  Tensor s = full.detach().narrow(full.dim() - 1, world().rank() * local, local).contiguous().clone();
  s.set_requires_grad(true);
  return s;
}

/// Upstream gradient: 1 for a scalar loss, varied per row for reduction none.
Tensor upstream(const Tensor& loss) {
  if (loss.dim() == 0) return core::from_vector<double>({1.7}, {});
  std::vector<double> v;
  for (int64_t i = 0; i < loss.numel(); ++i) v.push_back(0.5 + 0.25 * static_cast<double>(i % 3));
  return core::from_vector<double>(v, loss.shape());
}

void expect_matches_serial(const ops::CrossEntropyOptions& options, int64_t rows = 10) {
  const int64_t vocab = 8 * world().size();
  Tensor full = serial_logits(rows, vocab);
  const Tensor target = targets(rows, vocab, options.ignore_index);
  Tensor serial = ops::cross_entropy(full, target, options);
  autograd::backward({serial}, {upstream(serial)});

  Tensor shard = my_slice(full);
  Tensor parallel = vocab_parallel_cross_entropy(shard, target, world(), options);
  autograd::backward({parallel}, {upstream(parallel)});

  EXPECT_LE(relative_error(parallel, serial), kTolerance) << "loss";
  const int64_t local = vocab / world().size();
  EXPECT_LE(relative_error(shard.grad(), full.grad().narrow(1, world().rank() * local, local)), kTolerance)
      << "this rank's slice of the gradient";
}

TEST(VocabParallelCrossEntropy, MeanEqualsTheSerialLossAndGradient) {
  expect_matches_serial({});
}

TEST(VocabParallelCrossEntropy, SumAndNoReduction) {
  expect_matches_serial({.reduction = ops::Reduction::sum});
  expect_matches_serial({.reduction = ops::Reduction::none});
}

TEST(VocabParallelCrossEntropy, LabelSmoothingAndIgnoredTargets) {
  expect_matches_serial({.ignore_index = -100, .label_smoothing = 0.1});
  expect_matches_serial({.ignore_index = 5, .label_smoothing = 0.2, .reduction = ops::Reduction::sum});
}

TEST(VocabParallelCrossEntropy, LanguageModelShapes) {
  // [B, T, V/tp] logits against [B, T] targets, as GPT-2's head gives them.
  const int64_t vocab = 8 * world().size();
  Tensor full = serial_logits(2 * 5, vocab);
  const Tensor target = targets(2 * 5, vocab, -100);
  Tensor serial = ops::cross_entropy(full, target);
  autograd::backward(serial);
  Tensor shard = my_slice(full.detach().reshape({2, 5, vocab}));
  Tensor parallel = vocab_parallel_cross_entropy(shard, target.reshape({2, 5}), world());
  autograd::backward(parallel);
  EXPECT_LE(relative_error(parallel, serial), kTolerance);
  const int64_t local = vocab / world().size();
  EXPECT_LE(relative_error(shard.grad().reshape({10, local}), full.grad().narrow(1, world().rank() * local, local)),
            kTolerance);
}

TEST(VocabParallelCrossEntropy, MismatchedTargetIsNamed) {
  Tensor shard = my_slice(serial_logits(4, 8 * world().size()));
  EXPECT_ERROR_CONTAINS(vocab_parallel_cross_entropy(shard, core::zeros({5}, DType::i64), world()),
                        "target of shape [5] does not match logits of shape [4, 8]");
}

// A target outside the whole vocabulary (or the real part of a padded one) is an error on every rank,
// before any collective, naming it, its row and the vocabulary.
TEST(VocabParallelCrossEntropy, TargetOutsideTheVocabularyIsNamed) {
  const int64_t vocab = 8 * world().size();
  Tensor shard = my_slice(serial_logits(3, vocab));
  EXPECT_ERROR_CONTAINS(
      vocab_parallel_cross_entropy(shard, core::from_vector<int64_t>({0, vocab, 1}, {3}), world()),
      fmt::format("target {} at row 1 is out of range for a vocabulary of {} (valid: 0..{}", vocab, vocab, vocab - 1));
  EXPECT_ERROR_CONTAINS(
      vocab_parallel_cross_entropy(shard, core::from_vector<int64_t>({0, 1, vocab - 1}, {3}), world(), {}, vocab - 1),
      fmt::format("target {} at row 2 is out of range for a vocabulary of {}", vocab - 1, vocab - 1));
}

// A vocabulary padded to split over the group (VocabParallelEmbedding pads 8 tp - 3 entries to 8 tp):
// with vocab_size the padding columns, whatever they hold, are no class: the loss and the real
// columns' gradient are the serial ones over the real vocabulary, with label smoothing too, and the
// padding's gradient is zero.
TEST(VocabParallelCrossEntropy, PaddingColumnsAreLeftOut) {
  const int64_t padded = 8 * world().size(), vocab = padded - 3, rows = 10;
  for (const double smoothing : {0.0, 0.1}) {
    const ops::CrossEntropyOptions options{.label_smoothing = smoothing};
    Tensor full = serial_logits(rows, vocab);
    const Tensor target = targets(rows, vocab, options.ignore_index);
    Tensor serial = ops::cross_entropy(full, target, options);
    autograd::backward(serial);

    // The padded logits: the real ones, then 3 columns of large values the loss must ignore.
    const int64_t local = padded / world().size();
    std::vector<double> v = full.detach().to_vector<double>(), p;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < padded; ++c) p.push_back(c < vocab ? v[static_cast<size_t>(r * vocab + c)] : 50.0);
    }
    Tensor shard = my_slice(core::from_vector<double>(p, {rows, padded}));
    Tensor parallel = vocab_parallel_cross_entropy(shard, target, world(), options, vocab);
    autograd::backward(parallel);
    EXPECT_LE(relative_error(parallel, serial), kTolerance) << "loss, smoothing " << smoothing;
    const int64_t first = world().rank() * local, real = std::clamp<int64_t>(vocab - first, 0, local);
    EXPECT_LE(relative_error(shard.grad().narrow(1, 0, real), full.grad().narrow(1, first, real)), kTolerance)
        << "real columns, smoothing " << smoothing;
    if (real < local) {
      EXPECT_EQ(ops::sum(ops::abs(shard.grad().narrow(1, real, local - real))).item<double>(), 0.0)
          << "padding columns, smoothing " << smoothing;
    }
  }
}

}  // namespace
}  // namespace colossal::parallel::tp

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
