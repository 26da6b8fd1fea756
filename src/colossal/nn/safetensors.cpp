// safetensors: header parsing and validation (nlohmann-json), tensor reads straight into tensor
// storage, and the write-to-temporary-then-rename writer.
#include "colossal/nn/safetensors.h"

#include <fcntl.h>   // open
#include <unistd.h>  // getpid, fsync, close

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "colossal/core/view.h"  // contiguous_raw, to_device_raw

namespace colossal::nn {

namespace {

// The bytes on disk are little-endian; tensors are copied in and out without byte swapping.
static_assert(std::endian::native == std::endian::little, "safetensors IO assumes a little-endian host");

/// The reference implementation refuses headers over 100 MB: a larger one is corruption, and
/// reading it would allocate whatever a damaged length field says.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr std::array<DTypeName, 8> kDTypeNames{{{DType::f64, "F64"},
                                                {DType::f32, "F32"},
                                                {DType::f16, "F16"},
                                                {DType::bf16, "BF16"},
                                                {DType::i64, "I64"},
                                                {DType::i32, "I32"},
                                                {DType::u8, "U8"},
                                                {DType::boolean, "BOOL"}}};

std::string file_label(const std::filesystem::path& path) {
  return fmt::format("safetensors file '{}'", path.string());
}

uint64_t read_u64_le(const unsigned char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

/// numel * element size, or nullopt when it overflows 64 bits.
std::optional<uint64_t> byte_size(const Shape& shape, DType dtype) {
  uint64_t total = core::element_size(dtype);
  for (int64_t size : shape) {
    if (__builtin_mul_overflow(total, static_cast<uint64_t>(size), &total)) return std::nullopt;
  }
  return total;
}

SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& value, const std::string& where) {
  const std::string what = fmt::format("{}: tensor '{}'", where, name);
  COLOSSAL_CHECK(value.is_object(), "{}: the header entry must be an object with dtype, shape and data_offsets, got {}",
                 what, value.dump());
  SafetensorsEntry entry;
  entry.name = name;

  const auto dtype_it = value.find("dtype");
  COLOSSAL_CHECK(dtype_it != value.end() && dtype_it->is_string(), "{}: the header entry has no string 'dtype'", what);
  const std::string dtype_name = dtype_it->get<std::string>();
  const auto known =
      std::find_if(kDTypeNames.begin(), kDTypeNames.end(), [&](const DTypeName& d) { return dtype_name == d.name; });
  COLOSSAL_CHECK(known != kDTypeNames.end(),
                 "{}: dtype '{}' is not one colossal holds (F64, F32, F16, BF16, I64, I32, U8, BOOL); convert the "
                 "checkpoint first",
                 what, dtype_name);
  entry.dtype = known->dtype;

  const auto shape_it = value.find("shape");
  COLOSSAL_CHECK(shape_it != value.end() && shape_it->is_array(), "{}: the header entry has no array 'shape'", what);
  for (const nlohmann::json& size : *shape_it) {
    COLOSSAL_CHECK(
        size.is_number_unsigned() && size.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
        "{}: shape {} must hold non-negative integers", what, shape_it->dump());
    entry.shape.push_back(size.get<int64_t>());
  }

  const auto offsets_it = value.find("data_offsets");
  COLOSSAL_CHECK(offsets_it != value.end() && offsets_it->is_array() && offsets_it->size() == 2 &&
                     (*offsets_it)[0].is_number_unsigned() && (*offsets_it)[1].is_number_unsigned(),
                 "{}: data_offsets must be [begin, end] with non-negative integers, got {}", what,
                 offsets_it == value.end() ? std::string("nothing") : offsets_it->dump());
  entry.begin = (*offsets_it)[0].get<uint64_t>();
  entry.end = (*offsets_it)[1].get<uint64_t>();
  COLOSSAL_CHECK(entry.begin <= entry.end, "{}: data_offsets [{}, {}] end before they begin", what, entry.begin,
                 entry.end);
  const std::optional<uint64_t> expected = byte_size(entry.shape, entry.dtype);
  COLOSSAL_CHECK(expected.has_value(), "{}: shape {} overflows 64-bit byte counts", what, entry.shape);
  COLOSSAL_CHECK(entry.end - entry.begin == *expected,
                 "{}: data_offsets [{}, {}] span {} bytes, but {} {} needs {} bytes", what, entry.begin, entry.end,
                 entry.end - entry.begin, dtype_name, entry.shape, *expected);
  return entry;
}

}  // namespace

