// Checkpoints: see checkpoint.h.
#include "colossal/engine/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <regex>
#include <set>
#include <system_error>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"
#include "colossal/engine/checkpoint_sharding.h"
#include "colossal/engine/hooks.h"  // NonFiniteLossHook
#include "colossal/nn/safetensors.h"
#include "colossal/ops/elementwise.h"  // sub, add
#include "colossal/ops/reduction.h"    // sum

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
// For the same reason a load never converts: a tensor whose dtype in the file differs from the
// one the model, optimizer, scheduler or loss scaler holds (F16 where F32 belongs, I32 bits where
// F32 belongs) is an error naming both, since a cast would either change the values (narrowing,
// reinterpreting) or hide that the file came from another configuration. Weights from elsewhere
// go through model.weights (nn::import_hub_weights), whose rules are looser.

namespace {

constexpr const char* kFormatKey = "format";
constexpr const char* kFormat = nn::kCheckpointFormat;
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

/// Throws unless `metadata` is a colossal checkpoint's of the version this build reads; `purpose`
/// ("resume", "export") says what the file was given for, to word the advice.
void check_format(const std::filesystem::path& path, const std::map<std::string, std::string>& metadata,
                  std::string_view purpose) {
  auto format = metadata.find(kFormatKey);
  if (format == metadata.end() || format->second != kFormat) {
    if (purpose == "export") {
      COLOSSAL_FAIL(
          "export: {} is not a colossal training checkpoint (its safetensors metadata has no format = \"{}\"); a "
          "weights file needs no export: transformers and timm read it as it is, and a run starts from it with "
          "model.weights = \"{}\"",
          path.string(), kFormat, path.string());
    }
    COLOSSAL_FAIL(
        "{}: {} is a weights file (safetensors without training state: no optimizer, scheduler or position), not a "
        "colossal training checkpoint, so there is nothing to resume; to start a new run from these weights set "
        "model.weights = \"{}\" in the config (or --set 'model.weights=\"{}\"') and leave out --resume",
        purpose, path.string(), path.string(), path.string());
  }
  auto version = metadata.find(kVersionKey);
  COLOSSAL_CHECK(version != metadata.end() && version->second == kVersion,
                 "checkpoint {}: format_version \"{}\" is not one this build reads (it reads \"{}\")", path.string(),
                 version == metadata.end() ? "" : version->second, kVersion);
}

/// Throws when `stored` (the file's tensor `key`) is not of dtype `expected` (what `holder` keeps).
void check_dtype(const std::string& where, const std::string& key, const Tensor& stored, DType expected,
                 const char* holder) {
  COLOSSAL_CHECK(stored.dtype() == expected,
                 "{}: tensor \"{}\" is stored as {} but the {} holds it as {}; a checkpoint restores training state "
                 "exactly and is never cast (was it written with other fp16 / bf16 settings, or changed since?)",
                 where, key, nn::safetensors_dtype_name(stored.dtype()), holder, nn::safetensors_dtype_name(expected));
}

/// The dtype the engine's optimizer keeps under `key` (a key of its state_dict), or nullopt for a
/// key it does not have: Optimizer::load_state_dict names those. Moments have their parameter's
/// dtype and are created lazily, so a fresh optimizer's state_dict does not list them yet.
std::optional<DType> optimizer_dtype(optim::Optimizer& optimizer, const optim::StateDict& own, const std::string& key) {
  if (auto it = own.find(key); it != own.end()) return it->second.dtype();
  static const std::regex state_key(R"(state\.(\d{1,18})\.(.+))");
  std::smatch match;
  if (!std::regex_match(key, match, state_key)) return std::nullopt;
  if (match[2] == "step") return DType::i64;
  int64_t index = std::stoll(match[1]);
  for (const optim::ParamGroup& group : optimizer.param_groups()) {
    if (index < static_cast<int64_t>(group.params.size())) return group.params[static_cast<size_t>(index)].dtype();
    index -= static_cast<int64_t>(group.params.size());
  }
  return std::nullopt;
}

/// Checks the dtype of every tensor of the checkpoint against what `engine` holds (see Note
/// [Bit-exact resume]); keys the engine does not know are left to the loaders, which name them.
void check_dtypes(const std::string& where, Engine& engine, const nn::StateDict& model,
                  const optim::StateDict& optimizer, const optim::StateDict& scheduler,
                  const optim::StateDict& amp_state) {
  const nn::StateDict own_model = engine.model().state_dict();
  for (const auto& [name, tensor] : model) {
    if (const Tensor* own = own_model.find(name))
      check_dtype(where, kModelPrefix + name, tensor, own->dtype(), "model");
  }
  const optim::StateDict own_optimizer = engine.optimizer().state_dict();
  for (const auto& [key, tensor] : optimizer) {
    if (auto dtype = optimizer_dtype(engine.optimizer(), own_optimizer, key)) {
      check_dtype(where, kOptimizerPrefix + key, tensor, *dtype, "optimizer");
    }
  }
  if (optim::LRScheduler* lr_scheduler = engine.lr_scheduler()) {
    const optim::StateDict own = lr_scheduler->state_dict();
    for (const auto& [key, tensor] : scheduler) {
      if (auto it = own.find(key); it != own.end()) {
        check_dtype(where, kSchedulerPrefix + key, tensor, it->second.dtype(), "lr_scheduler");
      }
    }
  }
  if (amp::MixedPrecisionOptimizer* amp = engine.amp()) {
    const optim::StateDict own = amp->state_dict();
    for (const auto& [key, tensor] : amp_state) {
      if (auto it = own.find(key); it != own.end()) {
        check_dtype(where, kAmpPrefix + key, tensor, it->second.dtype(), "mixed-precision optimizer");
      }
    }
  }
}

/// The first of `tensors` holding a NaN or an infinity, or nullopt. x - x is exactly 0 for a
/// finite x and NaN otherwise, so one sum per tensor flags it, and one host read covers them all
/// (the names are read one by one only when something is wrong).
std::optional<std::string> first_non_finite(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> flags;
  Tensor total;
  for (const auto& [name, tensor] : tensors) {
    Tensor flag = ops::sum(ops::sub(tensor, tensor));
    total = total.defined() ? ops::add(total, flag.device() == total.device() ? flag : flag.to(total.device())) : flag;
    flags.push_back(flag);
  }
  if (!total.defined() || std::isfinite(total.item<double>())) return std::nullopt;
  for (size_t i = 0; i < flags.size(); ++i) {
    if (!std::isfinite(flags[i].item<double>())) return tensors[i].first;
  }
  return std::nullopt;
}

}  // namespace

