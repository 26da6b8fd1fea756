// ZeRO in the Engine: checkpoints and the model-state accounting.
//
// Checkpoints under ZeRO are layout-independent (engine/checkpoint_sharding.h): a run saved under
// ZeRO at dp = world size resumes on one process without ZeRO, and a run saved without ZeRO resumes
// under it, in both cases with the losses and parameters of the uninterrupted run. The checkpoint
// holds the serial optimizer moments and (bf16) fp32 masters, gathered from the shards; resuming cuts
// each rank's shard back out of them. Tolerance: 1e-5 relative as the layout harness (f32: the
// layouts sum in another order); bf16 3e-2 as its data-parallel test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../../comm/mpi_test_main.h"
#include "colossal/config/train_config.h"
#include "colossal/engine/checkpoint.h"
#include "colossal/engine/engine.h"
#include "colossal/engine/log_hooks.h"  // model_state_bytes
#include "colossal/nn/safetensors.h"
#include "colossal/optim/adam.h"
#include "colossal/parallel/parallel_context.h"
#include "colossal/parallel/zero/low_level_zero.h"
#include "layout_harness.h"

namespace colossal::testing {
namespace {

constexpr int64_t kGlobalBatch = 8;
constexpr int64_t kAccumulation = 2;

std::shared_ptr<comm::ProcessGroup> world_group() {
  return std::shared_ptr<comm::ProcessGroup>(&comm::testing::world(), [](comm::ProcessGroup*) {});
}

struct Trained {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<engine::Engine> engine;
  int64_t rank = 0, share = kGlobalBatch;
  int64_t accumulation = kAccumulation;
};

/// The MLP of the layout harness with AdamW (decay and no-decay groups), accumulation and clipping,
/// serial (zero_stage < 0: one process, the global batch) or under ZeRO over the whole world.
/// `wrap` (when set) takes the MLP and returns the model to train.
Trained build(int zero_stage, bool bf16, int64_t bucket_bytes = 512, int64_t accumulation = kAccumulation,
              bool gather_in_forward = true, bool clip = true, int late_buckets = 2,
              const std::function<std::shared_ptr<nn::Module>(std::shared_ptr<nn::Module>)>& wrap = nullptr) {
  Trained t;
  t.accumulation = accumulation;
  core::Generator init(1234);
  t.model = mlp_case().build_model(init);
  if (wrap) t.model = wrap(t.model);
  optim::AdamOptions o = optim::adamw_defaults();
  o.lr = 1e-2;
  auto optimizer = std::make_shared<optim::AdamW>(optim::make_param_groups(t.model->named_parameters(), 0.05), o);
  engine::EngineOptions options;
  options.gradient_accumulation = accumulation;
  if (clip) options.clip_grad_norm = 0.05;
  if (bf16) options.amp = amp::AmpOptions::for_mode(amp::AmpMode::bf16);
  if (zero_stage >= 0) {
    config::ParallelConfig pc;
    pc.data = comm::testing::world().size();
    auto context =
        std::make_shared<const parallel::ParallelContext>(parallel::ParallelContext::create(pc, world_group()));
    t.rank = context->rank(parallel::GroupKind::kData);
    t.share = kGlobalBatch / pc.data;
    options.context = context;
    if (zero_stage > 0)
      options.zero = parallel::zero::ZeroOptions{.stage = zero_stage,
                                                 .reduce_bucket_bytes = bucket_bytes,
                                                 .gather_in_forward = gather_in_forward,
                                                 .late_buckets = late_buckets};
  }
  const HarnessCase c = mlp_case();
  t.engine = std::make_unique<engine::Engine>(t.model, optimizer, c.criterion, options);
  return t;
}

/// Trains updates [first, last) and returns each micro-step's loss (the global batch's).
std::vector<double> train(Trained& t, int64_t first, int64_t last) {
  const HarnessCase c = mlp_case();
  std::vector<double> losses;
  for (int64_t step = first; step < last; ++step) {
    for (int64_t micro = 0; micro < t.accumulation; ++micro) {
      auto [x, y] = c.rows(step, micro, t.rank * t.share, (t.rank + 1) * t.share);
      losses.push_back(t.engine->step(x, y).item<double>());
    }
  }
  return losses;
}

std::vector<double> parameters(Trained& t) {
  std::vector<double> values;
  // Through the Engine: the step's all-gathers may still be writing them (Note [Gathers under the
  // forward] in low_level_zero.cpp).
  for (const auto& [name, p] : t.engine->model().named_parameters()) {
    for (double v : p.detach().to(DType::f64).contiguous().to_vector<double>()) values.push_back(v);
  }
  return values;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tolerance,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(std::abs(got[i] - want[i]), tolerance * std::max(std::abs(want[i]), 1e-3))
        << what << " [" << i << "]: " << got[i] << " against " << want[i];
  }
}

/// Relative difference by norm, as the layout harness compares tensors (a per-element bound would
/// hold bf16's rounding of a near-zero element to the tolerance of a large one).
void expect_close_by_norm(const std::vector<double>& got, const std::vector<double>& want, double tolerance,
                          const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  EXPECT_LE(std::sqrt(diff), tolerance * std::sqrt(norm)) << what;
}

std::filesystem::path checkpoint_path(const std::string& name) {
  return std::filesystem::path(::testing::TempDir()) /
         fmt::format("colossal_zero_{}_np{}.safetensors", name, comm::testing::world().size());
}

/// `saver` trains 2 updates and saves, then goes on for 2 more (the uninterrupted run); `resumer`
/// loads the file and trains the same 2: losses and parameters must equal the uninterrupted run's.
void expect_resume_matches(int saver_stage, int resumer_stage, bool bf16, const std::string& name) {
  const double tolerance = bf16 ? 3e-2 : 1e-5;
  const std::filesystem::path path = checkpoint_path(name);
  Trained saver = build(saver_stage, bf16);
  train(saver, 0, 2);
  engine::CheckpointInfo info;
  info.num_updates = saver.engine->num_updates();
  engine::save_checkpoint(path, *saver.engine, {}, info);
  comm::testing::world().barrier();  // rank 0 has written it
  const std::vector<double> want_losses = train(saver, 2, 4);
  const std::vector<double> want_params = parameters(saver);

  Trained resumer = build(resumer_stage, bf16);
  engine::load_checkpoint(path, *resumer.engine, {});
  const std::vector<double> losses = train(resumer, 2, 4);
  expect_close(losses, want_losses, tolerance, name + " losses after resuming");
  expect_close_by_norm(parameters(resumer), want_params, tolerance, name + " parameters after resuming");
  comm::testing::world().barrier();
  if (comm::testing::world().rank() == 0) std::filesystem::remove(path);
}

TEST(ZeroCheckpoint, Stage2ResumesSerial) {
  expect_resume_matches(/*saver_stage=*/2, /*resumer_stage=*/-1, /*bf16=*/false, "stage2_to_serial");
}

TEST(ZeroCheckpoint, SerialResumesUnderStage1) {
  expect_resume_matches(-1, 1, false, "serial_to_stage1");
}

TEST(ZeroCheckpoint, Stage1ResumesUnderStage2) {
  expect_resume_matches(1, 2, false, "stage1_to_stage2");
}

TEST(ZeroCheckpoint, Stage2Bf16ResumesSerial) {
  // The fp32 masters are gathered from the shards: without them the bf16 model alone would resume
  // from rounded weights.
  expect_resume_matches(2, -1, /*bf16=*/true, "stage2_bf16_to_serial");
}

TEST(ZeroCheckpoint, SerialBf16ResumesUnderStage2) {
  expect_resume_matches(-1, 2, true, "serial_bf16_to_stage2");
}

TEST(ZeroCheckpoint, WholeCheckpointEqualsTheSerialOne) {
  // The file written under ZeRO holds what a serial run writes after the same updates.
  const std::filesystem::path zero_path = checkpoint_path("whole_zero"), serial_path = checkpoint_path("whole_serial");
  Trained zero = build(2, false), serial = build(-1, false);
  train(zero, 0, 2);
  train(serial, 0, 2);
  engine::save_checkpoint(zero_path, *zero.engine, {}, {});
  if (comm::testing::world().rank() == 0) engine::save_checkpoint(serial_path, *serial.engine, {}, {});
  comm::testing::world().barrier();
  const nn::SafetensorsFile a = nn::load_safetensors(zero_path), b = nn::load_safetensors(serial_path);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [key, tensor] : b.tensors) {
    ASSERT_TRUE(a.tensors.contains(key)) << key;
    const Tensor& got = a.tensors.at(key);
    ASSERT_EQ(got.shape(), tensor.shape()) << key;
    ASSERT_EQ(got.dtype(), tensor.dtype()) << key;
    expect_close(got.to(DType::f64).contiguous().to_vector<double>(),
                 tensor.to(DType::f64).contiguous().to_vector<double>(), 1e-5, key);
  }
  comm::testing::world().barrier();
  if (comm::testing::world().rank() == 0) {
    std::filesystem::remove(zero_path);
    std::filesystem::remove(serial_path);
  }
}