std::string safetensors_dtype_name(DType dtype) {
  for (const DTypeName& d : kDTypeNames) {
    if (d.dtype == dtype) return d.name;
  }
  COLOSSAL_FAIL("safetensors has no name for dtype {}", dtype);
}

SafetensorsHeader read_safetensors_header(const std::filesystem::path& path) {
  const std::string where = file_label(path);
  std::error_code error;
  const uint64_t file_size = std::filesystem::file_size(path, error);
  COLOSSAL_CHECK(!error, "{}: cannot read it: {}", where, error.message());
  std::ifstream in(path, std::ios::binary);
  COLOSSAL_CHECK(in.is_open(), "{}: cannot open it: {}", where, std::strerror(errno));

  COLOSSAL_CHECK(file_size >= 8,
                 "{}: the file is {} bytes, shorter than the 8-byte header length every safetensors file starts with "
                 "(truncated, or not a safetensors file)",
                 where, file_size);
  std::array<unsigned char, 8> length_bytes{};
  in.read(reinterpret_cast<char*>(length_bytes.data()), 8);
  COLOSSAL_CHECK(in.good(), "{}: cannot read the header length", where);
  const uint64_t header_length = read_u64_le(length_bytes.data());
  COLOSSAL_CHECK(header_length <= file_size - 8,
                 "{}: the header length says {} bytes, but only {} bytes follow it (truncated, or not a safetensors "
                 "file)",
                 where, header_length, file_size - 8);
  COLOSSAL_CHECK(header_length <= kMaxHeaderBytes,
                 "{}: the header length says {} bytes, over the format's limit of {} (corrupt, or not a safetensors "
                 "file)",
                 where, header_length, kMaxHeaderBytes);

  std::string text(header_length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_length));
  COLOSSAL_CHECK(in.good(), "{}: cannot read the {}-byte header", where, header_length);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // Not only parse_error: a number too large for a double (1E400) is out_of_range.
    COLOSSAL_FAIL("{}: the header is not valid JSON ({}); the file is corrupt or not safetensors", where, e.what());
  }
  COLOSSAL_CHECK(json.is_object(), "{}: the header must be a JSON object, got {}", where, json.type_name());

  SafetensorsHeader header;
  header.data_start = 8 + header_length;
  for (const auto& [key, value] : json.items()) {
    if (key == "__metadata__") {
      COLOSSAL_CHECK(value.is_object(), "{}: __metadata__ must be an object of strings, got {}", where,
                     value.type_name());
      for (const auto& [meta_key, meta_value] : value.items()) {
        COLOSSAL_CHECK(meta_value.is_string(), "{}: __metadata__ '{}' must be a string, got {}", where, meta_key,
                       meta_value.type_name());
        header.metadata.emplace(meta_key, meta_value.get<std::string>());
      }
      continue;
    }
    header.entries.push_back(parse_entry(key, value, where));
  }

  // The byte ranges must tile the data section exactly, as the reference reader demands: a gap or
  // an overlap means the header and the data disagree.
  // (A zero-size tensor shares its begin with the next one and sorts first.)
  std::stable_sort(header.entries.begin(), header.entries.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  const uint64_t data_size = file_size - header.data_start;
  uint64_t expected_begin = 0;
  for (const SafetensorsEntry& entry : header.entries) {
    COLOSSAL_CHECK(entry.begin == expected_begin,
                   "{}: tensor '{}' starts at data byte {}, but the tensors before it end at byte {}: the header's "
                   "data_offsets {} (corrupt header)",
                   where, entry.name, entry.begin, expected_begin,
                   entry.begin > expected_begin ? "leave a gap" : "overlap");
    COLOSSAL_CHECK(entry.end <= data_size,
                   "{}: tensor '{}' needs data bytes [{}, {}), but the file holds only {} bytes of data: the file is "
                   "truncated",
                   where, entry.name, entry.begin, entry.end, data_size);
    expected_begin = entry.end;
  }
  COLOSSAL_CHECK(expected_begin == data_size,
                 "{}: {} bytes follow the last tensor's data; the header does not describe the whole file (corrupt "
                 "or not safetensors)",
                 where, data_size - expected_begin);
  return header;
}

