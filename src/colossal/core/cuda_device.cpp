// The CUDA runtime wrapper (core/cuda_device.h). Without CUDA in the build every call beyond the
// availability queries raises an error naming the build option.
#include "colossal/core/cuda_device.h"

#include <functional>
#include <optional>
#include <utility>

#include "colossal/core/build_config.h"

#if COLOSSAL_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <array>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include "colossal/core/allocator.h"
#include "colossal/core/cuda/cuda_check.h"
#endif

namespace colossal::core::cuda {

#if COLOSSAL_WITH_CUDA

namespace {
cudaStream_t as_cuda(Stream s) {
  return static_cast<cudaStream_t>(s.handle);
}

void check_device_index(int device) {
  const int count = device_count();
  COLOSSAL_CHECK(device >= 0 && device < count, "cuda:{} does not exist: {} GPU(s) visible (cuda:0 to cuda:{})", device,
                 count, count - 1);
}

/// One colossal-created stream per device, made on first use, never destroyed (they live as long
/// as the process, like the CUDA context).
Stream default_stream(int device) {
  static std::mutex mutex;
  static std::vector<void*> streams;
  std::lock_guard lock(mutex);
  if (streams.empty()) streams.assign(static_cast<size_t>(std::max(device_count(), 1)), nullptr);
  if (streams[device] == nullptr) {
    streams[device] = create_stream(Device(DeviceType::cuda, device), StreamPriority::compute).handle;
  }
  return Stream{Device(DeviceType::cuda, device), streams[device]};
}

// Per-thread current stream per device; a null handle means "the default stream above".
thread_local std::array<void*, 64> current_streams{};
}  // namespace

bool is_available() {
  return device_count() > 0;
}

int device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no device" error
      return 0;
    }
    return n;
  }();
  return count;
}

int current_device() {
  int d = 0;
  COLOSSAL_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int device) {
  check_device_index(device);
  COLOSSAL_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::DeviceGuard(Device device) {
  COLOSSAL_CHECK(device.is_cuda(), "DeviceGuard needs a CUDA device, got {}", device);
  const int current = current_device();
  if (current != device.index) {
    set_device(device.index);
    previous_ = current;
  }
}
DeviceGuard::~DeviceGuard() {
  // Only a guard that switched restores: cudaSetDevice costs a driver call even to the same device,
  // and guards run several times per op.
  if (previous_ >= 0) cudaSetDevice(previous_);
}

Stream current_stream(Device device) {
  COLOSSAL_CHECK(device.is_cuda(), "current_stream needs a CUDA device, got {}", device);
  check_device_index(device.index);
  void* handle = current_streams.at(static_cast<size_t>(device.index));
  return handle ? Stream{device, handle} : default_stream(device.index);
}

void set_current_stream(Stream stream) {
  COLOSSAL_CHECK(stream.device.is_cuda(), "set_current_stream needs a CUDA stream, got one on {}", stream.device);
  check_device_index(stream.device.index);
  current_streams.at(static_cast<size_t>(stream.device.index)) = stream.handle;
}

Stream create_stream(Device device, StreamPriority priority) {
  DeviceGuard guard(device);
  // Lower numbers are higher priorities: least is 0 (every stream's default), greatest -5 on an H100.
  int least = 0, greatest = 0;
  COLOSSAL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  const int value = priority == StreamPriority::high      ? greatest
                    : priority == StreamPriority::compute ? std::max(greatest, least - 1)
                                                          : least;
  cudaStream_t s;
  COLOSSAL_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, value));
  return Stream{device, s};
}

void destroy_stream(Stream stream) {
  if (stream.handle == nullptr) return;
  allocator_for(stream.device).release_stream(stream);  // its cached blocks must not outlive it
  COLOSSAL_CUDA_CHECK(cudaStreamDestroy(as_cuda(stream)));
}

StreamGuard::StreamGuard(Stream stream) : previous_(current_stream(stream.device)) {
  set_current_stream(stream);
}
StreamGuard::~StreamGuard() {
  current_streams.at(static_cast<size_t>(previous_.device.index)) = previous_.handle;
}

