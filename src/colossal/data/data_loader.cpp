// DataLoader: the worker pool with its bounded, in-order queue, and the device stage that copies
// batches to a GPU on a side stream. See Note [DataLoader determinism] and Note [Device prefetch].
#include "colossal/data/data_loader.h"

#include <omp.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <utility>  // exchange

#include "colossal/core/cuda_device.h"  // streams, events, is_available
#include "colossal/core/error.h"
#include "colossal/core/view.h"  // cross_device_copy_stub
#include "colossal/data/random.h"

namespace colossal::data {

// Note [DataLoader determinism]
// A pass fixes its batches (lists of sample indices, from the sampler) before any worker starts.
// Workers claim batch numbers from a shared counter and put finished batches into a map keyed by
// number; the consumer takes batch k only when it is there. Every random draw inside a batch comes
// from generators derived from (seed, epoch, sample index) or (seed, epoch, batch index), so the
// bytes of batch k are the same whichever thread made it and whatever the thread count. The
// counter never runs more than num_workers * prefetch_factor batches ahead of the consumer, which
// bounds memory.

// Note [Workers run single-threaded]
// A worker's transforms, random fills and collation call code that splits large loops over OpenMP's
// threads (core/parallel_for.h: a 224 x 224 x 3 image's normal fill, a batch's copy). With one OpenMP
// team of every core per worker, 8 workers on 16 cores ran ~128 threads, and more workers went
// slower (issue 18: 160 ms/iter with 4 workers, 188 with 14, for a GPU that needs 70). So each worker
// thread sets OpenMP's thread count to 1 for itself, as PyTorch's DataLoader workers run with
// torch.set_num_threads(1): the workers are the parallelism. A loader without workers
// (num_workers = 0) keeps the caller's setting.

// Note [Device prefetch]
// Batches for a GPU are collated into pinned host buffers. The device buffers are allocated on the
// consumer's current stream (so they are freed in its order once the consumer drops them); the side
// stream waits for that allocation, copies, and records `ready`. A batch is handed out only after
// `ready` has been made a dependency of the consumer's stream, so kernels the consumer launches see
// the data without the host ever waiting. One more batch is kept in flight, so the copy of batch
// k+1 overlaps the consumer's work on batch k. The pinned source of a copy is kept until its event
// has completed, and only then returns to the pool for reuse.
// The consumer should keep one current stream through a pass: a batch copied ahead was allocated
// on the stream current at the time, and is freed in that stream's order (there is no
// record_stream yet to tell the allocator about later users on another stream).

struct DataLoader::Pass {
  struct Result {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };

  int64_t epoch = 0;
  std::vector<std::vector<int64_t>> batches;
  int64_t capacity = 1;

  std::mutex mutex;
  std::condition_variable work_cv;   // workers: room in the queue, or stop
  std::condition_variable ready_cv;  // consumer: its batch arrived
  int64_t next_claim = 0;
  int64_t next_consume = 0;
  std::map<int64_t, Result> ready;
  bool stop = false;
  bool finished = false;
  std::vector<std::thread> workers;

  int64_t num_batches() const { return static_cast<int64_t>(batches.size()); }
};

struct DataLoader::DeviceStage {
  struct InFlight {
    Batch device_batch;
    Batch host_batch;
    Tensor stage_input;  ///< the copied input a batch stage read (kept until `ready`)
    core::cuda::Event ready;
  };
  struct Retired {
    Batch host_batch;
    Tensor stage_input;
    core::cuda::Event ready;
  };

  explicit DeviceStage(Device d) : device(d) {}
  ~DeviceStage() {
    try {
      drain();
      if (side.handle != nullptr) core::cuda::destroy_stream(side);
    } catch (...) {
      // A destructor must not throw; a failing CUDA context is reported by the next CUDA call.
    }
  }

  /// Waits for every copy still running and drops its buffers.
  void drain() {
    for (auto& f : in_flight) f.ready.synchronize();
    in_flight.clear();
    for (auto& r : retired) r.ready.synchronize();
    retired.clear();
    pending_error = nullptr;
  }
  /// Returns the pinned sources of finished copies to the pool.
  void reap() {
    while (!retired.empty() && retired.front().ready.query()) retired.pop_front();
  }

