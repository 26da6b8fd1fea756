// DataParallel under MPI (2 and 4 ranks), what the layout harness does not cover: every replica
// starts equal whatever it initialised (the broadcast), buckets follow reverse registration order and
// then the order gradients arrive in, small buckets give the same result, a rank can report its own loss, and naive
// fp16 skips an overflowing step on every rank. The equivalence with serial training (losses, gradients and parameters
// at every step, with accumulation and clipping, MLP, ViT and GPT-2) is tests/parallel/layout_equivalence_mpi_test.cpp,
// through tests/support/layout_harness.h.
//
// Tolerance: 1e-5 relative on losses and parameters in f32, as the harness (layout_harness.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "../comm/mpi_test_main.h"
#include "colossal/autograd/engine.h"
#include "colossal/engine/engine.h"
#include "colossal/nn/activation.h"
#include "colossal/nn/linear.h"
#include "colossal/nn/module.h"
#include "colossal/ops/elementwise.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/ops/reduction.h"
#include "colossal/optim/adam.h"
#include "colossal/optim/sgd.h"
#include "colossal/parallel/dp/data_parallel.h"
#include "colossal/parallel/parallel_context.h"

namespace colossal::parallel {
namespace {

using comm::testing::world;

constexpr int64_t kIn = 6, kHidden = 16, kClasses = 3;
constexpr int64_t kPerRank = 4;  // rows per rank per micro-step
constexpr double kTolerance = 1e-5;

std::shared_ptr<comm::ProcessGroup> world_group() {
  return std::shared_ptr<comm::ProcessGroup>(&world(), [](comm::ProcessGroup*) {});
}

std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed) {
  core::Generator init(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(kIn, kHidden, true, &init), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Linear>(kHidden, kClasses, true, &init)});
}

/// Rows [begin, end) of micro-step `micro` of step `step`'s global batch: features and class labels
/// that vary with everything, no generator needed.
std::pair<Tensor, Tensor> rows(int64_t step, int64_t micro, int64_t begin, int64_t end) {
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int64_t r = begin; r < end; ++r) {
    for (int64_t c = 0; c < kIn; ++c) {
      x.push_back(static_cast<float>(std::sin(0.7 * static_cast<double>(r + 3 * c) + 1.3 * static_cast<double>(step) +
                                              0.5 * static_cast<double>(micro))));
    }
    y.push_back((r + step + micro) % kClasses);
  }
  return {core::from_vector<float>(x, {end - begin, kIn}), core::from_vector<int64_t>(y, {end - begin})};
}

Tensor ce(const Tensor& out, const Tensor& target) {
  return ops::cross_entropy(out, target);
}

/// SGD with momentum by default: its update is proportional to the gradient, so a gradient summed
/// instead of averaged shows. AdamW's m / sqrt(v) is blind to a constant factor; it is checked too,
/// for its state.
std::unique_ptr<engine::Engine> make_engine(std::shared_ptr<nn::Module> model, engine::EngineOptions options,
                                            bool adamw = false) {
  std::shared_ptr<optim::Optimizer> optimizer;
  if (adamw) {
    optim::AdamOptions adam = optim::adamw_defaults();
    adam.lr = 0.02;
    adam.weight_decay = 0.01;
    optimizer = std::make_shared<optim::AdamW>(model->parameters(), adam);
  } else {
    optim::SgdOptions sgd;
    sgd.lr = 0.2;
    sgd.momentum = 0.9;
    sgd.weight_decay = 1e-3;
    optimizer = std::make_shared<optim::Sgd>(model->parameters(), sgd);
  }
  return std::make_unique<engine::Engine>(std::move(model), optimizer, ce, options);
}

/// The context of a data-parallel run over the whole world.
std::shared_ptr<const ParallelContext> data_parallel_context() {
  return std::make_shared<const ParallelContext>(ParallelContext::create(config::ParallelConfig{}, world_group()));
}

TEST(DataParallel, ReplicasStartEqualWhateverEachRankInitialised) {
  // Each rank initialises differently: the broadcast from rank 0 must make them equal to seed 7's.
  auto reference = make_mlp(7);
  auto model = make_mlp(static_cast<uint64_t>(7 + world().rank() * 1000));
  engine::EngineOptions options;
  options.context = data_parallel_context();
  auto dp = make_engine(model, options);
  ASSERT_NE(dp->data_parallel(), nullptr);
  ASSERT_GT(dp->data_parallel()->num_buckets(), 0);
  for (const auto& [name, p] : model->named_parameters()) {
    EXPECT_EQ(p.to_vector<float>(), reference->state_dict().at(name).to_vector<float>()) << name << " not broadcast";
  }
}

