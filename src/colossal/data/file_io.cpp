// Whole-file and positional reads with zlib for gzip files.
#include "colossal/data/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "colossal/core/error.h"

namespace colossal::data {

std::string errno_text(int error) {
  char buffer[256];
  // GNU strerror_r returns the message (possibly not in buffer).
  return std::string(strerror_r(error, buffer, sizeof(buffer)));
}

namespace {

/// Opens for reading and checks it is a regular file, with messages that say what to fix.
int open_regular_file(const std::string& path, const char* what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    COLOSSAL_FAIL("cannot open {} {}: {}", what, path, errno_text(error));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    COLOSSAL_FAIL("{} {} is not a regular file", what, path);
  }
  return fd;
}

std::vector<uint8_t> read_plain(const std::string& path, const char* what) {
  RandomAccessFile file(path, what);
  std::vector<uint8_t> bytes(static_cast<size_t>(file.size()));
  if (!bytes.empty()) file.read_at(0, bytes.data(), file.size(), "the whole file");
  return bytes;
}

std::vector<uint8_t> read_gzip(const std::string& path, const char* what) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int error = errno;
    COLOSSAL_FAIL("cannot open {} {} for gzip decompression: {}", what, path, errno_text(error));
  }
  std::vector<uint8_t> bytes;
  constexpr size_t kChunk = size_t{1} << 20;
  while (true) {
    const size_t old_size = bytes.size();
    bytes.resize(old_size + kChunk);
    const int n = gzread(file, bytes.data() + old_size, static_cast<unsigned>(kChunk));
    if (n < 0) {
      int code = 0;
      const std::string message = gzerror(file, &code);
      gzclose(file);
      COLOSSAL_FAIL("{} {} is corrupt: zlib failed after {} good decompressed bytes: {} (re-download or re-extract it)",
                    what, path, old_size, message);
    }
    bytes.resize(old_size + static_cast<size_t>(n));
    if (n == 0) break;
  }
  int code = Z_OK;
  const std::string message = gzerror(file, &code);
  gzclose(file);
  // zlib reports a stream that ends before its trailer as Z_BUF_ERROR after returning what it had.
  COLOSSAL_CHECK(
      code == Z_OK || code == Z_STREAM_END,
      "{} {} is truncated or corrupt: the gzip stream stops after {} decompressed bytes ({}); re-download it", what,
      path, bytes.size(), message);
  return bytes;
}

}  // namespace

bool is_gzip_file(const std::string& path) {
  const int fd = open_regular_file(path, "file");
  unsigned char magic[2] = {0, 0};
  const ssize_t n = ::pread(fd, magic, 2, 0);
  ::close(fd);
  return n == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

std::vector<uint8_t> read_file(const std::string& path, const char* what) {
  const int fd = open_regular_file(path, what);
  unsigned char magic[2] = {0, 0};
  const ssize_t n = ::pread(fd, magic, 2, 0);
  ::close(fd);
  const bool gzip = n == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  return gzip ? read_gzip(path, what) : read_plain(path, what);
}

RandomAccessFile::RandomAccessFile(std::string path, const char* what) : path_(std::move(path)) {
  fd_ = open_regular_file(path_, what);
  struct stat st {};
  ::fstat(fd_, &st);
  size_ = static_cast<int64_t>(st.st_size);
}

RandomAccessFile::~RandomAccessFile() {
  if (fd_ >= 0) ::close(fd_);
}

void RandomAccessFile::read_at(int64_t offset, void* out, int64_t count, const std::string& what) const {
  COLOSSAL_CHECK(offset >= 0 && count >= 0 && offset + count <= size_,
                 "{}: reading {} needs bytes {} to {}, but the file is {} bytes long (truncated?)", path_, what, offset,
                 offset + count, size_);
  auto* dst = static_cast<char*>(out);
  int64_t done = 0;
  while (done < count) {
    const ssize_t n = ::pread(fd_, dst + done, static_cast<size_t>(count - done), static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      COLOSSAL_FAIL("{}: reading {} at offset {} failed after {} of {} bytes: {}", path_, what, offset + done, done,
                    count,
                    n == 0 ? std::string("unexpected end of file (was it truncated while open?)") : errno_text(error));
    }
    done += n;
  }
}

}  // namespace colossal::data