SafetensorsFile load_safetensors(const std::filesystem::path& path,
                                 const std::function<bool(const std::string& name)>& wanted) {
  const std::string where = file_label(path);
  SafetensorsHeader header = read_safetensors_header(path);
  std::ifstream in(path, std::ios::binary);
  COLOSSAL_CHECK(in.is_open(), "{}: cannot open it: {}", where, std::strerror(errno));

  SafetensorsFile file;
  file.metadata = std::move(header.metadata);
  for (const SafetensorsEntry& entry : header.entries) {
    if (wanted && !wanted(entry.name)) continue;
    Tensor tensor = core::empty(entry.shape, entry.dtype);
    const uint64_t bytes = entry.end - entry.begin;
    if (bytes > 0) {
      in.seekg(static_cast<std::streamoff>(header.data_start + entry.begin));
      in.read(static_cast<char*>(tensor.raw_data()), static_cast<std::streamsize>(bytes));
      COLOSSAL_CHECK(in.good(), "{}: tensor '{}': reading its {} bytes failed (the file changed or is unreadable)",
                     where, entry.name, bytes);
    }
    if (entry.dtype == DType::boolean) {
      // Any byte but 0 and 1 in a bool is not a value our kernels can compute with.
      const auto* values = static_cast<const uint8_t*>(tensor.raw_data());
      for (int64_t i = 0; i < tensor.numel(); ++i) {
        COLOSSAL_CHECK(values[i] <= 1, "{}: tensor '{}': BOOL element {} holds byte {}, which is neither 0 nor 1",
                       where, entry.name, i, values[i]);
      }
    }
    file.tensors.insert(entry.name, std::move(tensor));
  }
  return file;
}

void save_safetensors(const std::filesystem::path& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string where = file_label(path);
  struct Pending {
    const std::string* name;
    Tensor tensor;
  };
  std::vector<Pending> pending;
  for (const auto& [name, tensor] : tensors) {
    COLOSSAL_CHECK(!name.empty() && name != "__metadata__", "{}: '{}' cannot name a tensor", where, name);
    COLOSSAL_CHECK(tensor.defined(), "{}: tensor '{}' is undefined", where, name);
    pending.push_back({&name, tensor});
  }
  std::stable_sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) {
    return a.tensor.element_size() > b.tensor.element_size();
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Pending& p : pending) {
    const uint64_t bytes = p.tensor.nbytes();
    header[*p.name] = {{"dtype", safetensors_dtype_name(p.tensor.dtype())},
                       {"shape", p.tensor.shape()},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Padding to 8 bytes puts the data section, and with it every tensor, at an aligned offset.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');

  const std::filesystem::path temporary = path.string() + fmt::format(".tmp.{}", static_cast<long>(::getpid()));
  // errno is read right after the call that failed, before anything else can change it.
  const auto fail = [&](const char* what) {
    const int error = errno;
    COLOSSAL_FAIL("{}: cannot {} '{}': {}{}", where, what, temporary.string(),
                  error != 0 ? std::strerror(error) : "unknown error",
                  error == ENOSPC || error == EDQUOT ? " (free space on that disk, or write elsewhere)" : "");
  };
  try {
    errno = 0;
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out.is_open()) fail("create");
    std::array<char, 8> length_bytes{};
    for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
    out.write(length_bytes.data(), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!out.good()) fail("write");
    for (const Pending& p : pending) {
      const Tensor cpu =
          core::contiguous_raw(p.tensor.device().is_cpu() ? p.tensor : core::to_device_raw(p.tensor, core::kCpu));
      errno = 0;
      out.write(static_cast<const char*>(cpu.raw_data()), static_cast<std::streamsize>(cpu.nbytes()));
      if (!out.good()) fail("write");
    }
    errno = 0;
    out.flush();
    if (!out.good()) fail("write");
    out.close();
    if (out.fail()) fail("close");
    // On the disk before the rename, so that after a power cut the name holds the old file or the
    // whole new one (ext4 and xfs may otherwise commit the rename before the data).
    errno = 0;
    const int fd = ::open(temporary.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("reopen");
    const bool synced = ::fsync(fd) == 0;
    const int sync_error = errno;
    ::close(fd);
    errno = sync_error;
    if (!synced) fail("sync");
    std::error_code error;
    std::filesystem::rename(temporary, path, error);
    COLOSSAL_CHECK(!error, "{}: renaming '{}' over it failed: {}", where, temporary.string(), error.message());
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw;
  }
}

}  // namespace colossal::nn