TEST(DataParallel, SmallBucketsGiveTheSameResult) {
  // 256 bytes: every parameter in a bucket of its own, four all-reduces in flight per backward; the
  // parameters after three steps equal those of one 25 MiB bucket bit for bit (the same sums).
  std::vector<std::vector<float>> results;
  for (int64_t bucket_bytes : {int64_t{256}, int64_t{25} << 20}) {
    engine::EngineOptions options;
    options.context = data_parallel_context();
    options.data_parallel.bucket_bytes = bucket_bytes;
    auto model = make_mlp(7);
    auto dp = make_engine(model, options);
    const int rank = world().rank();
    for (int64_t step = 0; step < 3; ++step) {
      auto [x, y] = rows(step, 0, rank * kPerRank, (rank + 1) * kPerRank);
      dp->step(x, y);
    }
    std::vector<float> flat;
    for (const auto& [name, p] : model->named_parameters()) {
      for (float v : p.to_vector<float>()) flat.push_back(v);
    }
    results.push_back(flat);
  }
  EXPECT_EQ(results[0], results[1]);
}

TEST(DataParallel, GradientsAreViewsOfTheirBuckets) {
  // Note [Gradients as bucket views]: after the reduction each gradient lies in its bucket, one after
  // the other in bucket order, so nothing was copied back out of the buckets.
  engine::EngineOptions options;
  options.context = data_parallel_context();
  int64_t checked = 0;
  options.before_update = [&checked](engine::Engine& e) {
    std::map<std::string, Tensor> params;
    for (const auto& [name, p] : e.model().named_parameters()) params[name] = p;
    for (const std::vector<std::string>& bucket : e.data_parallel()->bucket_names()) {
      for (size_t i = 0; i + 1 < bucket.size(); ++i) {
        const Tensor& a = params.at(bucket[i]).grad();
        const Tensor& b = params.at(bucket[i + 1]).grad();
        ASSERT_TRUE(a.defined() && b.defined());
        EXPECT_EQ(static_cast<const char*>(a.raw_data()) + a.nbytes(), static_cast<const char*>(b.raw_data()))
            << bucket[i] << " and " << bucket[i + 1] << " are not neighbours in their bucket";
        ++checked;
      }
    }
  };
  auto dp = make_engine(make_mlp(7), options);
  const int rank = world().rank();
  for (int64_t step = 0; step < 2; ++step) {
    auto [x, y] = rows(step, 0, rank * kPerRank, (rank + 1) * kPerRank);
    dp->step(x, y);
  }
  EXPECT_GT(checked, 0);
}

TEST(DataParallel, ReportsThisRanksLossWhenAskedTo) {
  // report_mean_loss = false: step() returns this rank's own loss, the one a serial step on this
  // rank's share computes (the update itself is the same either way).
  const int rank = world().rank();
  engine::EngineOptions options;
  options.context = data_parallel_context();
  options.report_mean_loss = false;
  auto local = make_engine(make_mlp(7), engine::EngineOptions{});
  auto dp = make_engine(make_mlp(7), options);
  auto [x, y] = rows(0, 0, rank * kPerRank, (rank + 1) * kPerRank);
  const double expected = local->step(x, y).item<double>();
  EXPECT_NEAR(dp->step(x, y).item<double>(), expected, kTolerance * std::abs(expected));
}

TEST(DataParallel, BucketsFollowReverseRegistrationOrder) {
  auto model = make_mlp(1);
  DataParallel dp(*model, world_group(), DataParallelOptions{.bucket_bytes = kHidden * kClasses * 4 + kClasses * 4});
  const auto names = dp.bucket_names();
  // {2.bias, 2.weight} fill the cap exactly; 0.bias starts the next; 0.weight (384 bytes) is over
  // the cap and gets a bucket of its own.
  ASSERT_EQ(names.size(), 3u);
  EXPECT_EQ(names[0], (std::vector<std::string>{"2.bias", "2.weight"}));
  EXPECT_EQ(names[1], (std::vector<std::string>{"0.bias"}));
  EXPECT_EQ(names[2], (std::vector<std::string>{"0.weight"}));
}