bool writes_checkpoints(const Engine& engine) {
  return engine.context().global_rank() == 0;
}

void save_checkpoint(const std::filesystem::path& path, Engine& engine, const NamedGenerators& generators,
                     const CheckpointInfo& info) {
  COLOSSAL_CHECK(engine.micro_step() == 0,
                 "save_checkpoint {}: the engine is {} micro-step(s) into a gradient-accumulation window; checkpoint "
                 "after the window's optimizer step",
                 path.string(), engine.micro_step());
  // The serial model's tensors, whatever the layout (Note [Checkpoints of a sharded model]).
  engine.wait_for_update();  // the parameters and the optimizer's state as the last update left them
  const CheckpointSharding sharding(engine);
  nn::StateDict tensors;
  add_prefixed(tensors, kModelPrefix, sharding.gather_model(engine.model().state_dict()));
  add_prefixed(tensors, kOptimizerPrefix, sharding.gather_optimizer(engine.optimizer().state_dict()));
  if (optim::LRScheduler* scheduler = engine.lr_scheduler()) {
    add_prefixed(tensors, kSchedulerPrefix, scheduler->state_dict());
  }
  if (amp::MixedPrecisionOptimizer* amp = engine.amp()) {
    add_prefixed(tensors, kAmpPrefix, sharding.gather_amp(amp->state_dict()));
  }
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

  // The second line of defence behind NonFiniteLossHook: NaN weights or moments are never written
  // as something to resume from. Buffers are not checked: a mask may hold -inf by design.
  std::set<std::string> parameters;
  for (const auto& [name, param] : engine.model().named_parameters()) parameters.insert(kModelPrefix + name);
  // Under a pipeline the first stage holds every stage's parameters, under the serial names.
  for (const std::string& name : sharding.serial_parameter_names()) parameters.insert(kModelPrefix + name);
  std::vector<std::pair<std::string, Tensor>> trained;
  for (const auto& [name, tensor] : tensors) {
    const bool state = parameters.contains(name) || name.starts_with(std::string(kOptimizerPrefix) + "state.") ||
                       name.starts_with(std::string(kAmpPrefix) + "master.");
    if (state && core::is_floating(tensor.dtype())) trained.emplace_back(name, tensor);
  }
  if (std::optional<std::string> bad = first_non_finite(trained)) {
    COLOSSAL_FAIL(
        "checkpoint {} not saved: tensor \"{}\" holds NaN or infinite values: the training had diverged by step "
        "{}, and resuming from this state would go on from broken weights (lower optimizer.lr, enable "
        "clip_grad_norm, check the data and the starting weights)",
        path.string(), *bad, info.position.step);
  }

  // Every rank of a tensor group has the whole state now (under a pipeline the first stage's); one
  // process writes it.
  if (!writes_checkpoints(engine)) return;
  try {
    if (path.has_parent_path()) {
      std::error_code error;
      std::filesystem::create_directories(path.parent_path(), error);
      COLOSSAL_CHECK(!error, "cannot create the folder {}: {}", path.parent_path().string(), error.message());
    }
    nn::save_safetensors(path, tensors, metadata);
  } catch (const Error& e) {
    COLOSSAL_FAIL("checkpoint {} not saved (earlier checkpoints are left as they were): {}", path.string(), e.what());
  }
}

