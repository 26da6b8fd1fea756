// Checkpoints: see checkpoint.h.
#include "colossal/engine/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <system_error>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "colossal/core/error.h"
#include "colossal/nn/safetensors.h"

namespace colossal::engine {

// Note [Bit-exact resume]
// A resumed run repeats the uninterrupted run's arithmetic exactly when everything that feeds a
// step is restored bit for bit: parameters and buffers (BatchNorm statistics), optimizer moments
// and step counts, the scheduler's step (it sets the lr), the generators that draw after
// initialisation (dropout masks advance a Philox offset per draw), and the data position. The data
// needs no state of its own: the loader derives every shuffle and augmentation from (seed, epoch,
// index), so starting epoch e at batch i hands out the same batches as a pass that ran through
// i - 1 (DataLoader::start). Checkpoints are taken only between accumulation windows, where no
// gradient is in flight. Tensors are stored in their own dtypes, so f32/f64 state round-trips
// exactly; tests/engine/checkpoint_test.cpp checks the losses after a resume against an
// uninterrupted run with ==.

namespace {

constexpr const char* kFormatKey = "format";
constexpr const char* kFormat = "colossal-checkpoint";
constexpr const char* kVersionKey = "format_version";
constexpr const char* kVersion = "1";
constexpr const char* kModelPrefix = "model.";
constexpr const char* kOptimizerPrefix = "optimizer.";
constexpr const char* kSchedulerPrefix = "lr_scheduler.";
constexpr const char* kAmpPrefix = "amp.";
constexpr const char* kRngPrefix = "rng.";
constexpr const char* kExtraPrefix = "extra.";

template <class Dict>
void add_prefixed(nn::StateDict& out, const std::string& prefix, const Dict& in) {
  for (const auto& [name, tensor] : in) out.insert(prefix + name, tensor);
}

/// The entries of `all` under `prefix`, with it stripped, removed from `all`.
template <class Dict>
Dict take_prefixed(nn::StateDict& all, const std::string& prefix) {
  Dict out;
  for (const std::string& name : all.keys()) {
    if (!name.starts_with(prefix)) continue;
    const Tensor tensor = all.at(name);
    if constexpr (std::is_same_v<Dict, nn::StateDict>) {
      out.insert(name.substr(prefix.size()), tensor);
    } else {
      out.emplace(name.substr(prefix.size()), tensor);
    }
    all.erase(name);
  }
  return out;
}

int64_t parse_int(const std::filesystem::path& path, const std::map<std::string, std::string>& metadata,
                  const std::string& key) {
  auto it = metadata.find(key);
  COLOSSAL_CHECK(it != metadata.end(), "checkpoint {}: the metadata has no \"{}\"", path.string(), key);
  int64_t value = 0;
  const std::string& text = it->second;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  COLOSSAL_CHECK(ec == std::errc() && end == text.data() + text.size(),
                 "checkpoint {}: metadata \"{}\" = \"{}\" is not an integer", path.string(), key, text);
  return value;
}

uint64_t parse_u64(const std::filesystem::path& path, const std::string& key, std::string_view text) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  COLOSSAL_CHECK(ec == std::errc() && end == text.data() + text.size(),
                 "checkpoint {}: metadata \"{}\" has \"{}\" where an unsigned integer belongs", path.string(), key,
                 text);
  return value;
}

void check_format(const std::filesystem::path& path, const std::map<std::string, std::string>& metadata) {
  auto format = metadata.find(kFormatKey);
  COLOSSAL_CHECK(format != metadata.end() && format->second == kFormat,
                 "{} is a safetensors file but not a colossal training checkpoint (its metadata has no format = "
                 "\"{}\"); weights alone load with nn::load_safetensors",
                 path.string(), kFormat);
  auto version = metadata.find(kVersionKey);
  COLOSSAL_CHECK(version != metadata.end() && version->second == kVersion,
                 "checkpoint {}: format_version \"{}\" is not one this build reads (it reads \"{}\")", path.string(),
                 version == metadata.end() ? "" : version->second, kVersion);
}

}  // namespace