namespace {

/// One deferred check (Note [Deferred device checks]).
struct PendingCheck {
  cudaEvent_t event = nullptr;
  uint64_t* host = nullptr;  // a pinned slot the device value is copied into
  uint64_t ok = 0;
  std::shared_ptr<const void> keep;
  std::function<std::string(uint64_t)> describe;
};

/// Pending checks in the order deferred, and the pinned slots they copy into (allocated in blocks,
/// never freed: a few KiB for the life of the process).
struct DeferredChecks {
  std::mutex mutex;
  std::deque<PendingCheck> pending;
  std::vector<uint64_t*> free_slots;

  uint64_t* take_slot() {
    if (free_slots.empty()) {
      constexpr size_t kBlock = 512;
      void* block = nullptr;
      COLOSSAL_CUDA_CHECK(cudaMallocHost(&block, kBlock * sizeof(uint64_t)));
      for (size_t i = 0; i < kBlock; ++i) free_slots.push_back(static_cast<uint64_t*>(block) + i);
    }
    uint64_t* slot = free_slots.back();
    free_slots.pop_back();
    return slot;
  }
};

DeferredChecks& deferred_checks() {
  static auto* checks = new DeferredChecks();  // outlives every static destructor that might sync
  return *checks;
}

}  // namespace

void resolve_deferred_checks(bool wait) {
  DeferredChecks& checks = deferred_checks();
  std::vector<std::pair<uint64_t, PendingCheck>> failed;
  {
    std::lock_guard<std::mutex> lock(checks.mutex);
    while (!checks.pending.empty()) {
      PendingCheck& check = checks.pending.front();
      if (wait) {
        COLOSSAL_CUDA_CHECK(cudaEventSynchronize(check.event));
      } else {
        const cudaError_t status = cudaEventQuery(check.event);
        if (status == cudaErrorNotReady) {
          (void)cudaGetLastError();  // not an error: leave nothing behind for the next launch check
          break;
        }
        COLOSSAL_CUDA_CHECK(status);
      }
      const uint64_t value = *check.host;
      COLOSSAL_CUDA_CHECK(cudaEventDestroy(check.event));
      checks.free_slots.push_back(check.host);
      if (value != check.ok) failed.emplace_back(value, std::move(check));
      checks.pending.pop_front();
    }
  }
  // Messages are built outside the lock (describe may read the device); the first failure wins.
  if (!failed.empty()) throw Error(failed.front().second.describe(failed.front().first));
}

void defer_check(Stream stream, const void* slot, uint64_t ok, std::shared_ptr<const void> keep,
                 std::function<std::string(uint64_t value)> describe) {
  resolve_deferred_checks(false);
  DeferredChecks& checks = deferred_checks();
  std::lock_guard<std::mutex> lock(checks.mutex);
  PendingCheck check;
  check.host = checks.take_slot();
  check.ok = ok;
  check.keep = std::move(keep);
  check.describe = std::move(describe);
  COLOSSAL_CUDA_CHECK(cudaMemcpyAsync(check.host, slot, sizeof(uint64_t), cudaMemcpyDeviceToHost, as_cuda(stream)));
  COLOSSAL_CUDA_CHECK(cudaEventCreateWithFlags(&check.event, cudaEventDisableTiming));
  COLOSSAL_CUDA_CHECK(cudaEventRecord(check.event, as_cuda(stream)));
  checks.pending.push_back(std::move(check));
}

void synchronize(Device device) {
  {
    DeviceGuard guard(device);
    COLOSSAL_CUDA_CHECK(cudaDeviceSynchronize());
  }
  resolve_deferred_checks(true);
}
void synchronize(Stream stream) {
  COLOSSAL_CUDA_CHECK(cudaStreamSynchronize(as_cuda(stream)));
  resolve_deferred_checks(false);
}

Event::Event(bool enable_timing) : timing_(enable_timing) {}
Event::~Event() {
  if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}
