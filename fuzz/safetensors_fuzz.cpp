// Fuzzes the safetensors reader (nn/safetensors.h): the bytes as a file, through load_safetensors,
// which reads and checks the header (read_safetensors_header) and then every tensor's bytes.
#include "colossal/nn/safetensors.h"  // load_safetensors
#include "fuzz_support.h"             // TemporaryFile, accept_errors

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace colossal;
  const fuzz::TemporaryFile file("safetensors", {data, size});
  return fuzz::accept_errors([&] {
    const nn::SafetensorsFile loaded = nn::load_safetensors(file.path());
    // Every tensor read is as large as its header entry says: touch its last byte.
    for (const auto& [name, tensor] : loaded.tensors) {
      if (tensor.numel() > 0) {
        volatile uint8_t last = static_cast<const uint8_t*>(tensor.raw_data())[tensor.nbytes() - 1];
        (void)last;
      }
    }
  });
}