void save_checkpoint(const std::filesystem::path& path, Engine& engine, const NamedGenerators& generators,
                     const CheckpointInfo& info) {
  COLOSSAL_CHECK(engine.micro_step() == 0,
                 "save_checkpoint {}: the engine is {} micro-step(s) into a gradient-accumulation window; checkpoint "
                 "after the window's optimizer step",
                 path.string(), engine.micro_step());
  nn::StateDict tensors;
  add_prefixed(tensors, kModelPrefix, engine.model().state_dict());
  add_prefixed(tensors, kOptimizerPrefix, engine.optimizer().state_dict());
  if (optim::LRScheduler* scheduler = engine.lr_scheduler()) {
    add_prefixed(tensors, kSchedulerPrefix, scheduler->state_dict());
  }
  if (amp::MixedPrecisionOptimizer* amp = engine.amp()) add_prefixed(tensors, kAmpPrefix, amp->state_dict());
  std::map<std::string, std::string> metadata = {
      {kFormatKey, kFormat},
      {kVersionKey, kVersion},
      {"epoch", std::to_string(info.position.epoch)},
      {"iter", std::to_string(info.position.iter)},
      {"step", std::to_string(info.position.step)},
      {"num_updates", std::to_string(info.num_updates)},
  };
  for (const auto& [name, generator] : generators) {
    COLOSSAL_CHECK(generator != nullptr, "save_checkpoint: generator \"{}\" is null", name);
    const core::GeneratorState state = generator->state();
    metadata[kRngPrefix + name] = fmt::format("{}:{}", state.seed, state.offset);
  }
  for (const auto& [key, value] : info.extra) metadata[kExtraPrefix + key] = value;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  nn::save_safetensors(path, tensors, metadata);
}

CheckpointInfo load_checkpoint(const std::filesystem::path& path, Engine& engine, const NamedGenerators& generators) {
  nn::SafetensorsFile file = nn::load_safetensors(path);
  check_format(path, file.metadata);
  const std::string where = fmt::format("checkpoint {}", path.string());

  nn::StateDict model = take_prefixed<nn::StateDict>(file.tensors, kModelPrefix);
  optim::StateDict optimizer = take_prefixed<optim::StateDict>(file.tensors, kOptimizerPrefix);
  optim::StateDict scheduler = take_prefixed<optim::StateDict>(file.tensors, kSchedulerPrefix);
  optim::StateDict amp_state = take_prefixed<optim::StateDict>(file.tensors, kAmpPrefix);
  if (!file.tensors.empty()) {
    COLOSSAL_FAIL("{}: tensor \"{}\" belongs to none of model., optimizer., lr_scheduler., amp.", where,
                  file.tensors.begin()->first);
  }
  amp::MixedPrecisionOptimizer* amp = engine.amp();
  COLOSSAL_CHECK(
      (amp != nullptr) == !amp_state.empty(),
      "{}: the checkpoint was written {} mixed precision but this run has it {} (fp16.mode / bf16 must match)", where,
      amp_state.empty() ? "without" : "with", amp != nullptr ? "on" : "off");
  try {
    engine.model().load_state_dict(model, /*strict=*/true);
  } catch (const Error& e) {
    COLOSSAL_FAIL("{}: the model does not match the checkpoint's (was it built from the same config?): {}", where,
                  e.what());
  }
  try {
    engine.optimizer().load_state_dict(optimizer);
  } catch (const Error& e) {
    COLOSSAL_FAIL("{}: the optimizer does not match the checkpoint's: {}", where, e.what());
  }
  optim::LRScheduler* lr_scheduler = engine.lr_scheduler();
  COLOSSAL_CHECK((lr_scheduler != nullptr) == !scheduler.empty(),
                 "{}: the checkpoint {} an lr_scheduler state but this run {} one", where,
                 scheduler.empty() ? "has no" : "has", lr_scheduler != nullptr ? "has" : "has none");
  if (lr_scheduler != nullptr) {
    try {
      lr_scheduler->load_state_dict(scheduler);
    } catch (const Error& e) {
      COLOSSAL_FAIL("{}: the lr_scheduler does not match the checkpoint's: {}", where, e.what());
    }
  }

  if (amp != nullptr) {
    try {
      amp->load_state_dict(amp_state);  // after the model: it rewrites the parameters from the masters
    } catch (const Error& e) {
      COLOSSAL_FAIL("{}: the mixed-precision state does not match the checkpoint's: {}", where, e.what());
    }
  }

  for (const auto& [name, generator] : generators) {
    auto it = file.metadata.find(kRngPrefix + name);
    COLOSSAL_CHECK(it != file.metadata.end(), "{}: no state for random generator \"{}\" (metadata \"{}{}\")", where,
                   name, kRngPrefix, name);
    const std::string& text = it->second;
    const size_t colon = text.find(':');
    COLOSSAL_CHECK(colon != std::string::npos, "{}: metadata \"{}\" = \"{}\" is not seed:offset", where, it->first,
                   text);
    const std::string_view view(text);
    generator->set_state(
        {parse_u64(path, it->first, view.substr(0, colon)), parse_u64(path, it->first, view.substr(colon + 1))});
  }

  CheckpointInfo info;
  info.position = {parse_int(path, file.metadata, "epoch"), parse_int(path, file.metadata, "iter"),
                   parse_int(path, file.metadata, "step")};
  info.num_updates = parse_int(path, file.metadata, "num_updates");
  for (const auto& [key, value] : file.metadata) {
    if (key.starts_with(kExtraPrefix)) info.extra.emplace(key.substr(std::string_view(kExtraPrefix).size()), value);
  }
  engine.set_num_updates(info.num_updates);
  engine.zero_grad();
  return info;
}

