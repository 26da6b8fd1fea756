// Storage allocation and release through the device allocator.
#include "colossal/core/storage.h"

#include <utility>  // swap

#include "colossal/core/allocator.h"
#include "colossal/core/cuda_device.h"
#include "colossal/core/error.h"

namespace colossal::core {

Storage::Storage(size_t nbytes, Device device, Stream stream) : impl_(std::make_shared<Impl>()) {
  impl_->device = device;
  impl_->stream = stream;
  impl_->stream.device = device;
  // Memory belongs to the stream it was allocated on: resolve "current" now, not at free time.
  if (device.is_cuda() && stream.handle == nullptr) impl_->stream = cuda::current_stream(device);
  impl_->nbytes = nbytes;
  impl_->data = allocator_for(device).allocate(nbytes, impl_->stream);
}

Storage Storage::wrap(void* data, size_t nbytes, Device device, std::function<void(void*)> release) {
  Storage s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->data = data;
  s.impl_->nbytes = nbytes;
  s.impl_->device = device;
  s.impl_->release = std::move(release);
  return s;
}

void Storage::swap_allocation(const Storage& other) const {
  COLOSSAL_CHECK(impl_ != nullptr && other.impl_ != nullptr, "Storage::swap_allocation: both storages must be defined");
  if (impl_ == other.impl_) return;
  std::swap(impl_->data, other.impl_->data);
  std::swap(impl_->nbytes, other.impl_->nbytes);
  std::swap(impl_->device, other.impl_->device);
  std::swap(impl_->stream, other.impl_->stream);
  std::swap(impl_->release, other.impl_->release);
}

Storage::Impl::~Impl() {
  if (release) {
    release(data);
  } else if (data != nullptr) {
    allocator_for(device).deallocate(data, nbytes, stream);
  }
}

}  // namespace colossal::core
