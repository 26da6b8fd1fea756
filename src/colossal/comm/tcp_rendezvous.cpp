// The TCP rendezvous (comm/tcp_rendezvous.h) on POSIX sockets. Every wait is bounded by the
// deadline; every failure says which rank, which address and what to check.
//
// The wire format is in tcp_rendezvous.h (detail::). Rank 0 reads the hellos of every connection at once,
// answers a rank of another job with a refusal and keeps waiting, and fails (telling the peer why) when
// a rank of its own job disagrees with it.
#include "colossal/comm/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "colossal/comm/launch_env.h"  // the variables' names in messages
#include "colossal/core/error.h"

namespace colossal::comm {

std::chrono::milliseconds default_rendezvous_timeout() {
  const char* text = std::getenv(std::string(env::kRendezvousTimeout).c_str());
  if (text == nullptr || *text == '\0') return std::chrono::seconds(300);
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  // At most 1e9 s (about 32 years): more would overflow the milliseconds and the clock's deadline.
  constexpr double kMaxSeconds = 1e9;
  COLOSSAL_CHECK(end != text && *end == '\0' && std::isfinite(seconds) && seconds > 0 && seconds <= kMaxSeconds,
                 "{}='{}' is not a positive number of seconds (at most {:g})", env::kRendezvousTimeout, text,
                 kMaxSeconds);
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x434c5353;  // "CLSS"
constexpr uint32_t kVersion = 2;         // 2: the hello carries the job
constexpr uint32_t kMaxBlob = detail::kMaxRendezvousBlob;
/// How long rank 0 gives one connection to say hello, so a silent stranger cannot stall it.
constexpr auto kHelloWait = std::chrono::seconds(5);

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

void write_be32(uint32_t value, uint8_t* p) {
  p[0] = static_cast<uint8_t>(value >> 24);
  p[1] = static_cast<uint8_t>(value >> 16);
  p[2] = static_cast<uint8_t>(value >> 8);
  p[3] = static_cast<uint8_t>(value);
}

std::string errno_text(int error) {
  return std::system_category().message(error);
}

std::string seconds_text(std::chrono::milliseconds d) {
  return fmt::format("{:g} s", static_cast<double>(d.count()) / 1000.0);
}

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

int milliseconds_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

enum class Io { ok, eof, timeout, error };

/// Waits for `events` on fd until the deadline; Io::ok when ready.
Io wait_for(int fd, short events, Clock::time_point deadline, int* error) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, milliseconds_left(deadline));
    if (n > 0) return Io::ok;
    if (n == 0) return Io::timeout;
    if (errno != EINTR) {
      *error = errno;
      return Io::error;
    }
  }
}

Io read_exact(int fd, void* buffer, size_t n, Clock::time_point deadline, int* error) {
  auto* p = static_cast<uint8_t*>(buffer);
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
      continue;
    }
    if (got == 0) return Io::eof;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      *error = errno;
      return errno == ECONNRESET ? Io::eof : Io::error;
    }
    if (Io r = wait_for(fd, POLLIN, deadline, error); r != Io::ok) return r;
  }
  return Io::ok;
}

Io write_exact(int fd, const void* buffer, size_t n, Clock::time_point deadline, int* error) {
  const auto* p = static_cast<const uint8_t*>(buffer);
  while (n > 0) {
    const ssize_t sent = ::send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent > 0) {
      p += sent;
      n -= static_cast<size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      *error = errno;
      return (errno == EPIPE || errno == ECONNRESET) ? Io::eof : Io::error;
    }
    if (Io r = wait_for(fd, POLLOUT, deadline, error); r != Io::ok) return r;
  }
  return Io::ok;
}

/// "2, 3" or "2, 3, ..., 17 (40 ranks)".
std::string list_ranks(const std::vector<int>& ranks) {
  constexpr size_t kMaxListed = 16;
  if (ranks.size() <= kMaxListed) return fmt::format("{}", fmt::join(ranks, ", "));
  return fmt::format("{}, ... ({} ranks)", fmt::join(ranks.begin(), ranks.begin() + kMaxListed, ", "), ranks.size());
}