  /// Copies `host` to the device on the side stream and, with a `stage`, runs the stage there on
  /// the copy (Note [Batch stages]).
  InFlight start_copy(Batch host, const BatchStage* stage) {
    if (side.handle == nullptr) side = core::cuda::create_stream(device);
    const core::Stream consumer = core::cuda::current_stream(device);
    Batch dev;
    dev.index = host.index;
    dev.sample_indices = host.sample_indices;
    dev.draws = host.draws;
    // Allocate on the consumer's stream (see the Note), then let the side stream wait for it.
    dev.input = core::empty(host.input.shape(), TensorOptions(host.input.dtype(), device));
    Tensor staged;
    if (stage)
      staged = core::empty(stage->output_shape(host.input.shape()), TensorOptions(stage->output_dtype(), device));
    if (host.target.defined())
      dev.target = core::empty(host.target.shape(), TensorOptions(host.target.dtype(), device));
    core::cuda::Event allocated;
    allocated.record(consumer);
    allocated.block(side);
    {
      core::cuda::StreamGuard guard(side);
      if (dev.input.numel() > 0) core::cross_device_copy_stub(device, dev.input, core::contiguous_raw(host.input));
      if (dev.target.defined() && dev.target.numel() > 0) {
        core::cross_device_copy_stub(device, dev.target, core::contiguous_raw(host.target));
      }
      if (stage) stage->run(dev, staged);
    }
    core::cuda::Event ready;
    ready.record(side);
    Tensor stage_input;
    if (stage) {
      // The copied input is read by the stage's kernel on the side stream: it stays alive until
      // `ready`, and is then freed in the consumer's order, where it was allocated.
      stage_input = std::exchange(dev.input, staged);
    }
    return InFlight{std::move(dev), std::move(host), std::move(stage_input), std::move(ready)};
  }