TEST(ZeroEngine, ZeroGradDropsAnOpenWindow) {
  // The Trainer drops a window an epoch left open (Engine::zero_grad); stage 2 has already reduced
  // that window's micro-steps into its shard, which must go too.
  for (int stage : {1, 2}) {
    Trained zero = build(stage, false), serial = build(-1, false);
    for (Trained* t : {&zero, &serial}) {
      const HarnessCase c = mlp_case();
      auto [x, y] = c.rows(7, 0, t->rank * t->share, (t->rank + 1) * t->share);
      t->engine->step(x, y);  // the first micro-step of a window of 2
      t->engine->zero_grad();
    }
    expect_close(train(zero, 0, 2), train(serial, 0, 2), 1e-5, fmt::format("stage {} losses", stage));
    expect_close_by_norm(parameters(zero), parameters(serial), 1e-5, fmt::format("stage {} parameters", stage));
  }
}

TEST(ZeroEngine, TheStepsAllGathersRunIntoTheNextForward) {
  // Note [Gathers under the forward]: the MLP's layers (a Sequential's members) are the units; after
  // the first forward has shown their hooks run, each step leaves its all-gathers to the next
  // forward, and the numbers are those of gathering at the step's end, bit for bit.
  for (bool bf16 : {false, true}) {
    for (int stage : {1, 2}) {
      SCOPED_TRACE(fmt::format("stage {}{}", stage, bf16 ? " bf16" : ""));
      Trained under = build(stage, bf16), after = build(stage, bf16, 512, kAccumulation, /*gather_in_forward=*/false);
      const std::vector<double> losses_under = train(under, 0, 3), losses_after = train(after, 0, 3);
      const auto* zero = dynamic_cast<const parallel::zero::LowLevelZero*>(under.engine->zero());
      ASSERT_NE(zero, nullptr);
      EXPECT_TRUE(zero->parameters_in_buckets());
      EXPECT_TRUE(zero->gathers_under_forward());
      EXPECT_FALSE(dynamic_cast<const parallel::zero::LowLevelZero*>(after.engine->zero())->gathers_under_forward());
      EXPECT_EQ(losses_under, losses_after);
      EXPECT_EQ(parameters(under), parameters(after));
    }
  }
}

