// ZeRO-3 in one process (a group of one rank): the chunk manager's states, copies and accounting
// under each placement ("auto" made to evict by a small budget), parameters freed in place and
// gathered back under the tensors autograd saved, training through the Engine equal to the plain
// optimizer's, with the optimizer offloaded the same bits under every placement through one host
// buffer per chunk, and misuse refused naming what is wrong. The multi-rank equivalence is
// zero3_equivalence_mpi_test.cpp's (and zero_offload_tp_mpi_test.cpp's with offload).
#include "colossal/parallel/zero/zero3.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "colossal/comm/single_process_group.h"
#include "colossal/core/error.h"
#include "colossal/core/random.h"
#include "colossal/engine/engine.h"
#include "colossal/nn/activation.h"
#include "colossal/nn/linear.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/optim/adam.h"
#include "colossal/optim/lamb.h"
#include "colossal/parallel/zero/chunk_manager.h"

namespace colossal::parallel::zero {
namespace {

std::shared_ptr<nn::Sequential> mlp() {
  core::Generator init(7);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 8, true, &init), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Linear>(8, 3, true, &init)});
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

/// The MLP's parameters (w1 [8, 4], b1 [8], w2 [3, 8], b2 [3]: 128, 32, 96 and 12 bytes) in two
/// units, in chunks of at most 64 bytes: w1 alone (larger than a chunk), b1, w2 alone, b2.
struct Fixture {
  std::shared_ptr<nn::Sequential> model = mlp();
  std::vector<Tensor> params = model->parameters();
  std::vector<std::vector<float>> values;
  Fixture() {
    for (const Tensor& p : params) values.push_back(p.to_vector<float>());
  }
  std::unique_ptr<ChunkManager> manager(Placement placement, std::optional<int64_t> budget = std::nullopt) {
    return std::make_unique<ChunkManager>(params, std::vector<std::vector<size_t>>{{0, 1}, {2, 3}}, 64,
                                          comm::single_process_group(Device{}), placement, budget);
  }
};

TEST(ChunkManager, GathersAndFreesParametersInPlace) {
  Fixture f;
  const Tensor saved = f.params[0].detach();  // as autograd saves a weight: another handle, one storage
  auto chunks = f.manager(Placement::cuda);
  ASSERT_EQ(chunks->num_chunks(), 4u);
  EXPECT_EQ(chunks->unit_chunks(0), (std::vector<size_t>{0, 1}));
  for (size_t c = 0; c < 4; ++c) EXPECT_EQ(chunks->state(c), ChunkState::freed);
  for (const Tensor& p : f.params) EXPECT_EQ(p.storage().nbytes(), 0u) << "a freed parameter holds no memory";
  EXPECT_EQ(chunks->stats().device_shard_bytes, 128 + 32 + 96 + 12);

  chunks->prefetch(0);
  EXPECT_EQ(chunks->state(0), ChunkState::gathering);
  chunks->acquire(0);
  EXPECT_EQ(chunks->state(0), ChunkState::gathered);
  EXPECT_EQ(chunks->users(0), 1);
  EXPECT_EQ(f.params[0].to_vector<float>(), f.values[0]);
  EXPECT_EQ(saved.to_vector<float>(), f.values[0]) << "the saved handle sees the gathered chunk";
  EXPECT_EQ(f.params[1].storage().nbytes(), 0u) << "b1 is another chunk";
  chunks->acquire(0);  // a second user (a unit used twice)
  chunks->release(0);
  EXPECT_EQ(chunks->state(0), ChunkState::gathered);
  chunks->release(0);
  EXPECT_EQ(chunks->state(0), ChunkState::freed);
  EXPECT_EQ(saved.storage().nbytes(), 0u);
  EXPECT_EQ(chunks->stats().gathers, 1);
  EXPECT_EQ(chunks->stats().gathered_bytes, 0);
  EXPECT_EQ(chunks->stats().peak_gathered_bytes, 128);

  // The pieces the optimizer steps are views of the shards: a step there is what the next gather sees.
  chunks->piece(1).fill_(0.25);
  chunks->acquire(1);
  EXPECT_EQ(f.params[1].to_vector<float>(), std::vector<float>(8, 0.25f));
  chunks->release_all();
  EXPECT_EQ(chunks->state(1), ChunkState::freed);
}

