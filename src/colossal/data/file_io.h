// Reading dataset files for the dataset readers: whole files (gunzipped through zlib when they are
// gzip, whatever their name) and positional reads from files too large to load. Every failure
// throws a colossal::Error naming the file, the offset and what was expected.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace colossal::data {

/// True when the file starts with the gzip magic bytes 1f 8b. Throws if it cannot be opened.
bool is_gzip_file(const std::string& path);

/// The whole file; gzip files are decompressed (corrupt or truncated streams throw, naming how many
/// decompressed bytes were good). `what` describes the file in messages ("CIFAR-10 batch").
std::vector<uint8_t> read_file(const std::string& path, const char* what = "file");

/// A read-only file read at explicit offsets, safe from several threads at once (pread).
class RandomAccessFile {
 public:
  explicit RandomAccessFile(std::string path, const char* what = "file");
  ~RandomAccessFile();
  RandomAccessFile(const RandomAccessFile&) = delete;
  RandomAccessFile& operator=(const RandomAccessFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  /// Reads exactly `count` bytes at `offset`; throws naming the file, the offset and `what` (the
  /// record being read) when the file is shorter or the read fails.
  void read_at(int64_t offset, void* out, int64_t count, const std::string& what) const;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

/// "No such file or directory"-style text for errno values, for messages.
std::string errno_text(int error);

}  // namespace colossal::data
