// TensorBoard event files without TensorFlow or protobuf: EventFileWriter appends scalar summaries
// as TFRecord-framed `Event` messages encoded by hand, and read_event_file checks and decodes such
// a file (for tests, and for users who want their curves back without Python).
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace colossal::engine {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `size` bytes, as TFRecord uses.
uint32_t crc32c(const void* data, size_t size);
/// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8, so that a CRC stored inside
/// CRC-protected data does not checksum to a fixed value.
uint32_t mask_crc32c(uint32_t crc);

/// The version string of the first record of every event file TensorBoard reads.
inline constexpr const char* kEventFileVersion = "brain.Event:2";

/// Writes `<log_dir>/events.out.tfevents.<unix seconds>.<hostname>` (log_dir created if missing;
/// when that name is taken, ".1", ".2", ... is appended so that two writers never share a file).
/// The first record carries file_version; each add_scalar appends one Event with one summary value.
/// Records are buffered: flush() makes them visible to TensorBoard, and close() / the destructor
/// flush too. A failed open, write, flush or close (a full disk) throws colossal::Error naming the
/// file and the system's reason (the destructor, which must not throw, swallows it).
class EventFileWriter {
 public:
  explicit EventFileWriter(const std::string& log_dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  /// Appends `tag` = value (stored as float, TensorBoard's simple_value) at `step`; wall_time is
  /// seconds since the Unix epoch, now when not given. Throws once the writer is closed.
  void add_scalar(const std::string& tag, double value, int64_t step, std::optional<double> wall_time = {});
  void flush();
  /// Flushes and closes the file; later add_scalar calls throw. Closing twice is a no-op.
  void close();
  bool is_open() const { return file_.is_open(); }
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);

  std::string path_;
  std::ofstream file_;
};

/// One summary value with a simple_value (TensorBoard's scalar).
struct EventScalar {
  std::string tag;
  float value = 0.0f;
};

/// One decoded record of an event file. Fields the reader does not know (graphs, histograms,
/// tensor summaries) are skipped, so files written by TensorFlow read too.
struct EventRecord {
  /// Byte offset of the record's frame in the file.
  int64_t offset = 0;
  double wall_time = 0.0;
  int64_t step = 0;
  /// Set on the file's version record ("brain.Event:2").
  std::optional<std::string> file_version;
  std::vector<EventScalar> scalars;
};

/// Every record of the event file at `path`, in order. Checks each frame (length, length CRC,
/// payload, payload CRC) and decodes its Event; throws colossal::Error naming the file, the byte
/// offset and what is wrong (truncated length, bad length CRC, truncated payload, bad payload
/// CRC, malformed Event).
std::vector<EventRecord> read_event_file(const std::string& path);

}  // namespace colossal::engine