nn::StateDict load_checkpoint_model_state(const std::filesystem::path& path) {
  nn::SafetensorsFile file = nn::load_safetensors(path);
  check_format(path, file.metadata);
  nn::StateDict model = take_prefixed<nn::StateDict>(file.tensors, kModelPrefix);
  COLOSSAL_CHECK(!model.empty(), "checkpoint {} holds no model tensors", path.string());
  // Under fp16/bf16 training the model holds 16-bit copies; the fp32 master weights are the truth.
  const std::string master_prefix = std::string(kAmpPrefix) + "master.";
  nn::StateDict out;
  for (const auto& [name, tensor] : model) {
    const Tensor* master = file.tensors.find(master_prefix + name);
    out.insert(name, master != nullptr ? *master : tensor);
  }
  return out;
}

std::string checkpoint_file_name(const TrainPosition& position) {
  return fmt::format("epoch{}-step{}.safetensors", position.epoch, position.step);
}

std::filesystem::path find_checkpoint(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    COLOSSAL_CHECK(std::filesystem::is_regular_file(path, ec), "resume: {} is neither a checkpoint file nor a folder",
                   path.string());
    return path;
  }
  std::optional<std::filesystem::path> best;
  int64_t best_step = -1, best_epoch = -1;
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".safetensors") continue;
    std::map<std::string, std::string> metadata;
    try {
      metadata = nn::read_safetensors_header(entry.path()).metadata;
    } catch (const Error&) {
      continue;  // not a readable safetensors file: not a candidate
    }
    auto format = metadata.find(kFormatKey);
    if (format == metadata.end() || format->second != kFormat) continue;
    const int64_t step = parse_int(entry.path(), metadata, "step");
    const int64_t epoch = parse_int(entry.path(), metadata, "epoch");
    if (std::pair(step, epoch) > std::pair(best_step, best_epoch)) {
      best = entry.path();
      best_step = step;
      best_epoch = epoch;
    }
  }
  COLOSSAL_CHECK(best.has_value(),
                 "resume: folder {} holds no colossal checkpoint (*.safetensors with format = \"{}\")", path.string(),
                 kFormat);
  return *best;
}

// ---- SaveCheckpointHook

SaveCheckpointHook::SaveCheckpointHook(std::filesystem::path dir, NamedGenerators generators, int64_t epoch_interval,
                                       int64_t step_interval, std::map<std::string, std::string> extra, int64_t keep,
                                       int priority)
    : Hook(priority),
      dir_(std::move(dir)),
      generators_(std::move(generators)),
      epoch_interval_(epoch_interval),
      step_interval_(step_interval),
      extra_(std::move(extra)),
      keep_(keep) {
  COLOSSAL_CHECK(epoch_interval_ >= 0 && step_interval_ >= 0 && keep_ >= 0,
                 "SaveCheckpointHook: epoch_interval {}, step_interval {} and keep {} must be >= 0", epoch_interval_,
                 step_interval_, keep_);
}

void SaveCheckpointHook::after_train_iter(Trainer& trainer, const Tensor&, const Tensor&, const Tensor&) {
  Engine& engine = trainer.engine();
  if (step_interval_ == 0 || !engine.last_step_updated() || engine.num_updates() % step_interval_ != 0) return;
  save(trainer, trainer.position_after_iter());
}

void SaveCheckpointHook::after_train_epoch(Trainer& trainer) {
  if (epoch_interval_ == 0 || (trainer.cur_epoch() + 1) % epoch_interval_ != 0) return;
  // The Trainer drops a window the epoch left open, so an epoch's end is a clean point to save.
  trainer.engine().zero_grad();
  save(trainer, trainer.position_after_epoch());
}

void SaveCheckpointHook::save(Trainer& trainer, const TrainPosition& position) {
  CheckpointInfo info{position, trainer.engine().num_updates(), extra_};
  const std::filesystem::path path = dir_ / checkpoint_file_name(position);
  save_checkpoint(path, trainer.engine(), generators_, info);
  // A step checkpoint at the epoch's last update is superseded by the epoch's own (same step).
  if (!written_.empty() && written_.back().path != path && written_.back().step == position.step) {
    std::error_code ec;
    std::filesystem::remove(written_.back().path, ec);
    written_.pop_back();
  }
  std::erase_if(written_, [&](const Written& w) { return w.path == path; });
  written_.push_back({path, position.step});
  while (keep_ > 0 && static_cast<int64_t>(written_.size()) > keep_) {
    std::error_code ec;
    std::filesystem::remove(written_.front().path, ec);
    written_.erase(written_.begin());
  }
}

std::vector<std::filesystem::path> SaveCheckpointHook::written() const {
  std::vector<std::filesystem::path> paths;
  for (const Written& w : written_) paths.push_back(w.path);
  return paths;
}

}  // namespace colossal::engine
