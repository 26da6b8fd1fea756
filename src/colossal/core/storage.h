// Storage: a ref-counted block of device memory that tensors view. Freed through its device's
// allocator on the stream it was allocated on, once the last view is gone.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "colossal/core/device.h"

namespace colossal::core {

class Storage {
 public:
  Storage() = default;
  /// Allocates nbytes on `device`, ordered on `stream`.
  Storage(size_t nbytes, Device device, Stream stream = {});
  /// Wraps memory owned elsewhere; `release` runs when the last view is gone.
  static Storage wrap(void* data, size_t nbytes, Device device, std::function<void(void*)> release);

  void* data() const { return impl_ ? impl_->data : nullptr; }
  size_t nbytes() const { return impl_ ? impl_->nbytes : 0; }
  Device device() const { return impl_ ? impl_->device : Device{}; }
  bool defined() const { return impl_ != nullptr; }
  long use_count() const { return impl_.use_count(); }
  bool is_same(const Storage& other) const { return impl_ == other.impl_; }
  /// Exchanges the memory (data, size, device, stream, release) of two storages in place: every
  /// tensor viewing this storage sees `other`'s memory from now on, and the reverse. The handles
  /// stay as they are (hence const), their memory moves. ZeRO-3 frees and re-gathers parameters
  /// under the tensors autograd saved, and moves shards between host and device, this way
  /// (Note [Parameters freed in place] in parallel/zero/chunk_manager.cpp). Both must be defined.
  void swap_allocation(const Storage& other) const;

 private:
  struct Impl {
    void* data = nullptr;
    size_t nbytes = 0;
    Device device{};
    Stream stream{};
    std::function<void(void*)> release;  // set for wrapped memory, else the allocator frees
    ~Impl();
  };
  std::shared_ptr<Impl> impl_;
};

}  // namespace colossal::core
