// DataLoader: batches of a dataset in sampler order, produced by worker threads into a bounded
// queue and handed out strictly in order. Optionally collated into pinned host memory and copied to
// a GPU on a side stream, overlapping the copy of batch k+1 with the consumer's work on batch k.
// A batch depends only on (sampler order, epoch, seed, batch index), never on the thread count.
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>

#include "colossal/core/device.h"
#include "colossal/data/batch.h"
#include "colossal/data/batch_stage.h"
#include "colossal/data/dataset.h"
#include "colossal/data/sampler.h"

namespace colossal::data {

struct DataLoaderOptions {
  /// Samples per batch.
  int64_t batch_size = 1;
  /// Drop the last batch of an epoch when it has fewer than batch_size samples.
  bool drop_last = false;
  /// Without an explicit sampler: a RandomSampler seeded with `seed` (true) or a SequentialSampler.
  bool shuffle = false;
  /// Seeds the default RandomSampler and the batch transform's per-batch generators.
  uint64_t seed = 0;
  /// Threads producing batches; 0 produces them on the calling thread inside next().
  int64_t num_workers = 0;
  /// Batches each worker may have ready or in progress ahead of the consumer (torch's
  /// prefetch_factor): bounds memory at num_workers * prefetch_factor batches.
  int64_t prefetch_factor = 2;
  /// Collate into page-locked host memory (needs CUDA) so host-to-device copies run asynchronously.
  /// Unset: pinned when `device` is set, pageable otherwise; false with a device copies from
  /// pageable memory (the copy then stages through the driver, which the host waits for).
  std::optional<bool> pin_memory;
  /// A CUDA device to deliver batches on. Copies run on a side stream; each batch is handed out only
  /// after the consumer's current stream has been told to wait for its copy. Pinned staging unless
  /// pin_memory is false.
  /// Keep the same current stream through a pass (see Note [Device prefetch]).
  std::optional<Device> device;
  /// Collation; empty means stack_collate.
  CollateFn collate;
  /// Applied to each collated batch (mixup), on the worker.
  std::shared_ptr<const BatchTransform> batch_transform;
  /// Applied to each collated batch after batch_transform (Note [Batch stages]): prepare() on the
  /// worker; run() on the worker for CPU batches, and with `device` on the GPU after the copy, on
  /// the side stream (so the copy carries the stage's small input, not its output).
  std::shared_ptr<const BatchStage> batch_stage;
};

class DataLoader {
 public:
  /// Without `sampler`, options.shuffle picks a RandomSampler or a SequentialSampler. Throws on bad
  /// options, naming the field and what would be valid.
  DataLoader(std::shared_ptr<Dataset> dataset, DataLoaderOptions options, std::shared_ptr<Sampler> sampler = nullptr);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// Selects the epoch of the next pass (sampler order and augmentation); stops a pass in progress.
  /// As with torch's DistributedSampler, call it at the start of every epoch, or each epoch repeats
  /// epoch 0's order.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  /// Batches per epoch.
  int64_t size() const;
  const DataLoaderOptions& options() const { return options_; }

  /// Starts (or restarts) a pass over the current epoch at batch `first_batch` (0 <= first_batch <=
  /// size()): the batches handed out are those a full pass hands out from that index on, bit for
  /// bit, which is how a resumed run continues mid-epoch.
  void start(int64_t first_batch = 0);
  /// The next batch of the pass, starting one if none is running; nullopt once the pass is over
  /// (until start() or set_epoch()). A sample or collation error is rethrown here, at the batch it
  /// belongs to, naming the batch and the sample; the pass then ends.
  std::optional<Batch> next();

  /// Range-for over one pass: `for (Batch& b : loader)` (begin() starts a new pass).
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    Iterator() = default;
    explicit Iterator(DataLoader* loader) : loader_(loader) { ++*this; }
    Batch& operator*() { return *current_; }
    Batch* operator->() { return &*current_; }
    Iterator& operator++() {
      current_ = loader_->next();
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const Iterator& it, std::default_sentinel_t) { return !it.current_.has_value(); }

   private:
    DataLoader* loader_ = nullptr;
    std::optional<Batch> current_;
  };
  Iterator begin() {
    start();
    return Iterator(this);
  }
  std::default_sentinel_t end() { return {}; }

 private:
  struct Pass;
  struct DeviceStage;

  Batch produce_batch(int64_t epoch, int64_t batch_index, const std::vector<int64_t>& sample_indices) const;
  void worker_loop(Pass& pass) const;
  std::optional<Batch> next_host_batch();
  void stop_pass();

  std::shared_ptr<Dataset> dataset_;
  std::shared_ptr<Sampler> sampler_;
  DataLoaderOptions options_;
  std::shared_ptr<PinnedMemoryPool> pinned_pool_;
  HostAllocator allocate_;
  int64_t epoch_ = 0;
  std::unique_ptr<Pass> pass_;
  std::unique_ptr<DeviceStage> device_stage_;
};

}  // namespace colossal::data