/// An MLP that registers its output layer first ("first") and its input layer after ("second"): its
/// gradients arrive in registration order, against the reverse registration order buckets start in.
class RegisteredBackwards : public nn::Module {
 public:
  explicit RegisteredBackwards(uint64_t seed) : nn::Module("RegisteredBackwards") {
    core::Generator init(seed);
    first_ = register_module("first", std::make_shared<nn::Linear>(kHidden, kClasses, true, &init));
    second_ = register_module("second", std::make_shared<nn::Linear>(kIn, kHidden, true, &init));
  }
  Tensor forward(const Tensor& x) override { return (*first_)(ops::gelu((*second_)(x))); }

 private:
  std::shared_ptr<nn::Linear> first_, second_;
};

TEST(DataParallel, BucketsFollowTheOrderGradientsArrive) {
  // Note [Buckets in the order gradients arrive]: after the first synchronised backward the buckets
  // hold the output layer's parameters (whose gradients come first) before the input layer's, on
  // every rank; the run equals one that keeps the first layout, and every gradient is a view of the
  // bucket it is listed in from then on.
  const int rank = world().rank();
  std::vector<std::vector<float>> results;
  for (const bool rebuild : {false, true}) {
    engine::EngineOptions options;
    options.context = data_parallel_context();
    options.data_parallel.bucket_bytes = kHidden * kClasses * 4 + kClasses * 4;  // first.weight and first.bias
    options.data_parallel.rebuild_buckets = rebuild;
    auto model = std::make_shared<RegisteredBackwards>(7);
    auto engine = make_engine(model, options, /*adamw=*/true);
    const auto before = engine->data_parallel()->bucket_names();
    ASSERT_FALSE(before.empty());
    EXPECT_EQ(before.front().front().rfind("second.", 0), 0u) << "the first layout is reverse registration order";
    int64_t views_checked = 0;
    for (int64_t step = 0; step < 3; ++step) {
      auto [x, y] = rows(step, 0, rank * kPerRank, (rank + 1) * kPerRank);
      engine->step(x, y);
      EXPECT_EQ(engine->data_parallel()->rebuilt(), rebuild);
    }
    const auto after = engine->data_parallel()->bucket_names();
    if (rebuild) {
      for (const std::string& name : after.front()) EXPECT_EQ(name.rfind("first.", 0), 0u) << name;
      for (const std::string& name : after.back()) EXPECT_EQ(name.rfind("second.", 0), 0u) << name;
      // The same layout on every rank: rank 0's.
      std::vector<int64_t> sizes;
      for (const auto& bucket : after) sizes.push_back(static_cast<int64_t>(bucket.size()));
      Tensor mine = core::from_vector<int64_t>(sizes, {static_cast<int64_t>(sizes.size())});
      Tensor low = mine.clone(), high = mine.clone();
      world().all_reduce(low, comm::ReduceOp::min);
      world().all_reduce(high, comm::ReduceOp::max);
      EXPECT_EQ(low.to_vector<int64_t>(), high.to_vector<int64_t>());
    } else {
      EXPECT_EQ(after, before);
    }
    // One more backward without the update: each gradient sits in its listed bucket, in order.
    {
      auto [x, y] = rows(3, 0, rank * kPerRank, (rank + 1) * kPerRank);
      engine->zero_grad();
      autograd::backward(ce((*model)(x), y));
      engine->data_parallel()->finish();
      std::map<std::string, Tensor> params;
      for (const auto& [name, p] : model->named_parameters()) params[name] = p;
      for (const auto& bucket : after) {
        for (size_t i = 0; i + 1 < bucket.size(); ++i) {
          const Tensor& a = params.at(bucket[i]).grad();
          const Tensor& b = params.at(bucket[i + 1]).grad();
          EXPECT_EQ(static_cast<const char*>(a.raw_data()) + a.nbytes(), static_cast<const char*>(b.raw_data()))
              << bucket[i] << " and " << bucket[i + 1];
          ++views_checked;
        }
      }
    }
    EXPECT_GT(views_checked, 0);
    std::vector<float> flat;
    for (const auto& [name, p] : model->named_parameters()) {
      for (float v : p.to_vector<float>()) flat.push_back(v);
    }
    results.push_back(flat);
  }
  ASSERT_EQ(results.size(), 2u);
  ASSERT_EQ(results[0].size(), results[1].size());
  for (size_t i = 0; i < results[0].size(); ++i) {
    EXPECT_NEAR(results[1][i], results[0][i], kTolerance * (1 + std::abs(results[0][i]))) << "parameter value " << i;
  }
}

