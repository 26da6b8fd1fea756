// TensorBoard event files: CRC-32C against published vectors, the masked CRC, a scalar record
// byte for byte against a hand encoding, write-then-read round trips, and read_event_file's
// errors on truncated and corrupted files (every cut and every flipped byte: an Error, never a crash).
#include "colossal/engine/tensorboard.h"

#include <gtest/gtest.h>
#include <unistd.h>  // getpid

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "colossal/core/error.h"
#include "engine_test_util.h"  // FileSizeLimit

namespace colossal::engine {
namespace {

namespace fs = std::filesystem;

/// A fresh directory for one test, removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("colossal_tensorboard_test_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_bytes(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << bytes;
}

uint32_t crc_of(const std::string& bytes) {
  return crc32c(bytes.data(), bytes.size());
}

std::string little_endian(uint64_t value, int num_bytes) {
  std::string bytes;
  for (int i = 0; i < num_bytes; ++i) bytes.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  return bytes;
}

/// A TFRecord frame around `payload`, CRCs computed with the functions under test (checked
/// against published vectors in Crc32c.*).
std::string frame(const std::string& payload) {
  const std::string length = little_endian(payload.size(), 8);
  return length + little_endian(mask_crc32c(crc_of(length)), 4) + payload +
         little_endian(mask_crc32c(crc_of(payload)), 4);
}

/// Writes a file of a version record and three scalars (tags "a", "b", "a") and returns its path.
fs::path write_small_file(const fs::path& dir) {
  EventFileWriter writer(dir.string());
  writer.add_scalar("a", 1.0, 0, 100.0);
  writer.add_scalar("b", -2.5, 1, 101.0);
  writer.add_scalar("a", 3.0, 2, 102.0);
  writer.close();
  return writer.path();
}

// Expects read_event_file(path) to throw a colossal::Error whose message holds every one of `parts`.
void expect_read_error(const fs::path& path, const std::vector<std::string>& parts) {
  try {
    read_event_file(path.string());
    ADD_FAILURE() << "read_event_file accepted " << path;
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

// ---- CRC-32C

TEST(Crc32c, MatchesPublishedVectors) {
  // The CRC catalogue's check value, and RFC 3720 (iSCSI) appendix B.4.
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(check.data(), check.size()), 0xE3069283u);
  const std::vector<uint8_t> zeros(32, 0x00), ones(32, 0xff);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  std::vector<uint8_t> ascending(32);
  for (size_t i = 0; i < ascending.size(); ++i) ascending[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, MaskRotatesAndAddsTfRecordDelta) {
  // Hand-derived: ((crc >> 15) | (crc << 17)) + 0xa282ead8 mod 2^32.
  EXPECT_EQ(mask_crc32c(0), 0xa282ead8u);
  EXPECT_EQ(mask_crc32c(0xE3069283u), 0xc78ab0e5u);
  // The rotation carries bit 0 to bit 17 and the addition wraps.
  EXPECT_EQ(mask_crc32c(1), 0xa282ead8u + (1u << 17));
  EXPECT_EQ(mask_crc32c(0xffffffffu), 0xa282ead7u);
}

// ---- EventFileWriter

TEST(EventFileWriter, CreatesDirectoryAndNamesFileByTimeAndHost) {
  TempDir dir;
  const fs::path log_dir = dir.path() / "nested" / "run1";
  const auto before = static_cast<int64_t>(std::time(nullptr));
  EventFileWriter writer(log_dir.string());
  const auto after = static_cast<int64_t>(std::time(nullptr));
  const fs::path path(writer.path());
  EXPECT_EQ(path.parent_path(), log_dir);
  std::smatch match;
  const std::string file_name = path.filename().string();
  ASSERT_TRUE(std::regex_match(file_name, match, std::regex(R"(events\.out\.tfevents\.(\d+)\.(.+))"))) << file_name;
  const int64_t seconds = std::stoll(match[1].str());
  EXPECT_GE(seconds, before);
  EXPECT_LE(seconds, after);
  EXPECT_FALSE(match[2].str().empty());
  EXPECT_TRUE(fs::exists(path));
}

TEST(EventFileWriter, TwoWritersInOneDirectoryGetTwoFiles) {
  TempDir dir;
  EventFileWriter first(dir.path().string());
  EventFileWriter second(dir.path().string());
  EXPECT_NE(first.path(), second.path());
}

TEST(EventFileWriter, VersionRecordFirstThenScalarsInOrder) {
  TempDir dir;
  const fs::path path = write_small_file(dir.path());
  const std::vector<EventRecord> records = read_event_file(path.string());
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[0].offset, 0);
  ASSERT_TRUE(records[0].file_version.has_value());
  EXPECT_EQ(*records[0].file_version, "brain.Event:2");
  EXPECT_TRUE(records[0].scalars.empty());
  EXPECT_GT(records[0].wall_time, 1.5e9);  // written "now": after 2017

  const std::vector<std::string> tags{"a", "b", "a"};
  const std::vector<float> values{1.0f, -2.5f, 3.0f};
  for (size_t i = 1; i < records.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_FALSE(records[i].file_version.has_value());
    EXPECT_EQ(records[i].step, static_cast<int64_t>(i - 1));
    EXPECT_EQ(records[i].wall_time, 99.0 + static_cast<double>(i));
    ASSERT_EQ(records[i].scalars.size(), 1u);
    EXPECT_EQ(records[i].scalars[0].tag, tags[i - 1]);
    EXPECT_EQ(records[i].scalars[0].value, values[i - 1]);
    EXPECT_GT(records[i].offset, records[i - 1].offset);
  }
}

TEST(EventFileWriter, ScalarRecordMatchesHandEncodedBytes) {
  TempDir dir;
  EventFileWriter writer(dir.path().string());
  writer.add_scalar("loss", 0.5, 3, 1.5);
  writer.close();
  const std::vector<EventRecord> records = read_event_file(writer.path());
  ASSERT_EQ(records.size(), 2u);
  const std::string bytes = read_bytes(writer.path());
  const std::string record = bytes.substr(static_cast<size_t>(records[1].offset));

  // Event{wall_time(1, fixed64)=1.5, step(2, varint)=3, summary(5)={value(1)={tag(1)="loss",
  // simple_value(2, fixed32)=0.5f}}}, encoded by hand from the protobuf wire format.
  const std::string payload(
      "\x09\x00\x00\x00\x00\x00\x00\xf8\x3f"
      "\x10\x03"
      "\x2a\x0d"
      "\x0a\x0b"
      "\x0a\x04loss"
      "\x15\x00\x00\x00\x3f",
      26);
  // The frame's CRCs, computed for these bytes by an independent bitwise CRC-32C (Python).
  const std::string expected =
      little_endian(26, 8) + little_endian(0x2dd89b12, 4) + payload + little_endian(0xe35e6580, 4);
  EXPECT_EQ(record, expected);
}

TEST(EventFileWriter, NegativeStepAndLongTagRoundTrip) {
  TempDir dir;
  EventFileWriter writer(dir.path().string());
  // A 200-byte tag needs a two-byte length varint; a negative step a ten-byte one.
  const std::string tag = "train/" + std::string(194, 'x');
  writer.add_scalar(tag, 0.25, -7, 5.0);
  writer.add_scalar("big", 1e30, int64_t{1} << 40, 6.0);
  writer.close();
  const std::vector<EventRecord> records = read_event_file(writer.path());
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[1].step, -7);
  ASSERT_EQ(records[1].scalars.size(), 1u);
  EXPECT_EQ(records[1].scalars[0].tag, tag);
  EXPECT_EQ(records[1].scalars[0].value, 0.25f);
  EXPECT_EQ(records[2].step, int64_t{1} << 40);
  EXPECT_EQ(records[2].scalars[0].value, static_cast<float>(1e30));
}

TEST(EventFileWriter, FlushMakesRecordsReadableWhileOpen) {
  TempDir dir;
  EventFileWriter writer(dir.path().string());
  writer.add_scalar("a", 1.0, 0);
  writer.flush();
  EXPECT_EQ(read_event_file(writer.path()).size(), 2u);
  writer.add_scalar("a", 2.0, 1);
  writer.flush();
  EXPECT_EQ(read_event_file(writer.path()).size(), 3u);
}

TEST(EventFileWriter, DestructorFlushes) {
  TempDir dir;
  std::string path;
  {
    EventFileWriter writer(dir.path().string());
    writer.add_scalar("a", 1.0, 0);
    path = writer.path();
  }
  EXPECT_EQ(read_event_file(path).size(), 2u);
}

TEST(EventFileWriter, AddAfterCloseThrows) {
  TempDir dir;
  EventFileWriter writer(dir.path().string());
  writer.close();
  writer.close();  // a no-op
  EXPECT_FALSE(writer.is_open());
  EXPECT_THROW(writer.add_scalar("a", 1.0, 0), Error);
}

TEST(EventFileWriter, UnwritableLogDirThrows) {
  TempDir dir;
  fs::create_directories(dir.path());
  const fs::path blocker = dir.path() / "file";
  write_bytes(blocker, "not a directory");
  EXPECT_THROW(EventFileWriter((blocker / "logs").string()), Error);
}

// A disk that fills while training: the flush that cannot write names the file and the system's
// reason (here EFBIG from a file-size limit, the same failed write() a full disk gives as ENOSPC).
TEST(EventFileWriter, FailedWriteNamesTheFileAndTheReason) {
  TempDir dir;
  EventFileWriter writer(dir.path().string());
  writer.flush();  // the version record is on the disk
  std::string message;
  {
    const testing::FileSizeLimit limit(fs::file_size(writer.path()) + 64);
    try {
      for (int step = 0; step < 64; ++step) writer.add_scalar("train/loss", 1.0, step);
      writer.flush();
    } catch (const Error& e) {
      message = e.what();
    }
  }
  EXPECT_NE(message.find(writer.path()), std::string::npos) << message;
  EXPECT_NE(message.find("File too large"), std::string::npos) << message;
}

// ---- read_event_file

TEST(ReadEventFile, MissingFileThrows) {
  TempDir dir;
  expect_read_error(dir.path() / "absent", {"cannot open", "absent"});
}

TEST(ReadEventFile, EmptyFileHasNoRecords) {
  TempDir dir;
  fs::create_directories(dir.path());
  write_bytes(dir.path() / "empty", "");
  EXPECT_TRUE(read_event_file((dir.path() / "empty").string()).empty());
}

TEST(ReadEventFile, TruncatedHeaderAndPayloadNameOffset) {
  TempDir dir;
  const fs::path path = write_small_file(dir.path());
  const std::string bytes = read_bytes(path);
  const std::vector<EventRecord> records = read_event_file(path.string());
  const auto last = static_cast<size_t>(records.back().offset);

  write_bytes(path, bytes.substr(0, last + 5));
  expect_read_error(path, {path.string(), "truncated length", "byte offset " + std::to_string(last), "record 3"});

  write_bytes(path, bytes.substr(0, last + 12 + 3));
  expect_read_error(path, {path.string(), "truncated payload", "byte offset " + std::to_string(last), "record 3"});

  // Only the payload CRC missing is a truncated payload too.
  write_bytes(path, bytes.substr(0, bytes.size() - 1));
  expect_read_error(path, {"truncated payload", "byte offset " + std::to_string(last)});
}

TEST(ReadEventFile, FlippedBytesNameTheBrokenCrc) {
  TempDir dir;
  const fs::path path = write_small_file(dir.path());
  const std::string bytes = read_bytes(path);
  const auto second = static_cast<size_t>(read_event_file(path.string())[1].offset);

  std::string corrupt = bytes;
  corrupt[second + 2] = static_cast<char>(corrupt[second + 2] ^ 0x01);  // inside the length
  write_bytes(path, corrupt);
  expect_read_error(path, {path.string(), "bad length CRC", "byte offset " + std::to_string(second), "record 1"});

  corrupt = bytes;
  corrupt[second + 12 + 4] = static_cast<char>(corrupt[second + 12 + 4] ^ 0x40);  // inside the payload
  write_bytes(path, corrupt);
  expect_read_error(path, {path.string(), "bad payload CRC", "byte offset " + std::to_string(second), "record 1"});

  corrupt = bytes;
  corrupt[second + 9] = static_cast<char>(corrupt[second + 9] ^ 0x80);  // inside the length's CRC
  write_bytes(path, corrupt);
  expect_read_error(path, {"bad length CRC", "byte offset " + std::to_string(second)});
}

TEST(ReadEventFile, EveryCutAndEveryFlipIsAnErrorNotACrash) {
  TempDir dir;
  const fs::path path = write_small_file(dir.path());
  const std::string bytes = read_bytes(path);
  std::vector<size_t> boundaries;
  for (const EventRecord& record : read_event_file(path.string())) boundaries.push_back(record.offset);

  // Every byte lies under a CRC, so every single-bit flip is caught (CRC-32C finds all of them).
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string corrupt = bytes;
    corrupt[i] = static_cast<char>(corrupt[i] ^ (1 << (i % 8)));
    write_bytes(path, corrupt);
    EXPECT_THROW(read_event_file(path.string()), Error) << "flipped byte " << i;
  }
  // A cut at a record boundary is a shorter valid file; anywhere else an error.
  for (size_t size = 0; size < bytes.size(); ++size) {
    write_bytes(path, bytes.substr(0, size));
    const auto boundary = std::find(boundaries.begin(), boundaries.end(), size);
    if (boundary != boundaries.end()) {
      EXPECT_EQ(read_event_file(path.string()).size(), static_cast<size_t>(boundary - boundaries.begin()));
    } else {
      EXPECT_THROW(read_event_file(path.string()), Error) << "cut at " << size;
    }
  }
}