/// The MLP with its layers called through forward() instead of operator(), so that their forward
/// hooks never run.
class DirectCallMlp final : public nn::Module {
 public:
  explicit DirectCallMlp(const std::shared_ptr<nn::Module>& sequential) : Module("DirectCallMlp") {
    auto layers = std::make_shared<nn::ModuleList>();
    for (const auto& child : sequential->children()) layers->push_back(child);
    layers_ = register_module("layers", layers);
  }
  Tensor forward(const Tensor& input) override {
    Tensor x = input;
    for (const auto& layer : *layers_) x = layer->forward(x);
    return x;
  }

 private:
  std::shared_ptr<nn::ModuleList> layers_;
};

TEST(ZeroEngine, AModelThatSkipsItsUnitsHooksGathersAtTheStep) {
  // Note [Gathers under the forward]: the first forward shows that the layers' pre-hooks do not run,
  // so the all-gathers end with the step, and the numbers are the hooked model's.
  for (int stage : {1, 2}) {
    SCOPED_TRACE(fmt::format("stage {}", stage));
    Trained hooked = build(stage, false);
    Trained direct = build(stage, false, 512, kAccumulation, true, true, 2,
                           [](std::shared_ptr<nn::Module> mlp) { return std::make_shared<DirectCallMlp>(mlp); });
    const std::vector<double> losses = train(direct, 0, 3);
    EXPECT_EQ(losses, train(hooked, 0, 3));
    EXPECT_EQ(parameters(direct), parameters(hooked));
    EXPECT_TRUE(dynamic_cast<const parallel::zero::LowLevelZero*>(hooked.engine->zero())->gathers_under_forward());
    EXPECT_FALSE(dynamic_cast<const parallel::zero::LowLevelZero*>(direct.engine->zero())->gathers_under_forward());
  }
}

