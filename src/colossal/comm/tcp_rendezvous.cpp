// The TCP rendezvous (comm/tcp_rendezvous.h) on POSIX sockets. Every wait is bounded by the
// deadline; every failure says which rank, which address and what to check.
//
// Wire format, integers big-endian: a rank sends its hello {magic, version, rank, world_size} (4 x u32);
// rank 0 answers, once all ranks are in, {magic, blob length} (2 x u32) and the blob.
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
  COLOSSAL_CHECK(end != text && *end == '\0' && std::isfinite(seconds) && seconds > 0,
                 "{}='{}' is not a positive number of seconds", env::kRendezvousTimeout, text);
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x434c5353;  // "CLSS"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxBlob = 1u << 20;
/// How long rank 0 gives one connection to say hello, so a silent stranger cannot stall it.
constexpr auto kHelloWait = std::chrono::seconds(5);

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

std::array<uint8_t, 16> encode_hello(int rank, int world_size) {
  const std::array<uint32_t, 4> words{htonl(kMagic), htonl(kVersion), htonl(static_cast<uint32_t>(rank)),
                                      htonl(static_cast<uint32_t>(world_size))};
  std::array<uint8_t, 16> bytes;
  std::memcpy(bytes.data(), words.data(), bytes.size());
  return bytes;
}

/// "2, 3" or "2, 3, ..., 17 (40 ranks)".
std::string list_ranks(const std::vector<int>& ranks) {
  constexpr size_t kMaxListed = 16;
  if (ranks.size() <= kMaxListed) return fmt::format("{}", fmt::join(ranks, ", "));
  return fmt::format("{}, ... ({} ranks)", fmt::join(ranks.begin(), ranks.begin() + kMaxListed, ", "), ranks.size());
}

/// Rank 0: listens on every interface (IPv6 with IPv4 mapped where the host has IPv6, else IPv4).
Socket listen_on(const RendezvousOptions& o) {
  int last_error = 0;
  for (int family : {AF_INET6, AF_INET}) {
    Socket s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) {
      last_error = errno;
      continue;
    }
    const int one = 1, zero = 0;
    ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int bound = -1;
    if (family == AF_INET6) {
      ::setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      sockaddr_in6 address{};
      address.sin6_family = AF_INET6;
      address.sin6_addr = in6addr_any;
      address.sin6_port = htons(static_cast<uint16_t>(o.port));
      bound = ::bind(s.fd(), reinterpret_cast<sockaddr*>(&address), sizeof address);
    } else {
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_addr.s_addr = htonl(INADDR_ANY);
      address.sin_port = htons(static_cast<uint16_t>(o.port));
      bound = ::bind(s.fd(), reinterpret_cast<sockaddr*>(&address), sizeof address);
    }
    if (bound != 0) {
      last_error = errno;
      if (last_error == EADDRINUSE) break;  // IPv4 would collide on the same port too
      continue;
    }
    // A deep accept queue: a large job's ranks all connect at once, and a full queue drops their SYNs
    // (each retried only after a second or more).
    if (::listen(s.fd(), SOMAXCONN) != 0) {
      last_error = errno;
      continue;
    }
    set_nonblocking(s.fd());
    return s;
  }
  COLOSSAL_FAIL(
      "rendezvous: rank 0 cannot listen on port {} ({}); the port must be free on rank 0's host: pick another "
      "{} (under torchrun the rendezvous takes {} + 1)",
      o.port, errno_text(last_error), env::kMasterPort, env::kMasterPort);
}

