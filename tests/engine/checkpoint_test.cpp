// Checkpoints: a run stopped after a checkpoint and resumed from it continues with exactly the
// losses of the run that never stopped (== on f64, at a step inside an epoch and at an epoch's
// end, with shuffling, dropout, AdamW, a warmup-cosine schedule and gradient accumulation), and
// bad checkpoints fail with the file and the key named.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colossal/amp/mixed_precision_optimizer.h"
#include "colossal/core/error.h"
#include "colossal/core/random.h"
#include "colossal/data/data_loader.h"
#include "colossal/engine/checkpoint.h"
#include "colossal/engine/engine.h"
#include "colossal/engine/trainer.h"
#include "colossal/nn/dropout.h"
#include "colossal/nn/linear.h"
#include "colossal/nn/module.h"
#include "colossal/nn/safetensors.h"
#include "colossal/ops/nn_functional.h"  // cross_entropy
#include "colossal/optim/adam.h"
#include "colossal/optim/lr_scheduler.h"
#include "engine_test_util.h"

namespace colossal::engine {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kEpochs = 3;
constexpr int64_t kSamples = 10;  // 5 batches of 2 per epoch, 15 iterations in all

/// Records every training loss; throws after `stop_after` iterations (a crash), if set.
class LossRecorder : public Hook {
 public:
  explicit LossRecorder(std::optional<int64_t> stop_after = std::nullopt) : Hook(200), stop_after_(stop_after) {}
  void after_train_iter(Trainer& trainer, const Tensor&, const Tensor&, const Tensor& loss) override {
    losses.push_back(loss.item<double>());
    steps.push_back(trainer.cur_step());
    if (stop_after_ && trainer.cur_step() + 1 == *stop_after_) throw std::runtime_error("simulated crash");
  }
  std::vector<double> losses;
  std::vector<int64_t> steps;

 private:
  std::optional<int64_t> stop_after_;
};

/// Everything a run builds from its seed: the same seed gives bitwise the same run.
struct TinyRun {
  core::Generator init{11}, dropout{12};
  std::shared_ptr<nn::Sequential> model;
  std::shared_ptr<optim::AdamW> optimizer;
  std::shared_ptr<optim::LRScheduler> scheduler;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<data::DataLoader> loader;

