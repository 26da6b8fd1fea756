// Fuzzes the CIFAR-10 batch reader (data/cifar10.h) on the bytes as one batch file, then reads the
// first and last records of what it accepted.
#include "colossal/data/cifar10.h"  // Cifar10Dataset
#include "fuzz_support.h"           // TemporaryFile, accept_errors

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace colossal;
  const fuzz::TemporaryFile file("cifar10.bin", {data, size});
  return fuzz::accept_errors([&] {
    const data::Cifar10Dataset dataset({file.path()});
    if (dataset.size() > 0) {
      dataset.get(0);
      dataset.get(dataset.size() - 1);
    }
  });
}