TEST(ZeroEngine, TheUpdateStepsTheEarlyShardsBesideTheLastReductions) {
  // Note [Update beside the last reductions] in engine/engine.cpp: without clipping the Engine steps
  // every bucket's shards but the last two while those are still reduce-scattered, then the rest:
  // the numbers of one update, bit for bit, and the serial run's within the harness's tolerance.
  for (bool bf16 : {false, true}) {
    for (int stage : {1, 2}) {
      SCOPED_TRACE(fmt::format("stage {}{}", stage, bf16 ? " bf16" : ""));
      // Buckets of 96 bytes: the MLP's parameters in enough of them that two are the late ones.
      Trained two = build(stage, bf16, 96, kAccumulation, true, /*clip=*/false, /*late_buckets=*/2);
      Trained one = build(stage, bf16, 96, kAccumulation, true, /*clip=*/false, /*late_buckets=*/0);
      Trained serial = build(-1, bf16, 512, kAccumulation, true, /*clip=*/false);
      const std::vector<double> losses = train(two, 0, 3);
      EXPECT_EQ(losses, train(one, 0, 3));
      EXPECT_EQ(parameters(two), parameters(one));
      expect_close(losses, train(serial, 0, 3), bf16 ? 3e-2 : 1e-5, "losses against the serial run");
      expect_close_by_norm(parameters(two), parameters(serial), bf16 ? 3e-2 : 1e-5,
                           "parameters against the serial run");
      // The handler's side: a window's late shards come back, and their gradients land with finish().
      auto* zero = dynamic_cast<parallel::zero::LowLevelZero*>(two.engine->zero());
      ASSERT_NE(zero, nullptr);
      const HarnessCase c = mlp_case();
      auto [x, y] = c.rows(5, 0, two.rank * two.share, (two.rank + 1) * two.share);
      zero->set_sync(true);
      two.engine->backward(two.engine->criterion(two.engine->forward(x), y));
      const std::vector<Tensor> late = zero->finish_all_but_late();
      size_t expected = 0;
      const size_t buckets = zero->partition().buckets().size();
      ASSERT_GT(buckets, 2u);
      for (size_t b = buckets - std::min<size_t>(2, buckets); b < buckets; ++b)
        expected += zero->partition().buckets()[b].params.size();
      EXPECT_EQ(late.size(), expected);
      zero->finish();
      for (const Tensor& shard : zero->shards()) EXPECT_TRUE(shard.grad().defined());
      zero->zero_grad();
      two.engine->optimizer().zero_grad();
    }
  }
}