TEST(ChunkManager, CpuPlacementCopiesShardsThroughTheDevice) {
  Fixture f;
  auto chunks = f.manager(Placement::cpu);
  const int64_t total = 128 + 32 + 96 + 12;
  for (size_t c = 0; c < 4; ++c) EXPECT_EQ(chunks->place(c), ShardPlace::host);
  EXPECT_EQ(chunks->stats().host_shard_bytes, total);
  EXPECT_EQ(chunks->stats().device_shard_bytes, 0);
  EXPECT_EQ(chunks->stats().evictions, 4);
  chunks->acquire(2);  // a host shard is copied to the device for the gather; it stays on the host
  EXPECT_EQ(f.params[2].to_vector<float>(), f.values[2]);
  EXPECT_EQ(chunks->stats().host_to_device_bytes, 96);
  EXPECT_EQ(chunks->place(2), ShardPlace::host);
  chunks->release(2);
  chunks->fetch_all();  // for the optimizer's step
  for (size_t c = 0; c < 4; ++c) EXPECT_EQ(chunks->place(c), ShardPlace::device);
  EXPECT_EQ(chunks->stats().device_shard_bytes, total);
  chunks->place_after_step();
  for (size_t c = 0; c < 4; ++c) EXPECT_EQ(chunks->place(c), ShardPlace::host);
  EXPECT_EQ(chunks->stats().device_to_host_bytes, 2 * total);
  chunks->acquire(0);
  EXPECT_EQ(f.params[0].to_vector<float>(), f.values[0]) << "the shards survive the round trip";
  chunks->release(0);
}

TEST(ChunkManager, AutoKeepsTheMostRecentlyUsedWithinItsBudget) {
  Fixture f;
  auto chunks = f.manager(Placement::auto_, /*budget=*/128);
  for (size_t c = 0; c < 4; ++c) EXPECT_EQ(chunks->place(c), ShardPlace::host) << "the warm-up step runs as cpu";
  for (size_t c : {0, 1, 2, 3}) {
    chunks->acquire(c);
    chunks->release(c);
  }
  chunks->acquire(3);  // the most recent: b2 (12 bytes), then w2 (96); w1 (128) no longer fits
  chunks->release(3);
  chunks->fetch_all();
  chunks->place_after_step();
  EXPECT_EQ(chunks->place(3), ShardPlace::device);
  EXPECT_EQ(chunks->place(2), ShardPlace::device);
  EXPECT_EQ(chunks->place(1), ShardPlace::host) << "b1 (32 bytes) would pass the budget after w2";
  EXPECT_EQ(chunks->place(0), ShardPlace::host);
  EXPECT_LE(chunks->stats().device_shard_bytes, 128);
  EXPECT_EQ(chunks->device_budget_bytes(), 128);
  for (size_t c = 0; c < 4; ++c) {
    chunks->acquire(c);
    EXPECT_EQ(f.params[chunks->chunk_params(c).front()].to_vector<float>(), f.values[chunks->chunk_params(c).front()]);
    chunks->release(c);
  }
}

TEST(ChunkManager, ADeviceShardHasOneHostBufferKeptAcrossMoves) {
  Fixture f;
  const int64_t total = 128 + 32 + 96 + 12;
  auto chunks = f.manager(Placement::cuda);
  EXPECT_FALSE(chunks->spare_host_buffer(2).defined()) << "made only when asked for";
  const Tensor buffer = chunks->host_buffer(2);
  EXPECT_EQ(buffer.numel(), chunks->shard_numel(2));
  EXPECT_EQ(buffer.to_vector<float>(), std::vector<float>(24, 0.0f));
  EXPECT_EQ(chunks->host_buffer(2).raw_data(), buffer.raw_data()) << "made once";
  EXPECT_EQ(chunks->stats().spare_host_bytes, 96);

  Fixture g;  // a manager frees its parameters: another model
  auto cpu = g.manager(Placement::cpu);
  EXPECT_EQ(cpu->stats().spare_host_bytes, 0) << "the host shards are the host buffers";
  EXPECT_NE(message_of([&] { cpu->host_buffer(0); }).find("on the host"), std::string::npos);
  const void* host_shard = cpu->shard(0).raw_data();
  cpu->fetch_all();
  EXPECT_EQ(cpu->spare_host_buffer(0).raw_data(), host_shard) << "the host shard's memory is kept as the spare";
  EXPECT_EQ(cpu->host_buffer(0).raw_data(), host_shard);
  EXPECT_EQ(cpu->stats().spare_host_bytes, total);
  EXPECT_EQ(cpu->stats().host_shard_bytes, 0);
  cpu->place_after_step();
  EXPECT_EQ(cpu->shard(0).raw_data(), host_shard) << "an eviction copies the shard into its spare";
  EXPECT_FALSE(cpu->spare_host_buffer(0).defined());
  EXPECT_EQ(cpu->stats().spare_host_bytes, 0);
  EXPECT_EQ(cpu->stats().host_shard_bytes, total);
}