/// Rank 0: listens on the address it was given (o.addr, resolved; the first of its addresses that
/// binds), and nowhere else: a rendezvous told 127.0.0.1 cannot be reached from another host.
Socket listen_on(const RendezvousOptions& o) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(o.port);
  if (const int rc = ::getaddrinfo(o.addr.c_str(), port.c_str(), &hints, &found); rc != 0) {
    COLOSSAL_FAIL("rendezvous: rank 0 cannot resolve its own address '{}' ({}); {} must name rank 0's host", o.addr,
                  ::gai_strerror(rc), env::kMasterAddr);
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(found, ::freeaddrinfo);
  int last_error = 0;
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s.valid()) {
      last_error = errno;
      continue;
    }
    const int one = 1;
    ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    // A deep accept queue: a large job's ranks all connect at once, and a full queue drops their SYNs
    // (each retried only after a second or more).
    if (::bind(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(s.fd(), SOMAXCONN) != 0) {
      last_error = errno;
      continue;
    }
    set_nonblocking(s.fd());
    return s;
  }
  COLOSSAL_FAIL(
      "rendezvous: rank 0 cannot listen on port {} of {} ({}); the port must be free on rank 0's host and {} must "
      "name that host: pick another {} (under torchrun the rendezvous takes {} + 1)",
      o.port, o.addr, errno_text(last_error), env::kMasterAddr, env::kMasterPort, env::kMasterPort);
}

/// Tells a peer rank 0 will not take why (a rejection answer), as far as it listens within a second.
void refuse(int fd, const std::string& reason) {
  const std::vector<uint8_t> answer = detail::encode_refusal(reason);
  int error = 0;
  write_exact(fd, answer.data(), answer.size(), Clock::now() + std::chrono::seconds(1), &error);
}

/// A connection whose hello has not all come yet.
struct PendingPeer {
  Socket socket;
  Clock::time_point deadline;
  std::array<uint8_t, detail::kHelloBytes> bytes{};
  size_t received = 0;
};

/// Connections rank 0 holds waiting for their hellos; more are refused (closed at once) so that a
/// flood of strangers cannot exhaust the descriptors.
constexpr size_t kMaxPendingPeers = 256;