Event::Event(Event&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_), timing_(other.timing_) {}
Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
    timing_ = other.timing_;
  }
  return *this;
}
void Event::record(Stream stream) {
  const int device = stream.device.index;
  if (handle_ == nullptr || device_ != device) {
    if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
    handle_ = nullptr;
    DeviceGuard guard(stream.device);
    cudaEvent_t e;
    COLOSSAL_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing_ ? cudaEventDefault : cudaEventDisableTiming));
    handle_ = e;
    device_ = device;
  }
  COLOSSAL_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), as_cuda(stream)));
}
void Event::block(Stream stream) const {
  if (handle_ == nullptr) return;  // never recorded: nothing to wait for
  COLOSSAL_CUDA_CHECK(cudaStreamWaitEvent(as_cuda(stream), static_cast<cudaEvent_t>(handle_), 0));
}
void Event::synchronize() const {
  if (handle_ == nullptr) return;
  COLOSSAL_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)));
}
bool Event::query() const {
  if (handle_ == nullptr) return true;
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
  if (status == cudaErrorNotReady) return false;
  COLOSSAL_CUDA_CHECK(status);
  return true;
}
float Event::elapsed_ms(const Event& end) const {
  COLOSSAL_CHECK(handle_ != nullptr && end.handle_ != nullptr,
                 "Event::elapsed_ms: both events must have been recorded first");
  float ms = 0;
  COLOSSAL_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle_), static_cast<cudaEvent_t>(end.handle_)));
  return ms;
}

Tensor pinned_empty(const Shape& shape, DType dtype) {
  const size_t nbytes = checked_nbytes(shape, dtype, "pinned_empty");
  void* ptr = nullptr;
  COLOSSAL_CUDA_CHECK(cudaHostAlloc(&ptr, std::max<size_t>(nbytes, 1), cudaHostAllocDefault));
  Storage storage = Storage::wrap(ptr, nbytes, kCpu, [](void* p) { cudaFreeHost(p); });
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), shape, contiguous_strides(shape), 0, dtype));
}

bool is_pinned(const Tensor& t) {
  if (!t.device().is_cpu() || t.storage().data() == nullptr) return false;
  cudaPointerAttributes attributes;
  if (cudaPointerGetAttributes(&attributes, t.storage().data()) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
}

void copy_async(const Tensor& dst, const Tensor& src, Stream stream) {
  COLOSSAL_CHECK(dst.is_contiguous() && src.is_contiguous() && dst.dtype() == src.dtype() &&
                     dst.numel() == src.numel() && (dst.device().is_cuda() || src.device().is_cuda()),
                 "copy_async: needs contiguous tensors of one dtype and size, at least one on a GPU; got {} {} on {} "
                 "and {} {} on {}",
                 dst.dtype(), dst.shape(), dst.device(), src.dtype(), src.shape(), src.device());
  if (dst.numel() == 0) return;
  const cudaMemcpyKind kind = dst.device().is_cuda() && src.device().is_cuda() ? cudaMemcpyDeviceToDevice
                              : dst.device().is_cuda()                         ? cudaMemcpyHostToDevice
                                                                               : cudaMemcpyDeviceToHost;
  DeviceGuard guard(stream.device);
  COLOSSAL_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), kind, as_cuda(stream)));
}

DeviceProperties properties(int device) {
  check_device_index(device);
  cudaDeviceProp p;
  COLOSSAL_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return DeviceProperties{p.name,
                          p.major,
                          p.minor,
                          p.multiProcessorCount,
                          static_cast<int64_t>(p.totalGlobalMem),
                          static_cast<int64_t>(p.l2CacheSize)};
}

std::pair<int64_t, int64_t> memory_info(int device) {
  DeviceGuard guard(Device(DeviceType::cuda, device));
  size_t free_bytes = 0, total_bytes = 0;
  COLOSSAL_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

std::optional<int> runtime_version() {
  int version = 0;
  if (cudaRuntimeGetVersion(&version) != cudaSuccess) return std::nullopt;
  return version;
}

std::optional<int> driver_version() {
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess || version == 0) return std::nullopt;
  return version;
}