TEST(ChunkManager, RefusesParametersThatShareMemory) {
  auto weight = core::zeros({4, 4});
  std::vector<Tensor> views = {weight.narrow(0, 0, 2), weight.narrow(0, 2, 2)};
  const std::string message = message_of([&] {
    ChunkManager(views, {{0, 1}}, 64, comm::single_process_group(Device{}), Placement::cuda, std::nullopt);
  });
  EXPECT_NE(message.find("must own its memory"), std::string::npos) << message;
}

// Training through the Engine, every placement, against the plain AdamW on the same model. With one
// rank the reduce-scatter is the identity and AdamW is elementwise: the shards step exactly the
// elements of the whole tensors; only the clipping norm's sum runs over other tensors (pieces of the
// chunks), a rounding of the f32 sum: 1e-6 relative.
TEST(Zero3, OneRankTrainsAsThePlainOptimizer) {
  for (Placement placement : {Placement::cuda, Placement::cpu, Placement::auto_}) {
    auto zero_model = mlp(), plain_model = mlp();
    engine::Criterion criterion = [](const Tensor& out, const Tensor& y) { return ops::cross_entropy(out, y); };
    engine::EngineOptions zero_options;
    zero_options.gradient_accumulation = 2;
    zero_options.clip_grad_norm = 0.05;
    engine::EngineOptions plain_options = zero_options;
    zero_options.zero = ZeroOptions{.stage = 3, .chunk_bytes = 64, .placement = placement, .device_budget_bytes = 64};
    engine::Engine zero(zero_model, std::make_shared<optim::AdamW>(zero_model->parameters()), criterion, zero_options);
    engine::Engine plain(plain_model, std::make_shared<optim::AdamW>(plain_model->parameters()), criterion,
                         plain_options);
    ASSERT_NE(zero.zero(), nullptr);
    EXPECT_EQ(zero.zero()->stage(), 3);
    const auto& handler = dynamic_cast<const Zero3&>(*zero.zero());
    EXPECT_EQ(handler.unit_names(), (std::vector<std::string>{"0", "2", ""}));
    const Tensor x = core::from_vector<float>({0.1f, -0.4f, 0.7f, 0.2f, -0.3f, 0.5f, 0.9f, -0.8f}, {2, 4});
    const Tensor y = core::from_vector<int64_t>({2, 0}, {2});
    for (int step = 0; step < 6; ++step) {
      const float a = zero.step(x, y).item<float>(), b = plain.step(x, y).item<float>();
      EXPECT_NEAR(a, b, 1e-6 * std::abs(b)) << "step " << step;
      for (size_t c = 0; c < handler.chunks().num_chunks(); ++c) {
        EXPECT_EQ(handler.chunks().state(c), ChunkState::freed) << "step " << step << ": nothing stays gathered";
      }
    }
    const nn::StateDict whole = zero.zero()->gather_model_state(zero_model->state_dict());
    for (const auto& [name, p] : plain_model->named_parameters()) {
      const std::vector<float> got = whole.at(name).to_vector<float>(), want = p.to_vector<float>();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << name;
    }
    const ModelStateBytes bytes = zero.zero()->model_state_bytes();
    EXPECT_EQ(bytes.parameters, 4 * zero_model->num_parameters());
    EXPECT_EQ(bytes.optimizer_states, 8 * zero_model->num_parameters() + 0) << "exp_avg and exp_avg_sq, f32";
    if (placement == Placement::cpu) {
      EXPECT_GT(handler.chunks().stats().host_to_device_bytes, 0);
    }
    if (placement == Placement::auto_) {
      EXPECT_LE(handler.chunks().stats().device_shard_bytes, 64);
    }
  }
}