std::vector<uint8_t> serve(const RendezvousOptions& o, const std::vector<uint8_t>& blob, Clock::time_point deadline) {
  COLOSSAL_CHECK(blob.size() <= kMaxBlob, "rendezvous: a blob of {} bytes is over the {} byte limit", blob.size(),
                 kMaxBlob);
  Socket listener = listen_on(o);
  const uint64_t job = detail::job_hash(o.job_id);
  std::vector<Socket> peers(static_cast<size_t>(o.world_size));
  std::vector<bool> arrived(static_cast<size_t>(o.world_size));
  arrived[0] = true;  // rank 0 itself
  int missing_count = o.world_size - 1;
  // Hellos are read from every pending connection at once: a stranger that connects and says nothing
  // (or says it slowly) holds only its own slot, for at most kHelloWait, and never the ranks behind it.
  std::vector<PendingPeer> pending;
  while (missing_count > 0) {
    const auto now = Clock::now();
    std::erase_if(pending, [&](const PendingPeer& p) { return p.deadline <= now; });
    auto wake = deadline;
    std::vector<pollfd> polled{{listener.fd(), POLLIN, 0}};
    for (const PendingPeer& p : pending) {
      polled.push_back({p.socket.fd(), POLLIN, 0});
      wake = std::min(wake, p.deadline);
    }
    if (now >= deadline) {
      std::vector<int> missing;
      for (int r = 1; r < o.world_size; ++r) {
        if (!arrived[static_cast<size_t>(r)]) missing.push_back(r);
      }
      COLOSSAL_FAIL(
          "rendezvous: rank{} {} of {} never connected to rank 0 at {}:{} within {}; check that every rank was "
          "started, that it can reach {}:{} ({}, {}) and agrees on {}; {} sets the wait in seconds",
          missing.size() == 1 ? "" : "s", list_ranks(missing), o.world_size, o.addr, o.port, seconds_text(o.timeout),
          o.addr, o.port, env::kMasterAddr, env::kMasterPort, env::kWorldSize, env::kRendezvousTimeout);
    }
    const int n = ::poll(polled.data(), polled.size(), milliseconds_left(wake));
    if (n < 0) {
      COLOSSAL_CHECK(errno == EINTR, "rendezvous: rank 0 failed waiting for connections on port {}: {}", o.port,
                     errno_text(errno));
      continue;
    }
    // Hellos first (the listener's new connections join `pending` after this pass).
    std::vector<PendingPeer> still_pending;
    for (size_t i = 0; i < pending.size(); ++i) {
      PendingPeer& p = pending[i];
      if (polled[i + 1].revents == 0) {
        still_pending.push_back(std::move(p));
        continue;
      }
      const ssize_t got = ::recv(p.socket.fd(), p.bytes.data() + p.received, p.bytes.size() - p.received, MSG_DONTWAIT);
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        still_pending.push_back(std::move(p));
        continue;
      }
      if (got <= 0) continue;  // hung up or failed before its hello: forget it
      p.received += static_cast<size_t>(got);
      if (p.received < p.bytes.size()) {
        still_pending.push_back(std::move(p));
        continue;
      }
      const std::optional<detail::RendezvousHello> hello = detail::decode_hello(p.bytes);
      if (!hello) continue;  // a stranger on our port (not colossal's magic): ignore it
      if (hello->job != job) {
        // A rank of another job that was given our port: turn it away and keep waiting for ours.
        refuse(p.socket.fd(), fmt::format("rank 0 there serves job '{}'", o.job_id));
        continue;
      }
      try {
        detail::check_hello(*hello, o, arrived);
      } catch (const Error& e) {
        // Our job, but it disagrees with rank 0 (world size, version, rank): the job cannot start. Say so
        // to the peer too, which would otherwise see only a closed connection.
        refuse(p.socket.fd(), e.what());
        throw;
      }
      arrived[static_cast<size_t>(hello->rank)] = true;
      peers[static_cast<size_t>(hello->rank)] = std::move(p.socket);
      missing_count--;
    }
    pending = std::move(still_pending);
    if (polled[0].revents != 0) {
      for (;;) {
        Socket peer(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!peer.valid()) break;                          // none left (EAGAIN), or it went away again (ECONNABORTED)
        if (pending.size() >= kMaxPendingPeers) continue;  // closed at once
        pending.push_back(PendingPeer{std::move(peer), std::min(deadline, Clock::now() + kHelloWait)});
      }
    }
  }
  // Everyone is here: the answer is small, but give slow peers a little time past the deadline.
  const std::vector<uint8_t> header = detail::encode_answer_header(static_cast<uint32_t>(blob.size()));
  const auto send_deadline = std::max(deadline, Clock::now() + std::chrono::seconds(10));
  for (int r = 1; r < o.world_size; ++r) {
    int error = 0;
    const int fd = peers[static_cast<size_t>(r)].fd();
    const bool sent = write_exact(fd, header.data(), header.size(), send_deadline, &error) == Io::ok &&
                      write_exact(fd, blob.data(), blob.size(), send_deadline, &error) == Io::ok;
    COLOSSAL_CHECK(sent, "rendezvous: rank 0 could not send the id to rank {}: {}", r,
                   error ? errno_text(error) : std::string("it hung up"));
  }
  return blob;
}

bool connected_to_itself(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t local_length = sizeof local, peer_length = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) {
    return false;
  }
  return local_length == peer_length && std::memcmp(&local, &peer, local_length) == 0;
}

/// Connects once to any address of host:port, waiting at most until `attempt_deadline`.
Socket try_connect(const RendezvousOptions& o, Clock::time_point attempt_deadline, std::string* last_error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(o.port);
  if (const int rc = ::getaddrinfo(o.addr.c_str(), port.c_str(), &hints, &found); rc != 0) {
    *last_error = fmt::format("cannot resolve host '{}': {}", o.addr, ::gai_strerror(rc));
    return Socket();
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(found, ::freeaddrinfo);
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s.valid()) {
      *last_error = errno_text(errno);
      continue;
    }
    set_nonblocking(s.fd());
    if (::connect(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        *last_error = errno_text(errno);
        continue;
      }
      int error = 0;
      if (wait_for(s.fd(), POLLOUT, attempt_deadline, &error) != Io::ok) {
        *last_error = error ? errno_text(error) : "connection attempt timed out";
        continue;
      }
      socklen_t length = sizeof error;
      ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) {
        *last_error = errno_text(error);
        continue;
      }
    }
    if (connected_to_itself(s.fd())) {
      // Connecting to a free local port in the ephemeral range can pick that same port as the source
      // (TCP simultaneous open): we would talk to ourselves. Treat it as "nobody listens yet".
      *last_error = "connection refused (connected to itself)";
      continue;
    }
    const int one = 1;
    ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return s;
  }
  return Socket();
}

