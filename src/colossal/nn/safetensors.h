// Reading and writing safetensors files, the format of Hugging Face Hub and timm checkpoints: an
// 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and byte
// range, then the raw little-endian bytes. Checkpoints, golden test data and Hub weights use it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "colossal/nn/state_dict.h"

namespace colossal::nn {

/// The metadata value `format` of colossal's training checkpoints (engine/checkpoint.h); readers of
/// plain weights use it to tell a checkpoint given in a weights file's place.
inline constexpr const char* kCheckpointFormat = "colossal-checkpoint";

/// One tensor's entry in a safetensors header.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  /// Byte range [begin, end) within the data section (which starts right after the header).
  uint64_t begin = 0;
  uint64_t end = 0;
};

/// A header: the entries in the order of their bytes in the file, and the `__metadata__` strings.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
  /// Where the data section starts in the file (8 + the header's length).
  uint64_t data_start = 0;
};

/// The tensors of a safetensors file (CPU, in the dtypes stored, in file order) and its metadata.
struct SafetensorsFile {
  StateDict tensors;
  std::map<std::string, std::string> metadata;
};

/// Reads and checks the header only (no tensor data): cheap for a multi-gigabyte checkpoint. The
/// checks are those of the reference implementation: the length fits the file, the JSON parses,
/// every entry has a supported dtype (F64, F32, F16, BF16, I64, I32, U8, BOOL), a shape and
/// data_offsets whose length is numel * element size, and the ranges tile the data section with no
/// gap or overlap up to the end of the file. Every error names the file, and the tensor when one is
/// at fault.
SafetensorsHeader read_safetensors_header(const std::filesystem::path& path);

/// Reads every tensor of the file into new CPU tensors; with `wanted`, only the tensors it names
/// (the header is read and checked whole either way).
SafetensorsFile load_safetensors(const std::filesystem::path& path,
                                 const std::function<bool(const std::string& name)>& wanted = {});

/// Writes `tensors` (any device, dtype and strides; none may be undefined) and `metadata` to path.
/// The file is written under a temporary name beside path, synced to the disk and renamed over it
/// only once complete, so a failure (a full disk, a crash, a power cut) never leaves a truncated
/// file under path; a failed write throws naming both files and the system's reason (strerror)
/// and removes the temporary. Tensors are laid out largest element
/// first (then in the dict's order), so each starts aligned to its element size, as the reference
/// writer does; the header is padded with spaces to a multiple of 8 bytes.
void save_safetensors(const std::filesystem::path& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// "F32", "BF16", ...: the safetensors name of a dtype.
std::string safetensors_dtype_name(DType dtype);

}  // namespace colossal::nn