// The ZeRO paper's accounting for mixed-precision Adam over Nd ranks (Psi parameters): 2 Psi of
// 16-bit parameters everywhere, and 12 Psi of fp32 masters and moments split Nd ways. Summed over
// the ranks the moments are exactly the serial optimizer's (the shards partition the parameters);
// the masters are the shard buffers, which hold each bucket's padding too.
TEST(ZeroEngine, ModelStatesAreShardedOverTheDataRanks) {
  const int nd = comm::testing::world().size();
  Trained serial = build(-1, /*bf16=*/true);
  train(serial, 0, 1);
  int64_t psi = 0;
  for (const Tensor& p : serial.model->parameters()) psi += p.numel();
  const parallel::zero::ModelStateBytes whole = engine::model_state_bytes(*serial.engine);
  EXPECT_EQ(whole.parameters, 2 * psi);
  EXPECT_EQ(whole.gradients, 2 * psi);
  EXPECT_EQ(whole.master_weights, 4 * psi);
  EXPECT_EQ(whole.optimizer_states, 8 * psi);
  for (int stage : {1, 2}) {
    // Buckets of 64 bytes: the stage-2 bucket in flight stays well below the whole gradients even
    // for this tiny model.
    Trained zero = build(stage, true, 64);
    train(zero, 0, 1);
    const auto& handler = dynamic_cast<const parallel::zero::LowLevelZero&>(*zero.engine->zero());
    const parallel::zero::ModelStateBytes mine = engine::model_state_bytes(*zero.engine);
    const int64_t shard = handler.partition().shard_numel();
    const auto buckets = static_cast<int64_t>(handler.partition().buckets().size());
    EXPECT_EQ(mine.parameters, 2 * psi) << "stage " << stage;
    EXPECT_EQ(mine.master_weights, 4 * shard) << "stage " << stage;
    EXPECT_LE(shard * nd, psi + buckets * (nd - 1)) << "stage " << stage << ": padding beyond a bucket's tail";
    Tensor summed = core::from_vector<int64_t>({mine.optimizer_states}, {1});
    comm::testing::world().all_reduce(summed, comm::ReduceOp::sum);
    EXPECT_EQ(summed.item<int64_t>(), 8 * psi) << "stage " << stage;
    EXPECT_LE(mine.optimizer_states, 8 * shard) << "stage " << stage;
    int64_t largest_bucket = 0;
    for (const auto& bucket : handler.partition().buckets())
      largest_bucket = std::max(largest_bucket, bucket.chunk * (nd + 1) * 2);
    // Stage 1 keeps the whole 16-bit gradients over the window and reduces them in its last backward
    // only, into a 16-bit shard (Note [Shard gradient dtype]); stage 2 accumulates the window's two
    // micro-steps in an f32 shard. Both with the buckets in flight.
    if (stage == 1) {
      EXPECT_EQ(mine.gradients, std::max(2 * psi, 2 * shard) + largest_bucket);
    } else {
      EXPECT_EQ(mine.gradients, 4 * shard + largest_bucket);
    }
  }
}

TEST(ZeroEngine, WithoutAccumulationTheShardGradientsStay16BitUntilTheStep) {
  // Note [Shard gradient dtype]: one backward per window adds nothing into the shard, so bf16's
  // reduced gradients wait there as they are (2 bytes, the ZeRO paper's count) until finish() makes
  // them the f32 gradients the optimizer steps; training equals the serial run as closely as with the f32 shard.
  const int nd = comm::testing::world().size();
  Trained serial = build(-1, /*bf16=*/true, 512, /*accumulation=*/1);
  const std::vector<double> want = train(serial, 0, 3);
  for (int stage : {1, 2}) {
    Trained zero = build(stage, true, 64, /*accumulation=*/1);
    expect_close(train(zero, 0, 3), want, 3e-2, fmt::format("stage {} losses", stage));
    expect_close_by_norm(parameters(zero), parameters(serial), 3e-2, fmt::format("stage {} parameters", stage));
    const auto& handler = dynamic_cast<const parallel::zero::LowLevelZero&>(*zero.engine->zero());
    int64_t largest_bucket = 0;
    for (const auto& bucket : handler.partition().buckets())
      largest_bucket = std::max(largest_bucket, bucket.chunk * (nd + 1) * 2);
    const int64_t shard = handler.partition().shard_numel();
    const parallel::zero::ModelStateBytes mine = engine::model_state_bytes(*zero.engine);
    EXPECT_EQ(mine.gradients, (stage == 1 ? std::max(mine.parameters, 2 * shard) : 2 * shard) + largest_bucket)
        << "stage " << stage;
  }
}

}  // namespace
}  // namespace colossal::testing

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