std::vector<uint8_t> join(const RendezvousOptions& o, Clock::time_point deadline) {
  Socket s;
  std::string last_error = "no attempt finished";
  auto backoff = std::chrono::milliseconds(20);
  for (;;) {
    s = try_connect(o, std::min(deadline, Clock::now() + std::chrono::seconds(2)), &last_error);
    if (s.valid()) break;
    COLOSSAL_CHECK(Clock::now() < deadline,
                   "rendezvous: rank {} could not reach rank 0 at {}:{} within {} (last error: {}); check that rank 0 "
                   "was started and that {}/{} name its host and a port this host can reach; {} sets the wait in "
                   "seconds",
                   o.rank, o.addr, o.port, seconds_text(o.timeout), last_error, env::kMasterAddr, env::kMasterPort,
                   env::kRendezvousTimeout);
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
        backoff, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())));
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::seconds(1));
  }

  int error = 0;
  const std::vector<uint8_t> hello = detail::encode_hello(o.rank, o.world_size, o.job_id);
  COLOSSAL_CHECK(write_exact(s.fd(), hello.data(), hello.size(), deadline, &error) == Io::ok,
                 "rendezvous: rank {} reached {}:{} but could not say hello: {}", o.rank, o.addr, o.port,
                 error ? errno_text(error) : std::string("timed out"));

  auto check_read = [&](Io result, std::string_view what) {
    COLOSSAL_CHECK(result != Io::eof,
                   "rendezvous: rank 0 at {}:{} closed the connection before sending {} to rank {}; rank 0's own "
                   "error says why (usually a rank that never arrived)",
                   o.addr, o.port, what, o.rank);
    COLOSSAL_CHECK(result != Io::timeout,
                   "rendezvous: rank {} is connected to rank 0 at {}:{} but {} did not come within {}; rank 0 is "
                   "still waiting for other ranks ({} sets the wait in seconds)",
                   o.rank, o.addr, o.port, what, seconds_text(o.timeout), env::kRendezvousTimeout);
    COLOSSAL_CHECK(result == Io::ok, "rendezvous: rank {} failed reading {} from {}:{}: {}", o.rank, what, o.addr,
                   o.port, errno_text(error));
  };
  // Wait a little past our own deadline: a rank 0 that started with us times out at about the same
  // moment, and its closing the connection tells us more than our timing out would.
  const auto answer_deadline = deadline + std::min<std::chrono::milliseconds>(o.timeout, std::chrono::seconds(5));
  std::array<uint8_t, detail::kAnswerHeaderBytes> header{};
  check_read(read_exact(s.fd(), header.data(), header.size(), answer_deadline, &error), "the id");
  const uint32_t length = detail::decode_answer_header(header, o);
  if (length == detail::kRefusal) {
    // Rank 0 turned us away: its reason, and our job to compare.
    std::array<uint8_t, 4> reason_length{};
    check_read(read_exact(s.fd(), reason_length.data(), reason_length.size(), answer_deadline, &error), "its reason");
    std::string reason(std::min<uint32_t>(read_be32(reason_length.data()), detail::kMaxRefusalBytes), '\0');
    check_read(read_exact(s.fd(), reason.data(), reason.size(), answer_deadline, &error), "its reason");
    COLOSSAL_FAIL(
        "rendezvous: rank 0 at {}:{} refused rank {} of job '{}': {}; when two jobs share a host, give each "
        "its own {}",
        o.addr, o.port, o.rank, o.job_id, reason, env::kMasterPort);
  }
  std::vector<uint8_t> blob(length);
  check_read(read_exact(s.fd(), blob.data(), blob.size(), answer_deadline, &error), "the id");
  return blob;
}

}  // namespace

namespace detail {

uint64_t job_hash(std::string_view job_id) {
  uint64_t hash = 0xcbf29ce484222325;  // FNV-1a, 64 bits
  for (const char c : job_id) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3;
  }
  return hash;
}