  explicit TinyRun(std::optional<amp::AmpMode> amp_mode = std::nullopt) {
    auto l1 = std::make_shared<nn::Linear>(3, 8, true, &init);
    auto l2 = std::make_shared<nn::Linear>(8, 2, true, &init);
    model = std::make_shared<nn::Sequential>(
        std::initializer_list<std::shared_ptr<nn::Module>>{l1, std::make_shared<nn::Dropout>(0.3, &dropout), l2});
    if (!amp_mode) model->to(DType::f64);  // mixed precision starts from f32
    optim::AdamOptions adam = optim::adamw_defaults();
    adam.lr = 0.05;
    adam.weight_decay = 0.01;
    optimizer = std::make_shared<optim::AdamW>(model->parameters(), adam);
    // 15 iterations / 2 per update (the window left open at each epoch's end is dropped) = 6 updates.
    scheduler = std::make_shared<optim::CosineAnnealingWarmupLR>(*optimizer, 6, 2, 1e-3);
    EngineOptions options;
    options.gradient_accumulation = 2;
    options.clip_grad_norm = 0.5;
    if (amp_mode) options.amp = amp::AmpOptions::for_mode(*amp_mode);
    engine = std::make_unique<Engine>(
        model, optimizer, [](const Tensor& out, const Tensor& target) { return ops::cross_entropy(out, target); },
        options, scheduler);
    data::DataLoaderOptions lo = testing::batches_of(2);
    lo.shuffle = true;
    lo.seed = 5;
    loader = std::make_unique<data::DataLoader>(std::make_shared<testing::TinyClassificationDataset>(kSamples), lo);
  }
  NamedGenerators generators() { return {{"dropout", &dropout}}; }
};

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("colossal_checkpoint_test_" + name + "_" +
                                                    std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  fs::remove_all(dir);
  return dir;
}

std::vector<double> uninterrupted_losses(std::optional<amp::AmpMode> amp_mode = std::nullopt) {
  TinyRun run(amp_mode);
  auto recorder = std::make_shared<LossRecorder>();
  Trainer trainer(*run.engine);
  trainer.fit(*run.loader, kEpochs, nullptr, 1, {recorder});
  return recorder->losses;
}

/// Trains with checkpoints every update and every epoch, crashes after `crash_after` iterations,
/// resumes a fresh run from the newest checkpoint and returns the losses the two runs saw, the first
/// cut at the checkpoint's step.
std::vector<double> crashed_and_resumed(int64_t crash_after, const fs::path& dir, TrainPosition* resumed_at,
                                        std::optional<amp::AmpMode> amp_mode = std::nullopt) {
  std::vector<double> losses;
  {
    TinyRun run(amp_mode);
    auto recorder = std::make_shared<LossRecorder>(crash_after);
    Trainer trainer(*run.engine);
    EXPECT_THROW(trainer.fit(*run.loader, kEpochs, nullptr, 1,
                             {recorder, std::make_shared<SaveCheckpointHook>(dir, run.generators(), 1, 1)}),
                 std::runtime_error);
    losses = recorder->losses;
  }
  TinyRun run(amp_mode);
  const CheckpointInfo info = load_checkpoint(find_checkpoint(dir), *run.engine, run.generators());
  *resumed_at = info.position;
  losses.resize(static_cast<size_t>(info.position.step));
  auto recorder = std::make_shared<LossRecorder>();
  Trainer trainer(*run.engine);
  trainer.resume_at(info.position);
  trainer.fit(*run.loader, kEpochs, nullptr, 1, {recorder});
  EXPECT_EQ(recorder->steps.front(), info.position.step);
  losses.insert(losses.end(), recorder->losses.begin(), recorder->losses.end());
  return losses;
}

TEST(Checkpoint, ResumeInsideAnEpochRepeatsTheLossesBitForBit) {
  const std::vector<double> expected = uninterrupted_losses();
  ASSERT_EQ(expected.size(), static_cast<size_t>(kEpochs * kSamples / 2));
  const fs::path dir = fresh_dir("mid");
  // Crash at iteration 9 (epoch 1, its 4th batch): the newest checkpoint is the update after
  // iteration 8 (the 2nd update of epoch 1), so the resumed run starts at epoch 1, batch 3.
  TrainPosition at;
  const std::vector<double> got = crashed_and_resumed(9, dir, &at);
  EXPECT_EQ(at, (TrainPosition{1, 4, 9})) << at.epoch << " " << at.iter << " " << at.step;
  EXPECT_EQ(got, expected);
  fs::remove_all(dir);
}

TEST(Checkpoint, ResumeAtAnEpochsEndRepeatsTheLossesBitForBit) {
  const std::vector<double> expected = uninterrupted_losses();
  const fs::path dir = fresh_dir("end");
  // Crash at iteration 6, the first of epoch 1: the newest checkpoint is epoch 0's end.
  TrainPosition at;
  const std::vector<double> got = crashed_and_resumed(6, dir, &at);
  EXPECT_EQ(at, (TrainPosition{1, 0, 5}));
  EXPECT_EQ(got, expected);
  fs::remove_all(dir);
}

// Mixed precision adds the loss scaler and the fp32 master weights to the state; with them the
// resumed fp16 and bf16 runs also repeat their losses exactly.
TEST(Checkpoint, ResumeUnderMixedPrecisionRepeatsTheLossesBitForBit) {
  for (const amp::AmpMode mode : {amp::AmpMode::naive, amp::AmpMode::bf16}) {
    SCOPED_TRACE(mode == amp::AmpMode::naive ? "naive fp16" : "bf16");
    const std::vector<double> expected = uninterrupted_losses(mode);
    const fs::path dir = fresh_dir("amp");
    TrainPosition at;
    const std::vector<double> got = crashed_and_resumed(9, dir, &at, mode);
    EXPECT_EQ(at, (TrainPosition{1, 4, 9}));
    EXPECT_EQ(got, expected);
    // The model tensors are 16-bit; the export view takes the fp32 masters instead.
    const nn::StateDict exported = load_checkpoint_model_state(find_checkpoint(dir));
    EXPECT_EQ(exported.at("0.weight").dtype(), DType::f32);
    // A run without mixed precision cannot take this checkpoint.
    TinyRun plain;
    const std::string message = [&] {
      try {
        load_checkpoint(find_checkpoint(dir), *plain.engine, plain.generators());
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string();
    }();
    EXPECT_NE(message.find("mixed precision"), std::string::npos) << message;
    fs::remove_all(dir);
  }
}

TEST(Checkpoint, RestoresEveryTensorAndTheGenerators) {
  const fs::path dir = fresh_dir("state");
  TinyRun a;
  Trainer trainer(*a.engine);
  trainer.fit(*a.loader, 1, nullptr, 1, {});
  a.engine->zero_grad();  // 5 batches in windows of 2: the epoch's last window is dropped
  save_checkpoint(dir / "c.safetensors", *a.engine, a.generators(), {{1, 0, 5}, a.engine->num_updates(), {{"k", "v"}}});

  TinyRun b;
  const CheckpointInfo info = load_checkpoint(dir / "c.safetensors", *b.engine, b.generators());
  EXPECT_EQ(info.position, (TrainPosition{1, 0, 5}));
  EXPECT_EQ(info.num_updates, a.engine->num_updates());
  EXPECT_EQ(b.engine->num_updates(), a.engine->num_updates());
  EXPECT_EQ(info.extra.at("k"), "v");
  EXPECT_EQ(b.dropout.state(), a.dropout.state());
  EXPECT_EQ(b.scheduler->last_step(), a.scheduler->last_step());
  EXPECT_EQ(b.optimizer->param_groups()[0].options.at("lr"), a.optimizer->param_groups()[0].options.at("lr"));
  const nn::StateDict sa = a.model->state_dict(), sb = b.model->state_dict();
  for (const auto& [name, tensor] : sa) {
    EXPECT_EQ(tensor.to_vector<double>(), sb.at(name).to_vector<double>()) << name;
  }
  const optim::StateDict oa = a.optimizer->state_dict(), ob = b.optimizer->state_dict();
  ASSERT_EQ(oa.size(), ob.size());
  for (const auto& [name, tensor] : oa) {
    EXPECT_EQ(tensor.to(DType::f64).to_vector<double>(), ob.at(name).to(DType::f64).to_vector<double>()) << name;
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, RefusesToSaveInsideAnAccumulationWindow) {
  TinyRun run;
  data::Batch batch = *run.loader->next();
  run.engine->step(batch.input, batch.target);  // 1 of 2 micro-steps
  try {
    save_checkpoint(fresh_dir("window") / "c.safetensors", *run.engine, run.generators(), {});
    FAIL() << "saved mid-window";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 micro-step"), std::string::npos) << e.what();
  }
}

/// The message of what `fn` throws as colossal::Error ("" if nothing).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Checkpoint, BadCheckpointsNameTheFileAndTheProblem) {
  const fs::path dir = fresh_dir("bad");
  fs::create_directories(dir);
  TinyRun good;
  const fs::path path = dir / "good.safetensors";
  save_checkpoint(path, *good.engine, good.generators(), {});

  // Plain weights are not a training checkpoint.
  nn::save_safetensors(dir / "weights.safetensors", good.model->state_dict());
  TinyRun run;
  std::string message = error_of([&] { load_checkpoint(dir / "weights.safetensors", *run.engine, run.generators()); });
  EXPECT_NE(message.find("not a colossal training checkpoint"), std::string::npos) << message;
  EXPECT_NE(message.find("weights.safetensors"), std::string::npos) << message;

  // A model of another shape: the offending parameter is named.
  {
    core::Generator init(1);
    auto other = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(3, 4, true, &init), std::make_shared<nn::Dropout>(0.3),
        std::make_shared<nn::Linear>(4, 2, true, &init)});
    other->to(DType::f64);
    auto opt = std::make_shared<optim::AdamW>(other->parameters(), optim::adamw_defaults());
    Engine engine(other, opt, testing::mse);
    message = error_of([&] { load_checkpoint(path, engine, {}); });
    EXPECT_NE(message.find("0.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("good.safetensors"), std::string::npos) << message;
  }

  // A generator the checkpoint has no state for.
  core::Generator extra(3);
  NamedGenerators generators = run.generators();
  generators["augment"] = &extra;
  message = error_of([&] { load_checkpoint(path, *run.engine, generators); });
  EXPECT_NE(message.find("\"augment\""), std::string::npos) << message;

  // Truncated: the safetensors reader names the file; nothing crashes.
  const auto size = fs::file_size(path);
  fs::copy_file(path, dir / "cut.safetensors");
  fs::resize_file(dir / "cut.safetensors", size / 2);
  message = error_of([&] { load_checkpoint(dir / "cut.safetensors", *run.engine, run.generators()); });
  EXPECT_NE(message.find("cut.safetensors"), std::string::npos) << message;

  // find_checkpoint skips what is not a checkpoint and picks the most steps.
  save_checkpoint(dir / checkpoint_file_name({2, 0, 10}), *good.engine, good.generators(), {{2, 0, 10}, 0, {}});
  EXPECT_EQ(find_checkpoint(dir).filename(), "epoch2-step10.safetensors");
  message = error_of([&] { find_checkpoint(dir / "nothing-here"); });
  EXPECT_NE(message.find("nothing-here"), std::string::npos) << message;
  fs::remove_all(dir);
  fs::create_directories(dir);
  message = error_of([&] { find_checkpoint(dir); });
  EXPECT_NE(message.find("holds no colossal checkpoint"), std::string::npos) << message;
  fs::remove_all(dir);
}

/// The checkpoint at `from` written to `to` with tensor `key` replaced by `value` (metadata kept).
void replace_tensor(const fs::path& from, const fs::path& to, const std::string& key, const Tensor& value) {
  nn::SafetensorsFile file = nn::load_safetensors(from);
  ASSERT_TRUE(file.tensors.contains(key)) << key;
  file.tensors.insert_or_assign(key, value);
  nn::save_safetensors(to, file.tensors, file.metadata);
}

/// A tensor of `like`'s shape holding arbitrary i32 bits (what a mislabelled F32 would read as).
Tensor int32_like(const Tensor& like) {
  std::vector<int32_t> values(static_cast<size_t>(like.numel()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int32_t>(1065353216 + i);  // bits of 1.0f, ...
  return core::from_vector(values, like.shape());
}

// Resuming restores state bit for bit, so a tensor stored in another dtype than the one the model,
// optimizer, scheduler or loss scaler holds is refused, naming the tensor, the file and both dtypes,
// whether a cast would be exact (F32 into F64) or reinterpret bits (I32).
TEST(Checkpoint, RefusesTensorsOfAnotherDtypeNamingBoth) {
  const fs::path dir = fresh_dir("dtype");
  fs::create_directories(dir);
  TinyRun trained;
  Trainer trainer(*trained.engine);
  trainer.fit(*trained.loader, 1, nullptr, 1, {});
  trained.engine->zero_grad();
  const fs::path good = dir / "good.safetensors";
  save_checkpoint(good, *trained.engine, trained.generators(), {{1, 0, 5}, trained.engine->num_updates(), {}});
  const nn::SafetensorsFile file = nn::load_safetensors(good);

  struct Case {
    std::string key;
    Tensor value;
    const char* stored;
    const char* expected;
  };
  const Tensor weight = file.tensors.at("model.0.weight");
  const std::vector<Case> cases = {
      {"model.0.weight", weight.to(DType::f32), "F32", "F64"},
      {"model.2.bias", int32_like(file.tensors.at("model.2.bias")), "I32", "F64"},
      {"optimizer.state.0.exp_avg", file.tensors.at("optimizer.state.0.exp_avg").to(DType::f16), "F16", "F64"},
      {"optimizer.state.0.step", core::scalar_tensor(3.0, DType::f64), "F64", "I64"},
      {"lr_scheduler.last_step", core::scalar_tensor(2.0, DType::f32), "F32", "I64"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    const fs::path bad = dir / "bad.safetensors";
    replace_tensor(good, bad, c.key, c.value);
    TinyRun run;
    const std::string message = error_of([&] { load_checkpoint(bad, *run.engine, run.generators()); });
    EXPECT_NE(message.find("\"" + c.key + "\""), std::string::npos) << message;
    EXPECT_NE(message.find("bad.safetensors"), std::string::npos) << message;
    EXPECT_NE(message.find(std::string("stored as ") + c.stored), std::string::npos) << message;
    EXPECT_NE(message.find(std::string("holds it as ") + c.expected), std::string::npos) << message;
  }

  // Under fp16 the fp32 master weights and the loss scale are state too.
  TinyRun amp_run(amp::AmpMode::naive);
  save_checkpoint(good, *amp_run.engine, amp_run.generators(), {});
  for (const auto& [key, value] : std::vector<std::pair<std::string, Tensor>>{
           {"amp.master.0.weight", nn::load_safetensors(good).tensors.at("amp.master.0.weight").to(DType::f16)},
           {"amp.scaler.scale", core::scalar_tensor(1024.0, DType::f64)}}) {
    SCOPED_TRACE(key);
    replace_tensor(good, dir / "bad.safetensors", key, value);
    TinyRun run(amp::AmpMode::naive);
    const std::string message =
        error_of([&] { load_checkpoint(dir / "bad.safetensors", *run.engine, run.generators()); });
    EXPECT_NE(message.find("\"" + key + "\""), std::string::npos) << message;
    EXPECT_NE(message.find("holds it as F32"), std::string::npos) << message;
  }
  fs::remove_all(dir);
}

// --resume given plain weights says what the file is and how to start from it, in config terms.
TEST(Checkpoint, WeightsGivenToResumeSuggestModelWeights) {
  const fs::path dir = fresh_dir("weights");
  fs::create_directories(dir);
  TinyRun run;
  const fs::path weights = dir / "weights.safetensors";
  nn::save_safetensors(weights, run.model->state_dict(), {{"format", "pt"}});
  const std::string message = error_of([&] { load_checkpoint(weights, *run.engine, run.generators()); });
  EXPECT_NE(message.find("is a weights file"), std::string::npos) << message;
  EXPECT_NE(message.find("model.weights = \"" + weights.string() + "\""), std::string::npos) << message;
  EXPECT_EQ(message.find("nn::"), std::string::npos) << "names a C++ API: " << message;
  // `colossal export` of the same file speaks of export.
  const std::string exported = error_of([&] { load_checkpoint_model_state(weights); });
  EXPECT_NE(exported.find("export"), std::string::npos) << exported;
  EXPECT_EQ(exported.find("resume"), std::string::npos) << exported;
  const std::string missing = error_of([&] { find_checkpoint(dir / "absent.safetensors", "export"); });
  EXPECT_NE(missing.find("export: "), std::string::npos) << missing;
  EXPECT_NE(missing.find("absent.safetensors does not exist"), std::string::npos) << missing;
  EXPECT_EQ(missing.find("resume"), std::string::npos) << missing;
  fs::remove_all(dir);
}

// A folder whose newest checkpoint cannot be read is an error naming it, not a silent step back to
// an older one; an unreadable file older than the newest readable checkpoint is skipped.
TEST(Checkpoint, UnreadableNewestCheckpointIsAnErrorNotSkipped) {
  const fs::path dir = fresh_dir("unreadable");
  fs::create_directories(dir);
  TinyRun run;
  save_checkpoint(dir / checkpoint_file_name({1, 0, 5}), *run.engine, run.generators(), {{1, 0, 5}, 2, {}});
  save_checkpoint(dir / checkpoint_file_name({2, 0, 10}), *run.engine, run.generators(), {{2, 0, 10}, 4, {}});
  const fs::path newest = dir / "epoch2-step10.safetensors";
  fs::resize_file(newest, fs::file_size(newest) / 2);  // a disk that filled up mid-write, say

  std::string message = error_of([&] { find_checkpoint(dir); });
  EXPECT_NE(message.find("epoch2-step10.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("cannot be read"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << "the reader's reason: " << message;
  EXPECT_NE(message.find((dir / "epoch1-step5.safetensors").string()), std::string::npos)
      << "the way to take the older one on purpose: " << message;

  // Older than the newest readable one: reported, skipped.
  save_checkpoint(dir / checkpoint_file_name({3, 0, 15}), *run.engine, run.generators(), {{3, 0, 15}, 6, {}});
  EXPECT_EQ(find_checkpoint(dir).filename(), "epoch3-step15.safetensors");

  // Under a name that tells no position, its date decides: written last, it is the newest.
  fs::copy_file(newest, dir / "renamed.safetensors");
  message = error_of([&] { find_checkpoint(dir); });
  EXPECT_NE(message.find("renamed.safetensors"), std::string::npos) << message;

  // Nothing readable at all: the unreadable file is named, not "no checkpoint".
  fs::remove(dir / "renamed.safetensors");
  fs::remove(dir / "epoch1-step5.safetensors");
  fs::remove(dir / "epoch3-step15.safetensors");
  message = error_of([&] { find_checkpoint(dir); });
  EXPECT_NE(message.find("no readable colossal checkpoint"), std::string::npos) << message;
  EXPECT_NE(message.find("epoch2-step10.safetensors"), std::string::npos) << message;
  fs::remove_all(dir);
}

// A checkpoint that cannot be written is an error naming the file and the system's reason, and
// leaves the previous file under that name and no temporary behind.
TEST(Checkpoint, FailedSaveNamesTheFileAndTheReasonAndKeepsTheOldOne) {
  const fs::path dir = fresh_dir("full");
  fs::create_directories(dir);
  TinyRun run;
  const fs::path path = dir / "c.safetensors";
  save_checkpoint(path, *run.engine, run.generators(), {});
  const auto size = fs::file_size(path);
  std::string message;
  {
    const testing::FileSizeLimit limit(size / 2);  // as a disk with half a checkpoint free
    message = error_of([&] { save_checkpoint(path, *run.engine, run.generators(), {{0, 0, 1}, 0, {}}); });
  }
  EXPECT_NE(message.find("checkpoint " + path.string() + " not saved"), std::string::npos) << message;
  EXPECT_NE(message.find("File too large"), std::string::npos) << message;
  EXPECT_EQ(fs::file_size(path), size);
  int64_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1) << "a temporary file was left behind";

  // A folder that cannot be made (a file is in the way) is a colossal::Error too, with the reason.
  std::ofstream(dir / "blocker") << "x";
  message = error_of([&] { save_checkpoint(dir / "blocker" / "c.safetensors", *run.engine, run.generators(), {}); });
  EXPECT_NE(message.find("blocker"), std::string::npos) << message;
  EXPECT_NE(message.find("Not a directory"), std::string::npos) << message;
  fs::remove_all(dir);
}

// NaN weights are never written as something to resume from.
TEST(Checkpoint, RefusesToSaveNonFiniteWeights) {
  const fs::path dir = fresh_dir("nan");
  TinyRun run;
  run.model->named_parameters().at(2).second.detach().fill_(std::nan(""));  // "2.weight"
  const std::string message = error_of([&] {
    save_checkpoint(dir / "c.safetensors", *run.engine, run.generators(), {{0, 3, 3}, 1, {}});
  });
  EXPECT_NE(message.find("\"model.2.weight\""), std::string::npos) << message;
  EXPECT_NE(message.find("NaN"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(dir / "c.safetensors"));
  fs::remove_all(dir);
}

TEST(Checkpoint, HookKeepsTheNewestFiles) {
  const fs::path dir = fresh_dir("keep");
  TinyRun run;
  auto hook = std::make_shared<SaveCheckpointHook>(dir, run.generators(), 1, 1, std::map<std::string, std::string>{},
                                                   /*keep=*/2);
  Trainer trainer(*run.engine);
  trainer.fit(*run.loader, 2, nullptr, 1, {hook});
  ASSERT_EQ(hook->written().size(), 2u);
  int64_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 2);
  // The last one is the end of epoch 1 (2 epochs done, 10 steps), which superseded the step checkpoint
  // of that epoch's last update.
  EXPECT_EQ(hook->written().back().filename(), "epoch2-step10.safetensors");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace colossal::engine