CheckpointInfo load_checkpoint(const std::filesystem::path& path, Engine& engine, const NamedGenerators& generators) {
  // The header first: a weights file given to --resume is named as such before its data is read.
  check_format(path, nn::read_safetensors_header(path).metadata, "resume");
  nn::SafetensorsFile file = nn::load_safetensors(path);
  const std::string where = fmt::format("checkpoint {}", path.string());

  // The file holds the serial tensors; each rank of a tensor group keeps its shard of them.
  engine.wait_for_update();  // the parameters and the optimizer's state as the last update left them
  const CheckpointSharding sharding(engine);
  nn::StateDict model;
  optim::StateDict optimizer, amp_state;
  try {
    model = sharding.shard_model(take_prefixed<nn::StateDict>(file.tensors, kModelPrefix));
    optimizer = sharding.shard_optimizer(take_prefixed<optim::StateDict>(file.tensors, kOptimizerPrefix));
    amp_state = sharding.shard_amp(take_prefixed<optim::StateDict>(file.tensors, kAmpPrefix));
  } catch (const Error& e) {
    COLOSSAL_FAIL("{}: {}", where, e.what());
  }
  optim::StateDict scheduler = take_prefixed<optim::StateDict>(file.tensors, kSchedulerPrefix);
  if (!file.tensors.empty()) {
    COLOSSAL_FAIL("{}: tensor \"{}\" belongs to none of model., optimizer., lr_scheduler., amp.", where,
                  file.tensors.begin()->first);
  }
  amp::MixedPrecisionOptimizer* amp = engine.amp();
  COLOSSAL_CHECK(
      (amp != nullptr) == !amp_state.empty(),
      "{}: the checkpoint was written {} mixed precision but this run has it {} (fp16.mode / bf16 must match)", where,
      amp_state.empty() ? "without" : "with", amp != nullptr ? "on" : "off");
  check_dtypes(where, engine, model, optimizer, scheduler, amp_state);
  try {
    sharding.load_model(engine, model);  // ZeRO-3 keeps its shards of the parameters
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
  // ZeRO's optimizer offload keeps host copies of an f32 model's parameters as its masters.
  if (parallel::zero::ZeroHandler* zero = engine.zero()) zero->load_masters_from_model();

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
  check_format(path, nn::read_safetensors_header(path).metadata, "export");
  nn::SafetensorsFile file = nn::load_safetensors(path);
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

namespace {

/// (step, epoch) from a name checkpoint_file_name wrote ("epoch3-step1200.safetensors").
std::optional<std::pair<int64_t, int64_t>> position_from_name(const std::filesystem::path& file) {
  static const std::regex name(R"(epoch(\d{1,18})-step(\d{1,18})\.safetensors)");
  std::smatch match;
  const std::string text = file.filename().string();
  if (!std::regex_match(text, match, name)) return std::nullopt;
  return std::pair(std::stoll(match[2]), std::stoll(match[1]));
}

}  // namespace

std::filesystem::path find_checkpoint(const std::filesystem::path& path, std::string_view purpose) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    COLOSSAL_CHECK(std::filesystem::exists(path, ec),
                   "{}: {} does not exist; give a checkpoint file or a folder of checkpoints (train.checkpoint_dir)",
                   purpose, path.string());
    COLOSSAL_CHECK(std::filesystem::is_regular_file(path, ec), "{}: {} is neither a checkpoint file nor a folder",
                   purpose, path.string());
    return path;
  }
  struct Candidate {
    std::filesystem::path path;
    std::pair<int64_t, int64_t> position;  // (step, epoch): the order checkpoints are taken in
  };
  struct Unreadable {
    std::filesystem::path path;
    std::string reason;
  };
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());  // the directory's order is arbitrary; messages should not be
  std::optional<Candidate> best;
  std::vector<Unreadable> unreadable;
  for (const std::filesystem::path& file : files) {
    std::map<std::string, std::string> metadata;
    try {
      metadata = nn::read_safetensors_header(file).metadata;
    } catch (const Error& e) {
      unreadable.push_back({file, e.what()});
      continue;
    }
    auto format = metadata.find(kFormatKey);
    if (format == metadata.end() || format->second != kFormat) continue;  // weights, exports: not checkpoints
    const std::pair position(parse_int(file, metadata, "step"), parse_int(file, metadata, "epoch"));
    if (!best || position > best->position) best = Candidate{file, position};
  }
  // Note [Unreadable checkpoints]
  // A file that cannot be read (truncated by a full disk, damaged by a copy) may be the newest
  // checkpoint. Resuming from an older one instead would quietly repeat or lose training, so a file
  // newer than the chosen checkpoint, by the position in its name or, for another name, by its
  // modification time, is an error naming it and why; an older one is only reported.
  for (const Unreadable& u : unreadable) {
    COLOSSAL_CHECK(best.has_value(), "{}: folder {} holds no readable colossal checkpoint: {} cannot be read: {}",
                   purpose, path.string(), u.path.string(), u.reason);
    const auto by_name = position_from_name(u.path);
    const bool newer =
        by_name ? *by_name > best->position
                : std::filesystem::last_write_time(u.path, ec) > std::filesystem::last_write_time(best->path, ec);
    COLOSSAL_CHECK(!newer,
                   "{}: the newest checkpoint in {}, {}{}, cannot be read: {}. Taking the newest readable one, {} "
                   "(step {}), instead would silently lose the training in between; to use it anyway give {} "
                   "itself, or move {} out of the folder",
                   purpose, path.string(), u.path.filename().string(),
                   by_name ? fmt::format(" (step {} by its name)", by_name->first) : std::string(" (by its date)"),
                   u.reason, best->path.filename().string(), best->position.first, best->path.string(),
                   u.path.filename().string());
    fmt::print(stderr, "{}: warning: skipping {}, which cannot be read ({}); {} is newer and is used\n", purpose,
               u.path.string(), u.reason, best->path.filename().string());
  }
  COLOSSAL_CHECK(best.has_value(), "{}: folder {} holds no colossal checkpoint (*.safetensors with format = \"{}\")",
                 purpose, path.string(), kFormat);
  return best->path;
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
  // Whatever the hooks' priorities, the losses recorded since the last look are judged before
  // they become a checkpoint (Note [Non-finite losses] in hooks.cpp).
  for (const std::shared_ptr<Hook>& hook : trainer.hooks()) {
    if (auto* guard = dynamic_cast<NonFiniteLossHook*>(hook.get())) guard->check(trainer);
  }
  CheckpointInfo info{position, trainer.engine().num_updates(), extra_};
  const std::filesystem::path path = dir_ / checkpoint_file_name(position);
  save_checkpoint(path, trainer.engine(), generators_, info);
  if (!writes_checkpoints(trainer.engine())) return;  // a tensor-parallel rank that only gathered
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