TEST(ReadEventFile, SkipsFieldsItDoesNotKnow) {
  TempDir dir;
  fs::create_directories(dir.path());
  // Event{step=9, graph_def(4)="xyz", summary={value={tag="t", node_name(7)="n", simple_value=2.0f},
  // value={tag="hist", histo(5)={}}}, unknown fixed32 field 15, unknown varint field 16}.
  const std::string value_with_extra("\x0a\x01t\x3a\x01n\x15\x00\x00\x00\x40", 11);
  const std::string value_without_scalar("\x0a\x04hist\x2a\x00", 8);
  const std::string summary = std::string("\x0a") + static_cast<char>(value_with_extra.size()) + value_with_extra +
                              std::string("\x0a") + static_cast<char>(value_without_scalar.size()) +
                              value_without_scalar;
  const std::string payload = std::string("\x10\x09\x22\x03xyz", 7) + "\x2a" + static_cast<char>(summary.size()) +
                              summary + std::string("\x7d\x01\x02\x03\x04\x80\x01\x05", 8);
  write_bytes(dir.path() / "events", frame(payload));
  const std::vector<EventRecord> records = read_event_file((dir.path() / "events").string());
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].step, 9);
  ASSERT_EQ(records[0].scalars.size(), 1u);
  EXPECT_EQ(records[0].scalars[0].tag, "t");
  EXPECT_EQ(records[0].scalars[0].value, 2.0f);
}

TEST(ReadEventFile, MalformedEventInsideAGoodFrameNamesTheProblem) {
  TempDir dir;
  fs::create_directories(dir.path());
  const fs::path path = dir.path() / "events";
  // step given as fixed64 (wire type 1) instead of a varint.
  write_bytes(path, frame(std::string("\x11\x01\x00\x00\x00\x00\x00\x00\x00", 9)));
  expect_read_error(path, {"malformed Event", "byte offset 12", "Event.step", "wire type 1"});
  // A summary whose declared length runs past the payload.
  write_bytes(path, frame(std::string("\x2a\x05\x0a", 3)));
  expect_read_error(path, {"malformed Event", "runs past the end"});
  // A group (wire type 3) is no Event field.
  write_bytes(path, frame(std::string("\x1b", 1)));
  expect_read_error(path, {"malformed Event", "wire type 3"});
  // An unterminated varint.
  write_bytes(path, frame(std::string("\x10\xff\xff", 3)));
  expect_read_error(path, {"malformed Event", "varint"});
}

}  // namespace
}  // namespace colossal::engine