// Naive fp16 with hysteresis 1: an overflow on one rank's data skips the step on every rank, leaves
// every replica unchanged and halves the scale everywhere.
TEST(DataParallel, NaiveFp16SkipsAnOverflowOnEveryRank) {
  const int rank = world().rank(), size = world().size();
  engine::EngineOptions options;
  options.context = data_parallel_context();
  options.amp = amp::AmpOptions::for_mode(amp::AmpMode::naive);
  options.amp->scaler.hysteresis = 1;
  auto model = make_mlp(7);
  auto engine = make_engine(model, options);
  auto [x0, y0] = rows(0, 0, rank * kPerRank, (rank + 1) * kPerRank);
  engine->step(x0, y0);
  ASSERT_FALSE(engine->last_step_skipped());
  const double scale = engine->amp()->loss_scale();
  std::vector<std::vector<float>> before;
  for (const Tensor& p : engine->amp()->master_params()) before.push_back(p.to_vector<float>());

  auto [x1, y1] = rows(1, 0, rank * kPerRank, (rank + 1) * kPerRank);
  if (rank == size - 1) x1 = ops::mul(x1, 1e6);  // f16 overflows in the forward of the last rank only
  engine->step(x1, y1);
  EXPECT_TRUE(engine->last_step_skipped());
  EXPECT_EQ(engine->amp()->loss_scale(), scale / 2);
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(engine->amp()->master_params()[i].to_vector<float>(), before[i]) << "master " << i << " changed";
  }
  // The replicas still agree.
  for (const Tensor& p : engine->amp()->master_params()) {
    Tensor low = p.clone(), high = p.clone();
    world().all_reduce(low, comm::ReduceOp::min);
    world().all_reduce(high, comm::ReduceOp::max);
    EXPECT_EQ(low.to_vector<float>(), high.to_vector<float>());
  }
}

// Note [Update beside the last reductions] (engine/engine.cpp): stepping every bucket but the last
// ones first and those after their reduction gives the one-part update's parameters, masters and
// optimizer state bit for bit, with SGD's momentum, AdamW, and AdamW under bf16 mixed precision (its
// fused step); with two or more buckets late, and with each parameter in a bucket of its own.
TEST(DataParallel, AnUpdateInTwoPartsEqualsOneInOne) {
  struct Case {
    const char* name;
    bool adamw;
    bool bf16;
  };
  const int rank = world().rank();
  for (const Case& c : {Case{"sgd", false, false}, Case{"adamw", true, false}, Case{"adamw bf16", true, true}}) {
    std::vector<std::vector<float>> results;
    std::vector<int64_t> late_counts;
    for (const int late : {0, 1, 2, 3}) {
      engine::EngineOptions options;
      options.context = data_parallel_context();
      options.data_parallel.bucket_bytes = 16;  // one bucket per parameter: four buckets
      options.data_parallel.late_buckets = late;
      if (c.bf16) options.amp = amp::AmpOptions::for_mode(amp::AmpMode::bf16);
      auto model = make_mlp(7);
      auto engine = make_engine(model, options, c.adamw);
      ASSERT_EQ(engine->data_parallel()->num_buckets(), 4);
      for (int64_t step = 0; step < 3; ++step) {
        auto [x, y] = rows(step, 0, rank * kPerRank, (rank + 1) * kPerRank);
        engine->step(x, y);
        EXPECT_FALSE(engine->last_step_skipped());
        for (const Tensor& p : model->parameters()) EXPECT_FALSE(p.grad().defined()) << c.name << ": a gradient left";
      }
      std::vector<float> flat;
      auto append = [&](const Tensor& t) {
        for (float v : t.to(DType::f32).to_vector<float>()) flat.push_back(v);
      };
      for (const Tensor& p : model->parameters()) append(p);
      if (engine->amp() != nullptr) {
        for (const Tensor& p : engine->amp()->master_params()) append(p);
      }
      for (const auto& [key, value] : engine->optimizer().state_dict()) {
        if (key.find(".exp_avg") != std::string::npos || key.find("momentum_buffer") != std::string::npos)
          append(value);
        if (key.ends_with(".step")) flat.push_back(static_cast<float>(value.item<double>()));
      }
      results.push_back(flat);
    }
    for (size_t k = 1; k < results.size(); ++k) {
      EXPECT_EQ(results[k], results[0]) << c.name << ": " << k << " late bucket(s) differ from one part";
    }
  }
}

}  // namespace
}  // namespace colossal::parallel

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
