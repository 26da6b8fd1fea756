// Training checkpoints: one safetensors file holding everything a run needs to continue as if it
// had never stopped: the model's state_dict ("model.<name>"), the optimizer's ("optimizer.<key>"),
// the LR scheduler's ("lr_scheduler.<key>"), under mixed precision the loss scaler and the fp32
// master weights ("amp.<key>"), and in the header's metadata the position
// (epoch, iteration within it, step, optimizer updates), the state of every named random generator
// (dropout, ...), and what the writer wants to check on resume (steps per epoch, the config).
// Files are written under a temporary name, synced and renamed, so a crash or a full disk never
// leaves half a checkpoint under a checkpoint's name. See Note [Bit-exact resume] in checkpoint.cpp.
// A tensor-parallel or pipeline run saves the serial model's whole tensors and the serial optimizer's
// state, loadable at any layout (Notes [Checkpoints of a sharded model] and [Checkpoints of a
// pipeline] in checkpoint_sharding.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "colossal/core/random.h"  // Generator
#include "colossal/engine/engine.h"
#include "colossal/engine/hook.h"
#include "colossal/engine/trainer.h"  // TrainPosition

namespace colossal::engine {

/// The random generators a run draws from after initialisation, by name ("dropout"); their (seed,
/// offset) states are saved and restored.
using NamedGenerators = std::map<std::string, core::Generator*>;

/// What a checkpoint records beside the tensors.
struct CheckpointInfo {
  TrainPosition position;
  int64_t num_updates = 0;
  /// Free-form strings the writer checks on resume ("steps_per_epoch", "config", ...).
  std::map<std::string, std::string> extra;
};

/// Writes `engine`'s model, optimizer and scheduler state, the generators' states and `info` to
/// `path` (temporary name, then rename). The file holds the serial model's tensors under its names
/// whatever the layout: under tensor parallelism every rank of the tensor group must call it (the
/// shards are gathered over the group), under a pipeline every stage (with EngineOptions::serial_names
/// set; the stages' tensors go to the first), and only the world's rank 0 writes (writes_checkpoints);
/// the generators' states are this rank's. The engine must be at an accumulation-window boundary
/// (engine.micro_step() == 0): gradients in flight are not part of a checkpoint. Refuses, naming
/// the tensor, parameters, optimizer moments or fp32 master weights holding NaN or infinity (a
/// diverged run is not something to resume). Any failure (the folder cannot be made, the disk is
/// full) throws naming the file and the system's reason, and leaves earlier files untouched.
void save_checkpoint(const std::filesystem::path& path, Engine& engine, const NamedGenerators& generators,
                     const CheckpointInfo& info);

/// Whether this process writes the checkpoint files of `engine`'s run: the world's rank 0.
bool writes_checkpoints(const Engine& engine);

/// Restores what save_checkpoint wrote into `engine` (whose model, optimizer and scheduler must be
/// built as the writer's were, at any tensor-parallel size and pipeline cut: each rank takes its
/// stage's tensors and its shard of them) and the generators, and returns the recorded info. Throws naming the
/// file and the key when something is missing, extra, of another shape, or not a colossal checkpoint
/// (a plain weights file is named as such, with model.weights as the way to start from it).
/// Dtypes must match exactly: a tensor stored in another dtype than the model, optimizer, scheduler
/// or mixed-precision state holds (F16 or I32 where F32 belongs) is an error naming the tensor, the
/// file and both dtypes, never a cast, because resuming restores training state bit for bit. The
/// dtypes are checked before anything is loaded; a later failure may leave the engine partly
/// loaded, and it should not be used then.
CheckpointInfo load_checkpoint(const std::filesystem::path& path, Engine& engine, const NamedGenerators& generators);

/// The model's state dict stored in the checkpoint at `path` (its "model." tensors, names without
/// the prefix; the fp32 master weight instead of a 16-bit parameter under mixed precision), without
/// building anything: what `colossal export` writes out under Hub names.
nn::StateDict load_checkpoint_model_state(const std::filesystem::path& path);

/// `path` itself when it is a file; for a directory, its checkpoint with the most training steps
/// (file names from checkpoint_file_name). Throws naming the directory when it holds none, and
/// naming the file and why when a *.safetensors file in it cannot be read and is newer than the
/// checkpoint it would choose (by the position in its name, else by its modification time): going
/// on from an older checkpoint would silently lose training. Older unreadable files are reported
/// on stderr and skipped; readable files that are not checkpoints (weights, exports) are skipped.
/// `purpose` ("resume", "export") starts every message.
std::filesystem::path find_checkpoint(const std::filesystem::path& path, std::string_view purpose = "resume");

/// "epoch3.safetensors" at an epoch's end, "epoch3-step1200.safetensors" inside epoch 3 (1-based
/// epochs, as logged); names sort by (epoch, step) in find_checkpoint.
std::string checkpoint_file_name(const TrainPosition& position);

/// Colossal-AI's SaveCheckpointHook: saves into `dir` after every `epoch_interval`-th training
/// epoch (0: never) and, when `step_interval` > 0, after every step_interval-th optimizer update
/// inside an epoch, keeping the newest `keep` files (0: all). Runs last (priority 100) so that the
/// scheduler has stepped. Under tensor parallelism every rank of the writer's tensor group runs it,
/// under a pipeline every rank of the writer's data-parallel replica
/// (the state is gathered) and the world's rank 0 writes and removes files. Before each save it has
/// every NonFiniteLossHook of the trainer check the losses since its last look, so a diverged state
/// is never saved.
class SaveCheckpointHook : public Hook {
 public:
  SaveCheckpointHook(std::filesystem::path dir, NamedGenerators generators, int64_t epoch_interval,
                     int64_t step_interval = 0, std::map<std::string, std::string> extra = {}, int64_t keep = 0,
                     int priority = 100);
  std::string name() const override { return "SaveCheckpointHook"; }
  void after_train_iter(Trainer& trainer, const Tensor& output, const Tensor& target, const Tensor& loss) override;
  void after_train_epoch(Trainer& trainer) override;
  /// Paths written by this hook, oldest first (the kept ones).
  std::vector<std::filesystem::path> written() const;

 private:
  void save(Trainer& trainer, const TrainPosition& position);

  std::filesystem::path dir_;
  NamedGenerators generators_;
  int64_t epoch_interval_, step_interval_;
  std::map<std::string, std::string> extra_;
  int64_t keep_;
  struct Written {
    std::filesystem::path path;
    int64_t step;
  };
  std::vector<Written> written_;
};

}  // namespace colossal::engine