  Device device;
  core::Stream side{};
  std::deque<InFlight> in_flight;
  std::deque<Retired> retired;
  /// An error met while prefetching ahead; raised once the batches before it are handed out.
  std::exception_ptr pending_error;
};

DataLoader::DataLoader(std::shared_ptr<Dataset> dataset, DataLoaderOptions options, std::shared_ptr<Sampler> sampler)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(std::move(options)) {
  COLOSSAL_CHECK(dataset_ != nullptr, "DataLoader: the dataset is null");
  COLOSSAL_CHECK(options_.batch_size >= 1, "DataLoader: batch_size must be at least 1, got {}", options_.batch_size);
  COLOSSAL_CHECK(options_.num_workers >= 0,
                 "DataLoader: num_workers must be 0 (load on the calling thread) or more, got {}",
                 options_.num_workers);
  COLOSSAL_CHECK(options_.prefetch_factor >= 1, "DataLoader: prefetch_factor must be at least 1, got {}",
                 options_.prefetch_factor);
  if (!sampler_) {
    const int64_t n = dataset_->size();
    sampler_ = options_.shuffle ? std::shared_ptr<Sampler>(std::make_shared<RandomSampler>(n, options_.seed))
                                : std::shared_ptr<Sampler>(std::make_shared<SequentialSampler>(n));
  }
  if (!options_.collate) options_.collate = stack_collate;
  if (options_.device) {
    COLOSSAL_CHECK(options_.device->is_cuda(),
                   "DataLoader: device must be a CUDA device (batches are produced on the CPU already), got {}",
                   *options_.device);
    COLOSSAL_CHECK(
        core::cuda::is_available(), "DataLoader: device is {} but {}; leave device unset to get CPU batches",
        *options_.device,
        core::cuda::device_count() == 0 ? "no GPU is visible (or this build has no CUDA)" : "CUDA is unusable");
    if (!options_.pin_memory.has_value()) options_.pin_memory = true;
    device_stage_ = std::make_unique<DeviceStage>(*options_.device);
  }
  if (options_.pin_memory.value_or(false)) {
    COLOSSAL_CHECK(core::cuda::is_available(),
                   "DataLoader: pin_memory needs CUDA, but no GPU is visible (or this build has no CUDA); set "
                   "pin_memory = false");
    pinned_pool_ = PinnedMemoryPool::create();
    allocate_ = [pool = pinned_pool_](const Shape& shape, DType dtype) { return pool->empty(shape, dtype); };
  } else {
    allocate_ = host_empty;
  }
}

DataLoader::~DataLoader() {
  stop_pass();
  device_stage_.reset();
}

int64_t DataLoader::size() const {
  const int64_t n = sampler_->size();
  return options_.drop_last ? n / options_.batch_size : (n + options_.batch_size - 1) / options_.batch_size;
}

void DataLoader::set_epoch(int64_t epoch) {
  stop_pass();
  epoch_ = epoch;
}

void DataLoader::stop_pass() {
  if (device_stage_) device_stage_->drain();
  if (!pass_) return;
  {
    std::lock_guard lock(pass_->mutex);
    pass_->stop = true;
  }
  pass_->work_cv.notify_all();
  for (auto& t : pass_->workers) t.join();
  pass_.reset();
}

void DataLoader::start(int64_t first_batch) {
  stop_pass();
  auto pass = std::make_unique<Pass>();
  pass->epoch = epoch_;
  sampler_->set_epoch(epoch_);
  dataset_->set_epoch(epoch_);
  const std::vector<int64_t> order = sampler_->indices();
  const auto batch_size = static_cast<size_t>(options_.batch_size);
  for (size_t begin = 0; begin < order.size(); begin += batch_size) {
    const size_t end = std::min(order.size(), begin + batch_size);
    if (end - begin < batch_size && options_.drop_last) break;
    pass->batches.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(begin),
                               order.begin() + static_cast<std::ptrdiff_t>(end));
  }
  COLOSSAL_CHECK(first_batch >= 0 && first_batch <= pass->num_batches(),
                 "DataLoader: cannot start epoch {} at batch {}: the epoch has {} batches (valid: 0..{})", epoch_,
                 first_batch, pass->num_batches(), pass->num_batches());
  // Batches draw their randomness from (seed, epoch, batch index), so skipping the first ones
  // leaves the rest exactly as a full pass would produce them.
  pass->next_claim = pass->next_consume = first_batch;
  pass->capacity = std::max<int64_t>(1, options_.num_workers * options_.prefetch_factor);
  Pass& p = *pass;
  pass_ = std::move(pass);
  const int64_t threads = std::min(options_.num_workers, p.num_batches() - first_batch);
  for (int64_t i = 0; i < threads; ++i) p.workers.emplace_back([this, &p] { worker_loop(p); });
}

Batch DataLoader::produce_batch(int64_t epoch, int64_t batch_index, const std::vector<int64_t>& sample_indices) const {
  std::vector<Example> examples;
  examples.reserve(sample_indices.size());
  for (const int64_t index : sample_indices) {
    try {
      examples.push_back(dataset_->get(index));
    } catch (const std::exception& e) {
      COLOSSAL_FAIL("DataLoader: loading sample {} for batch {} of epoch {} failed: {}", index, batch_index, epoch,
                    e.what());
    }
  }
  Batch batch;
  try {
    batch = options_.collate(examples, allocate_);
  } catch (const std::exception& e) {
    COLOSSAL_FAIL("DataLoader: collating batch {} of epoch {} (samples {}) failed: {}", batch_index, epoch,
                  sample_indices, e.what());
  }
  batch.index = batch_index;
  batch.sample_indices = sample_indices;
  // The batch transform and then the stage draw from the batch's generator, in that order.
  core::Generator generator = derive_generator(options_.seed, RandomStream::batch_transform, epoch, batch_index);
  if (options_.batch_transform) {
    try {
      options_.batch_transform->apply(batch, generator, allocate_);
    } catch (const std::exception& e) {
      COLOSSAL_FAIL("DataLoader: {} failed on batch {} of epoch {}: {}", options_.batch_transform->name(), batch_index,
                    epoch, e.what());
    }
  }
  if (const BatchStage* stage = options_.batch_stage.get()) {
    try {
      stage->prepare(batch, generator, allocate_);
      if (options_.device) {
        (void)stage->output_shape(batch.input.shape());  // a shape error belongs to this batch
      } else {
        run_batch_stage_on_host(*stage, batch, allocate_);
      }
    } catch (const std::exception& e) {
      COLOSSAL_FAIL("DataLoader: {} failed on batch {} of epoch {}: {}", stage->name(), batch_index, epoch, e.what());
    }
  }
  return batch;
}