std::vector<uint8_t> serve(const RendezvousOptions& o, const std::vector<uint8_t>& blob, Clock::time_point deadline) {
  COLOSSAL_CHECK(blob.size() <= kMaxBlob, "rendezvous: a blob of {} bytes is over the {} byte limit", blob.size(),
                 kMaxBlob);
  Socket listener = listen_on(o);
  std::vector<Socket> peers(static_cast<size_t>(o.world_size));
  int arrived = 1;  // rank 0 itself
  while (arrived < o.world_size) {
    int error = 0;
    const Io ready = wait_for(listener.fd(), POLLIN, deadline, &error);
    if (ready == Io::timeout) {
      std::vector<int> missing;
      for (int r = 1; r < o.world_size; ++r) {
        if (!peers[static_cast<size_t>(r)].valid()) missing.push_back(r);
      }
      COLOSSAL_FAIL(
          "rendezvous: rank{} {} of {} never connected to rank 0 at {}:{} within {}; check that every rank was "
          "started, that it can reach {}:{} ({}, {}) and agrees on {}; {} sets the wait in seconds",
          missing.size() == 1 ? "" : "s", list_ranks(missing), o.world_size, o.addr, o.port, seconds_text(o.timeout),
          o.addr, o.port, env::kMasterAddr, env::kMasterPort, env::kWorldSize, env::kRendezvousTimeout);
    }
    COLOSSAL_CHECK(ready == Io::ok, "rendezvous: rank 0 failed waiting for connections on port {}: {}", o.port,
                   errno_text(error));
    Socket peer(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!peer.valid()) continue;  // the connection went away again (ECONNABORTED, EAGAIN)
    std::array<uint32_t, 4> hello{};
    const auto hello_deadline = std::min(deadline, Clock::now() + kHelloWait);
    if (read_exact(peer.fd(), hello.data(), sizeof hello, hello_deadline, &error) != Io::ok) continue;
    if (ntohl(hello[0]) != kMagic) continue;  // a stranger on our port: ignore it
    const auto version = ntohl(hello[1]);
    const int rank = static_cast<int>(ntohl(hello[2]));
    const int world_size = static_cast<int>(ntohl(hello[3]));
    COLOSSAL_CHECK(version == kVersion,
                   "rendezvous: rank {} speaks rendezvous version {}, rank 0 version {}; run the same "
                   "colossal build on every rank",
                   rank, version, kVersion);
    COLOSSAL_CHECK(world_size == o.world_size,
                   "rendezvous: rank {} says the world has {} ranks, rank 0 says {}; every rank needs the same {}",
                   rank, world_size, o.world_size, env::kWorldSize);
    COLOSSAL_CHECK(rank >= 1 && rank < o.world_size, "rendezvous: a peer claims rank {}, outside ranks 1 to {}", rank,
                   o.world_size - 1);
    COLOSSAL_CHECK(!peers[static_cast<size_t>(rank)].valid(),
                   "rendezvous: two processes claim rank {}; every rank needs its own {}", rank, env::kRank);
    peers[static_cast<size_t>(rank)] = std::move(peer);
    arrived++;
  }
  // Everyone is here: the answer is small, but give slow peers a little time past the deadline.
  const std::array<uint32_t, 2> header{htonl(kMagic), htonl(static_cast<uint32_t>(blob.size()))};
  const auto send_deadline = std::max(deadline, Clock::now() + std::chrono::seconds(10));
  for (int r = 1; r < o.world_size; ++r) {
    int error = 0;
    const int fd = peers[static_cast<size_t>(r)].fd();
    const bool sent = write_exact(fd, header.data(), sizeof header, send_deadline, &error) == Io::ok &&
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
  const auto hello = encode_hello(o.rank, o.world_size);
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
  std::array<uint32_t, 2> header{};
  check_read(read_exact(s.fd(), header.data(), sizeof header, answer_deadline, &error), "the id");
  const uint32_t length = ntohl(header[1]);
  COLOSSAL_CHECK(ntohl(header[0]) == kMagic && length <= kMaxBlob,
                 "rendezvous: {}:{} answered rank {} with something that is not colossal's rendezvous; is another "
                 "service listening on that port (under torchrun its store holds {})?",
                 o.addr, o.port, o.rank, env::kMasterPort);
  std::vector<uint8_t> blob(length);
  check_read(read_exact(s.fd(), blob.data(), blob.size(), answer_deadline, &error), "the id");
  return blob;
}

}  // namespace

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