namespace {

using StreamValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

StreamValue64 driver_stream_value(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  COLOSSAL_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found));
  COLOSSAL_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr, "the CUDA driver has no {}", name);
  return reinterpret_cast<StreamValue64>(fn);
}

}  // namespace

void write_value(Stream stream, void* address, uint64_t value) {
  static const StreamValue64 fn = driver_stream_value("cuStreamWriteValue64");
  const CUresult status = fn(static_cast<CUstream>(stream.handle), reinterpret_cast<CUdeviceptr>(address), value,
                             CU_STREAM_WRITE_VALUE_DEFAULT);
  COLOSSAL_CHECK(status == CUDA_SUCCESS, "cuStreamWriteValue64 failed ({})", static_cast<int>(status));
}

void wait_value(Stream stream, const void* address, uint64_t value) {
  static const StreamValue64 fn = driver_stream_value("cuStreamWaitValue64");
  const CUresult status =
      fn(static_cast<CUstream>(stream.handle), reinterpret_cast<CUdeviceptr>(address), value, CU_STREAM_WAIT_VALUE_GEQ);
  COLOSSAL_CHECK(status == CUDA_SUCCESS, "cuStreamWaitValue64 failed ({})", static_cast<int>(status));
}

#else  // no CUDA in this build

namespace {
[[noreturn]] void no_cuda(const char* what) {
  COLOSSAL_FAIL(
      "{}: this build of colossal has no CUDA (configure with -DCOLOSSAL_CUDA=ON on a machine with the CUDA "
      "toolkit)",
      what);
}
}  // namespace

bool is_available() {
  return false;
}
int device_count() {
  return 0;
}
int current_device() {
  no_cuda("current_device");
}
void set_device(int) {
  no_cuda("set_device");
}
DeviceGuard::DeviceGuard(Device) {
  no_cuda("DeviceGuard");
}
DeviceGuard::~DeviceGuard() = default;
Stream current_stream(Device) {
  no_cuda("current_stream");
}
void set_current_stream(Stream) {
  no_cuda("set_current_stream");
}
Stream create_stream(Device, StreamPriority) {
  no_cuda("create_stream");
}
void destroy_stream(Stream) {
  no_cuda("destroy_stream");
}
StreamGuard::StreamGuard(Stream) {
  no_cuda("StreamGuard");
}
StreamGuard::~StreamGuard() = default;
void defer_check(Stream, const void*, uint64_t, std::shared_ptr<const void>, std::function<std::string(uint64_t)>) {
  no_cuda("defer_check");
}
void resolve_deferred_checks(bool) {}
void synchronize(Device) {
  no_cuda("synchronize");
}
void synchronize(Stream) {
  no_cuda("synchronize");
}
Event::Event(bool) {
  no_cuda("Event");
}
Event::~Event() = default;
Event::Event(Event&&) noexcept {}
Event& Event::operator=(Event&&) noexcept {
  return *this;
}
void Event::record(Stream) {
  no_cuda("Event::record");
}
void Event::block(Stream) const {
  no_cuda("Event::block");
}
void Event::synchronize() const {
  no_cuda("Event::synchronize");
}
bool Event::query() const {
  no_cuda("Event::query");
}
float Event::elapsed_ms(const Event&) const {
  no_cuda("Event::elapsed_ms");
}
std::optional<int> runtime_version() {
  return std::nullopt;
}
std::optional<int> driver_version() {
  return std::nullopt;
}
Tensor pinned_empty(const Shape&, DType) {
  no_cuda("pinned_empty");
}
bool is_pinned(const Tensor&) {
  return false;
}
void copy_async(const Tensor&, const Tensor&, Stream) {
  no_cuda("copy_async");
}
void hold(Stream, double) {
  no_cuda("hold");
}
void write_value(Stream, void*, uint64_t) {
  no_cuda("write_value");
}
void wait_value(Stream, const void*, uint64_t) {
  no_cuda("wait_value");
}
DeviceProperties properties(int) {
  no_cuda("properties");
}
std::pair<int64_t, int64_t> memory_info(int) {
  no_cuda("memory_info");
}

#endif

}  // namespace colossal::core::cuda
