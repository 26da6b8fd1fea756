// TensorBoard event files: see tensorboard.h. The Event message is encoded and decoded by hand
// (protobuf wire format: varints, fixed32/fixed64, length-delimited) since only a handful of its
// fields are ever written. Debian ships no C/C++ CRC-32C library, so the table-driven one lives here.
#include "colossal/engine/tensorboard.h"

#include <unistd.h>  // gethostname

#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>  // strerror
#include <ctime>
#include <filesystem>
#include <iterator>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/core.h>

#include "colossal/core/error.h"  // COLOSSAL_CHECK, COLOSSAL_FAIL

namespace colossal::engine {
namespace {

// ---- CRC-32C

constexpr uint32_t kCrc32cPolynomial = 0x82F63B78;  // Castagnoli's 0x1EDC6F41, bit-reversed
constexpr uint32_t kCrcMaskDelta = 0xa282ead8;

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) != 0 ? kCrc32cPolynomial : 0u);
    table[byte] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// ---- Protobuf wire format (only what Event, Summary and Summary.Value need)

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// Event's and Summary's field numbers (tensorflow/core/util/event.proto, framework/summary.proto).
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersionField = 3, kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2;

class ProtoWriter {
 public:
  void varint(uint64_t value) {
    while (value >= 0x80) {
      bytes_.push_back(static_cast<char>((value & 0x7f) | 0x80));
      value >>= 7;
    }
    bytes_.push_back(static_cast<char>(value));
  }
  void fixed(uint64_t value, int num_bytes) {
    for (int i = 0; i < num_bytes; ++i) bytes_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
  void key(uint32_t field, WireType type) { varint((static_cast<uint64_t>(field) << 3) | type); }

  void double_field(uint32_t field, double value) {
    key(field, kFixed64);
    fixed(std::bit_cast<uint64_t>(value), 8);
  }
  void float_field(uint32_t field, float value) {
    key(field, kFixed32);
    fixed(std::bit_cast<uint32_t>(value), 4);
  }
  // int64 fields are varints of the two's-complement value (ten bytes when negative).
  void int64_field(uint32_t field, int64_t value) {
    key(field, kVarint);
    varint(static_cast<uint64_t>(value));
  }
  void bytes_field(uint32_t field, std::string_view value) {
    key(field, kLengthDelimited);
    varint(value.size());
    bytes_.append(value);
  }

  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// Thrown by ProtoReader and caught by read_event_file, which adds the file and the offset.
struct MalformedEvent {
  size_t position;  // within the payload
  std::string what;
};

class ProtoReader {
 public:
  explicit ProtoReader(std::string_view bytes, size_t base = 0) : bytes_(bytes), base_(base) {}

  bool done() const { return pos_ >= bytes_.size(); }
  // Position within the outermost payload, for messages.
  size_t position() const { return base_ + pos_; }

  uint64_t varint() {
    const size_t start = pos_;
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= bytes_.size()) throw MalformedEvent{base_ + start, "varint runs past the end of its message"};
      const auto byte = static_cast<uint8_t>(bytes_[pos_++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    throw MalformedEvent{base_ + start, "varint longer than 10 bytes"};
  }
  uint64_t fixed(int num_bytes) {
    need(static_cast<size_t>(num_bytes), "fixed-width value");
    uint64_t value = 0;
    for (int i = 0; i < num_bytes; ++i) value |= static_cast<uint64_t>(static_cast<uint8_t>(bytes_[pos_++])) << (8 * i);
    return value;
  }
  // A length-delimited field's bytes, and the reader positioned after them.
  std::string_view bytes(size_t* start = nullptr) {
    const uint64_t length = varint();
    need(length, "length-delimited field");
    if (start != nullptr) *start = base_ + pos_;
    std::string_view view = bytes_.substr(pos_, length);
    pos_ += length;
    return view;
  }
  void skip(WireType type) {
    switch (type) {
      case kVarint:
        varint();
        return;
      case kFixed64:
        fixed(8);
        return;
      case kFixed32:
        fixed(4);
        return;
      case kLengthDelimited:
        bytes();
        return;
    }
    throw MalformedEvent{position(), fmt::format("unsupported wire type {}", static_cast<uint32_t>(type))};
  }
  // The next field's number and wire type.
  std::pair<uint32_t, WireType> key() {
    key_start_ = pos_;
    const uint64_t key = varint();
    const auto type = static_cast<uint32_t>(key & 7);
    if (type != kVarint && type != kFixed64 && type != kLengthDelimited && type != kFixed32) {
      throw MalformedEvent{base_ + key_start_,
                           fmt::format("field {} has wire type {} (groups and unknown wire types are "
                                       "not Event fields)",
                                       key >> 3, type)};
    }
    return {static_cast<uint32_t>(key >> 3), static_cast<WireType>(type)};
  }
  // Throws unless the field key() just read has the wire type its schema gives it.
  void expect(uint32_t field, WireType type, WireType expected, const char* name) const {
    if (type != expected) {
      throw MalformedEvent{base_ + key_start_,
                           fmt::format("field {} ({}) has wire type {}, expected {}", field, name,
                                       static_cast<uint32_t>(type), static_cast<uint32_t>(expected))};
    }
  }

 private:
  void need(uint64_t count, const char* what) const {
    if (count > bytes_.size() - pos_) {
      throw MalformedEvent{position(), fmt::format("{} of {} bytes runs past the end of its message ({} left)", what,
                                                   count, bytes_.size() - pos_)};
    }
  }

  std::string_view bytes_;
  size_t base_;
  size_t pos_ = 0;
  size_t key_start_ = 0;  // where the last key() began
};

std::string encode_scalar_event(const std::string& tag, float value, int64_t step, double wall_time) {
  ProtoWriter summary_value;
  summary_value.bytes_field(kValueTag, tag);
  summary_value.float_field(kValueSimpleValue, value);
  ProtoWriter summary;
  summary.bytes_field(kSummaryValue, summary_value.bytes());
  ProtoWriter event;
  event.double_field(kEventWallTime, wall_time);
  event.int64_field(kEventStep, step);
  event.bytes_field(kEventSummary, summary.bytes());
  return event.bytes();
}

std::string encode_version_event(double wall_time) {
  ProtoWriter event;
  event.double_field(kEventWallTime, wall_time);
  event.bytes_field(kEventFileVersionField, kEventFileVersion);
  return event.bytes();
}

std::optional<EventScalar> decode_summary_value(std::string_view bytes, size_t base) {
  ProtoReader reader(bytes, base);
  EventScalar scalar;
  bool has_simple_value = false;
  while (!reader.done()) {
    const auto [field, type] = reader.key();
    if (field == kValueTag) {
      reader.expect(field, type, kLengthDelimited, "Summary.Value.tag");
      scalar.tag = std::string(reader.bytes());
    } else if (field == kValueSimpleValue) {
      reader.expect(field, type, kFixed32, "Summary.Value.simple_value");
      scalar.value = std::bit_cast<float>(static_cast<uint32_t>(reader.fixed(4)));
      has_simple_value = true;
    } else {
      reader.skip(type);
    }
  }
  if (!has_simple_value) return std::nullopt;
  return scalar;
}

void decode_event(std::string_view payload, EventRecord& record) {
  ProtoReader reader(payload);
  while (!reader.done()) {
    const auto [field, type] = reader.key();
    if (field == kEventWallTime) {
      reader.expect(field, type, kFixed64, "Event.wall_time");
      record.wall_time = std::bit_cast<double>(reader.fixed(8));
    } else if (field == kEventStep) {
      reader.expect(field, type, kVarint, "Event.step");
      record.step = static_cast<int64_t>(reader.varint());
    } else if (field == kEventFileVersionField) {
      reader.expect(field, type, kLengthDelimited, "Event.file_version");
      record.file_version = std::string(reader.bytes());
    } else if (field == kEventSummary) {
      reader.expect(field, type, kLengthDelimited, "Event.summary");
      size_t summary_start = 0;
      ProtoReader summary(reader.bytes(&summary_start), summary_start);
      while (!summary.done()) {
        const auto [summary_field, summary_type] = summary.key();
        if (summary_field != kSummaryValue) {
          summary.skip(summary_type);
          continue;
        }
        summary.expect(summary_field, summary_type, kLengthDelimited, "Summary.value");
        size_t value_start = 0;
        const std::string_view value_bytes = summary.bytes(&value_start);
        if (auto scalar = decode_summary_value(value_bytes, value_start)) record.scalars.push_back(std::move(*scalar));
      }
    } else {
      reader.skip(type);
    }
  }
}

uint64_t load_le(const std::string& bytes, size_t pos, int num_bytes) {
  uint64_t value = 0;
  for (int i = 0; i < num_bytes; ++i) value |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[pos + i])) << (8 * i);
  return value;
}

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0 || name[0] == '\0') return "localhost";
  return std::string(name.data());
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) crc = kCrc32cTable[(crc ^ bytes[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

uint32_t mask_crc32c(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + kCrcMaskDelta;
}

// ---- EventFileWriter

namespace {

/// Throws naming the event file and the system's reason for the failed `what` (read from errno
/// right after the failing call, which the callers clear before it).
[[noreturn]] void fail_io(const std::string& path, const char* what) {
  const int error = errno;
  COLOSSAL_FAIL("TensorBoard event file '{}': {} failed: {}{}", path, what,
                error != 0 ? std::strerror(error) : "unknown error",
                error == ENOSPC || error == EDQUOT ? " (free space on its disk or choose another train.log_dir)" : "");
}

}  // namespace

EventFileWriter::EventFileWriter(const std::string& log_dir) {
  std::error_code error;
  std::filesystem::create_directories(log_dir, error);
  COLOSSAL_CHECK(!error, "EventFileWriter: cannot create log directory '{}': {}", log_dir, error.message());
  const std::string base =
      (std::filesystem::path(log_dir) /
       fmt::format("events.out.tfevents.{}.{}", static_cast<int64_t>(std::time(nullptr)), host_name()))
          .string();
  path_ = base;
  for (int suffix = 1; std::filesystem::exists(path_); ++suffix) path_ = fmt::format("{}.{}", base, suffix);
  errno = 0;
  file_.open(path_, std::ios::out | std::ios::binary | std::ios::trunc);
  if (!file_.is_open()) fail_io(path_, "opening it for writing");
  write_record(encode_version_event(unix_seconds_now()));
}

EventFileWriter::~EventFileWriter() {
  // A destructor must not throw; a failed final flush has nowhere better to be reported.
  try {
    close();
  } catch (...) {
  }
}

void EventFileWriter::add_scalar(const std::string& tag, double value, int64_t step, std::optional<double> wall_time) {
  COLOSSAL_CHECK(file_.is_open(), "EventFileWriter: add_scalar('{}') after close of '{}'", tag, path_);
  write_record(encode_scalar_event(tag, static_cast<float>(value), step, wall_time.value_or(unix_seconds_now())));
}

void EventFileWriter::flush() {
  if (!file_.is_open()) return;
  errno = 0;
  file_.flush();
  if (!file_.good()) fail_io(path_, "writing");
}

void EventFileWriter::close() {
  if (!file_.is_open()) return;
  errno = 0;
  file_.flush();
  if (!file_.good()) {
    const int error = errno;
    file_.close();  // a closed writer refuses further scalars instead of failing on each
    errno = error;
    fail_io(path_, "writing");
  }
  file_.close();
  if (file_.fail()) fail_io(path_, "closing");
}

void EventFileWriter::write_record(const std::string& payload) {
  // TFRecord frame: u64 length, masked CRC of those 8 bytes, payload, masked CRC of the payload.
  ProtoWriter header;
  header.fixed(payload.size(), 8);
  ProtoWriter length_crc, payload_crc;
  length_crc.fixed(mask_crc32c(crc32c(header.bytes().data(), 8)), 4);
  payload_crc.fixed(mask_crc32c(crc32c(payload.data(), payload.size())), 4);
  errno = 0;
  file_ << header.bytes() << length_crc.bytes() << payload << payload_crc.bytes();
  if (!file_.good()) fail_io(path_, "writing");
}

// ---- read_event_file

std::vector<EventRecord> read_event_file(const std::string& path) {
  std::ifstream file(path, std::ios::in | std::ios::binary);
  COLOSSAL_CHECK(file.is_open(), "read_event_file: cannot open '{}'", path);
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());

  constexpr size_t kHeaderBytes = 12;  // u64 length + u32 masked CRC
  constexpr size_t kFooterBytes = 4;   // u32 masked CRC of the payload
  std::vector<EventRecord> records;
  size_t offset = 0;
  while (offset < bytes.size()) {
    const size_t left = bytes.size() - offset;
    const size_t index = records.size();
    COLOSSAL_CHECK(left >= kHeaderBytes,
                   "read_event_file: '{}': truncated length at byte offset {} (record {}): {} bytes left, a record "
                   "header needs {}",
                   path, offset, index, left, kHeaderBytes);
    const uint64_t length = load_le(bytes, offset, 8);
    const auto stored_length_crc = static_cast<uint32_t>(load_le(bytes, offset + 8, 4));
    const uint32_t length_crc = mask_crc32c(crc32c(bytes.data() + offset, 8));
    COLOSSAL_CHECK(stored_length_crc == length_crc,
                   "read_event_file: '{}': bad length CRC at byte offset {} (record {}): stored {:#010x}, computed "
                   "{:#010x}",
                   path, offset, index, stored_length_crc, length_crc);
    COLOSSAL_CHECK(length <= left - kHeaderBytes && left - kHeaderBytes - length >= kFooterBytes,
                   "read_event_file: '{}': truncated payload at byte offset {} (record {}): the record needs {} bytes "
                   "of payload and CRC, {} are left",
                   path, offset, index, length + kFooterBytes, left - kHeaderBytes);
    const std::string_view payload(bytes.data() + offset + kHeaderBytes, length);
    const auto stored_payload_crc = static_cast<uint32_t>(load_le(bytes, offset + kHeaderBytes + length, 4));
    const uint32_t payload_crc = mask_crc32c(crc32c(payload.data(), payload.size()));
    COLOSSAL_CHECK(stored_payload_crc == payload_crc,
                   "read_event_file: '{}': bad payload CRC at byte offset {} (record {}): stored {:#010x}, computed "
                   "{:#010x}",
                   path, offset, index, stored_payload_crc, payload_crc);

    EventRecord record;
    record.offset = static_cast<int64_t>(offset);
    try {
      decode_event(payload, record);
    } catch (const MalformedEvent& malformed) {
      COLOSSAL_FAIL("read_event_file: '{}': malformed Event at byte offset {} (record {}, payload byte {}): {}", path,
                    offset + kHeaderBytes + malformed.position, index, malformed.position, malformed.what);
    }
    records.push_back(std::move(record));
    offset += kHeaderBytes + length + kFooterBytes;
  }
  return records;
}

}  // namespace colossal::engine