std::vector<uint8_t> encode_hello(int rank, int world_size, std::string_view job_id) {
  std::vector<uint8_t> bytes(kHelloBytes);
  const uint64_t job = job_hash(job_id);
  write_be32(kMagic, bytes.data());
  write_be32(kVersion, bytes.data() + 4);
  write_be32(static_cast<uint32_t>(rank), bytes.data() + 8);
  write_be32(static_cast<uint32_t>(world_size), bytes.data() + 12);
  write_be32(static_cast<uint32_t>(job >> 32), bytes.data() + 16);
  write_be32(static_cast<uint32_t>(job), bytes.data() + 20);
  return bytes;
}

std::optional<RendezvousHello> decode_hello(std::span<const uint8_t, kHelloBytes> bytes) {
  if (read_be32(bytes.data()) != kMagic) return std::nullopt;
  return RendezvousHello{read_be32(bytes.data() + 4), static_cast<int>(read_be32(bytes.data() + 8)),
                         static_cast<int>(read_be32(bytes.data() + 12)),
                         (uint64_t{read_be32(bytes.data() + 16)} << 32) | read_be32(bytes.data() + 20)};
}

void check_hello(const RendezvousHello& hello, const RendezvousOptions& o, const std::vector<bool>& arrived) {
  COLOSSAL_CHECK(hello.version == kVersion,
                 "rendezvous: rank {} speaks rendezvous version {}, rank 0 version {}; run the same "
                 "colossal build on every rank",
                 hello.rank, hello.version, kVersion);
  COLOSSAL_CHECK(hello.world_size == o.world_size,
                 "rendezvous: rank {} says the world has {} ranks, rank 0 says {}; every rank needs the same {}",
                 hello.rank, hello.world_size, o.world_size, env::kWorldSize);
  COLOSSAL_CHECK(hello.rank >= 1 && hello.rank < o.world_size,
                 "rendezvous: a peer claims rank {}, outside ranks 1 to {}", hello.rank, o.world_size - 1);
  COLOSSAL_CHECK(static_cast<size_t>(hello.rank) < arrived.size() && !arrived[static_cast<size_t>(hello.rank)],
                 "rendezvous: two processes claim rank {}; every rank needs its own {}", hello.rank, env::kRank);
}

std::vector<uint8_t> encode_answer_header(uint32_t blob_length) {
  std::vector<uint8_t> bytes(kAnswerHeaderBytes);
  write_be32(kMagic, bytes.data());
  write_be32(blob_length, bytes.data() + 4);
  return bytes;
}

std::vector<uint8_t> encode_refusal(std::string_view reason) {
  reason = reason.substr(0, kMaxRefusalBytes);
  std::vector<uint8_t> bytes = encode_answer_header(kRefusal);
  bytes.resize(kAnswerHeaderBytes + 4);
  write_be32(static_cast<uint32_t>(reason.size()), bytes.data() + kAnswerHeaderBytes);
  bytes.insert(bytes.end(), reason.begin(), reason.end());
  return bytes;
}

uint32_t decode_answer_header(std::span<const uint8_t, kAnswerHeaderBytes> bytes, const RendezvousOptions& o) {
  const uint32_t length = read_be32(bytes.data() + 4);
  COLOSSAL_CHECK(read_be32(bytes.data()) == kMagic && (length <= kMaxBlob || length == kRefusal),
                 "rendezvous: {}:{} answered rank {} with something that is not colossal's rendezvous; is another "
                 "service listening on that port (under torchrun its store holds {})?",
                 o.addr, o.port, o.rank, env::kMasterPort);
  return length;
}

}  // namespace detail

std::vector<uint8_t> tcp_rendezvous_broadcast(const RendezvousOptions& options, const std::vector<uint8_t>& blob) {
  COLOSSAL_CHECK(options.world_size >= 1 && options.rank >= 0 && options.rank < options.world_size,
                 "rendezvous: rank {} is outside a world of {} ranks", options.rank, options.world_size);
  COLOSSAL_CHECK(options.port >= 1 && options.port <= 65535, "rendezvous: port {} is not a TCP port (1 to 65535)",
                 options.port);
  COLOSSAL_CHECK(options.timeout.count() > 0, "rendezvous: the timeout must be positive, got {} ms",
                 options.timeout.count());
  if (options.world_size == 1) return blob;
  const auto deadline = Clock::now() + options.timeout;
  return options.rank == 0 ? serve(options, blob, deadline) : join(options, deadline);
}

}  // namespace colossal::comm