void DataLoader::worker_loop(Pass& pass) const {
  omp_set_num_threads(1);  // Note [Workers run single-threaded]: affects this thread only
  while (true) {
    int64_t k = 0;
    {
      std::unique_lock lock(pass.mutex);
      pass.work_cv.wait(lock, [&] {
        return pass.stop || pass.next_claim >= pass.num_batches() ||
               pass.next_claim < pass.next_consume + pass.capacity;
      });
      if (pass.stop || pass.next_claim >= pass.num_batches()) return;
      k = pass.next_claim++;
    }
    Pass::Result result;
    try {
      result.batch = produce_batch(pass.epoch, k, pass.batches[static_cast<size_t>(k)]);
    } catch (...) {
      result.error = std::current_exception();
    }
    {
      std::lock_guard lock(pass.mutex);
      pass.ready.emplace(k, std::move(result));
    }
    pass.ready_cv.notify_all();
  }
}

std::optional<Batch> DataLoader::next_host_batch() {
  if (!pass_) start();
  Pass& p = *pass_;
  if (p.finished) return std::nullopt;
  if (p.next_consume >= p.num_batches()) {
    p.finished = true;
    return std::nullopt;
  }
  const int64_t k = p.next_consume;
  Pass::Result result;
  if (p.workers.empty()) {
    try {
      result.batch = produce_batch(p.epoch, k, p.batches[static_cast<size_t>(k)]);
    } catch (...) {
      result.error = std::current_exception();
    }
    ++p.next_consume;
  } else {
    {
      std::unique_lock lock(p.mutex);
      p.ready_cv.wait(lock, [&] { return p.ready.count(k) > 0; });
      auto it = p.ready.find(k);
      result = std::move(it->second);
      p.ready.erase(it);
      ++p.next_consume;
    }
    p.work_cv.notify_all();
  }
  if (result.error) {
    p.finished = true;
    std::rethrow_exception(result.error);
  }
  return std::move(result.batch);
}

std::optional<Batch> DataLoader::next() {
  if (!device_stage_) return next_host_batch();
  DeviceStage& stage = *device_stage_;
  core::cuda::DeviceGuard guard(stage.device);
  stage.reap();
  if (stage.in_flight.empty() && stage.pending_error) {
    std::exception_ptr error = std::exchange(stage.pending_error, nullptr);
    std::rethrow_exception(error);
  }
  // Keep one copy in flight beyond the batch handed out now (see Note [Device prefetch]).
  while (stage.in_flight.size() < 2 && !stage.pending_error) {
    std::optional<Batch> host;
    try {
      host = next_host_batch();
    } catch (...) {
      if (stage.in_flight.empty()) throw;
      stage.pending_error = std::current_exception();
      break;
    }
    if (!host) break;
    stage.in_flight.push_back(stage.start_copy(std::move(*host), options_.batch_stage.get()));
  }
  if (stage.in_flight.empty()) return std::nullopt;
  DeviceStage::InFlight front = std::move(stage.in_flight.front());
  stage.in_flight.pop_front();
  front.ready.block(core::cuda::current_stream(stage.device));
  stage.retired.push_back({std::move(front.host_batch), std::move(front.stage_input), std::move(front.ready)});
  return std::move(front.device_batch);
}

}  // namespace colossal::data