// Optimizer offload under each placement ("auto" made to keep some chunks on the device and evict
// the rest by its budget): the host step writes a host shard's update into the shard and a device
// shard's into the chunk manager's spare host buffer of it, then copied to the device, so every chunk
// has one host buffer whatever its placement and the host memory counts each once; the offload makes
// no staging buffer of its own. Training gives the same bits under every placement (the same host
// step on the same gradients), with the step after the clipping norm and during backward (without
// clipping the Engine has the worker thread step each chunk as its gradient arrives).
TEST(Zero3, OffloadStagesDeviceShardsInTheirHostBuffers) {
  const Tensor x = core::from_vector<float>({0.1f, -0.4f, 0.7f, 0.2f, -0.3f, 0.5f, 0.9f, -0.8f}, {2, 4});
  const Tensor y = core::from_vector<int64_t>({2, 0}, {2});
  engine::Criterion criterion = [](const Tensor& out, const Tensor& y) { return ops::cross_entropy(out, y); };
  for (const bool clip : {true, false}) {
    std::vector<float> reference_losses;
    nn::StateDict reference;
    int64_t reference_host_bytes = 0;
    for (Placement placement : {Placement::cpu, Placement::cuda, Placement::auto_}) {
      SCOPED_TRACE(::testing::Message() << "clip " << clip << ", placement " << static_cast<int>(placement));
      auto model = mlp();
      engine::EngineOptions options;
      options.gradient_accumulation = 2;
      if (clip) options.clip_grad_norm = 0.05;
      options.zero = ZeroOptions{
          .stage = 3, .offload_optimizer = true, .chunk_bytes = 64, .placement = placement, .device_budget_bytes = 64};
      engine::Engine engine(model, std::make_shared<optim::AdamW>(model->parameters()), criterion, options);
      const auto& handler = dynamic_cast<const Zero3&>(*engine.zero());
      ASSERT_NE(handler.offload(), nullptr);
      const ChunkManager& chunks = handler.chunks();
      const int64_t total = 128 + 32 + 96 + 12;
      bool saw_device = false, saw_host = false;
      std::vector<float> losses;
      for (int step = 0; step < 6; ++step) {
        losses.push_back(engine.step(x, y).item<float>());
        for (size_t c = 0; c < chunks.num_chunks(); ++c) {
          const Tensor buffer = handler.offload()->output_buffer(c);
          ASSERT_TRUE(buffer.defined());
          if (chunks.place(c) == ShardPlace::device) {
            saw_device = true;
            EXPECT_TRUE(handler.offload()->output_copied_to_device(c));
            EXPECT_EQ(buffer.raw_data(), chunks.spare_host_buffer(c).raw_data())
                << "chunk " << c << ": the update is staged in the chunk manager's host buffer";
          } else {
            saw_host = true;
            EXPECT_FALSE(handler.offload()->output_copied_to_device(c));
            EXPECT_EQ(buffer.raw_data(), chunks.shard(c).raw_data()) << "chunk " << c;
            EXPECT_FALSE(chunks.spare_host_buffer(c).defined());
          }
        }
        EXPECT_EQ(chunks.stats().host_shard_bytes + chunks.stats().spare_host_bytes, total) << "step " << step;
      }
      EXPECT_TRUE(saw_device || placement == Placement::cpu);
      EXPECT_TRUE(saw_host || placement == Placement::cuda);
      // Masters and the host gradient (f32, 4 bytes each), AdamW's two moments, the chunks' buffers
      // (f32): no staging of the offload's own. Pinned memory exists only on a GPU machine.
      const int64_t n = model->num_parameters();
      EXPECT_EQ(handler.offload()->host_bytes(), (4 + 4 + 8) * n);
      EXPECT_EQ(handler.host_bytes(), (4 + 4 + 8) * n + total);
      EXPECT_EQ(handler.pinned_host_bytes(), 0);
      const nn::StateDict whole = engine.zero()->gather_model_state(model->state_dict());
      if (placement == Placement::cpu) {
        reference_losses = losses;
        reference = whole;
        reference_host_bytes = handler.host_bytes();
        continue;
      }
      EXPECT_EQ(losses, reference_losses);
      EXPECT_EQ(handler.host_bytes(), reference_host_bytes);
      for (const auto& [name, p] : reference) {
        EXPECT_EQ(whole.at(name).to_vector<float>(), p.to_vector<float>()) << name;
      }
    }
  }
}

TEST(Zero3, RefusesMisuse) {
  const auto group = comm::single_process_group(Device{});
  {
    auto model = mlp();
    optim::Lamb lamb(model->parameters());
    const std::string message = message_of([&] { Zero3(*model, lamb, nullptr, group, ZeroOptions{.stage = 3}); });
    EXPECT_NE(message.find("LAMB"), std::string::npos) << message;
    EXPECT_NE(message.find("zero.stage = 1 or 2"), std::string::npos) << message;
  }
  {
    auto model = mlp();
    model->parameter("0.bias").set_requires_grad(false);
    optim::AdamW adamw(model->parameters());
    const std::string message = message_of([&] { Zero3(*model, adamw, nullptr, group, ZeroOptions{.stage = 3}); });
    EXPECT_NE(message.find("'0.bias'"), std::string::npos) << message;
    EXPECT_NE(message.find("frozen"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace colossal::parallel::zero
