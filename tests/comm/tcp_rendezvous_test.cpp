// The TCP rendezvous against peers that are not what rank 0 expects (issue 22): it listens only on the
// address it is given; a rank of another job is turned away with a message naming both jobs while
// rank 0 keeps waiting for its own; a rank with another world size fails on both sides with a clear
// error; garbage bytes and bare connections are dropped without holding up the real ranks. Ranks are
// threads; the ordinary cases are in bootstrap_test.cpp.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "colossal/comm/bootstrap.h"  // parse_dist_env: DistEnv::job_id
#include "colossal/comm/tcp_rendezvous.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::comm {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// A port nothing listens on right now (the kernel's pick for an ephemeral bind).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

/// A raw client connection; closed on destruction.
class RawConnection {
 public:
  /// Connects once; valid() tells whether it succeeded, error() why not.
  RawConnection(const char* ip, int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    ::inet_pton(AF_INET, ip, &address.sin_addr);
    address.sin_port = htons(static_cast<uint16_t>(port));
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      error_ = errno;
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawConnection() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConnection(RawConnection&& other) noexcept : fd_(std::exchange(other.fd_, -1)), error_(other.error_) {}
  bool valid() const { return fd_ >= 0; }
  int error() const { return error_; }
  bool send(const std::vector<uint8_t>& bytes) const {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
  }

 private:
  int fd_ = -1;
  int error_ = 0;
};

/// Connects to ip:port, retrying until rank 0 listens (at most 10 s).
RawConnection connect_when_listening(const char* ip, int port) {
  const auto give_up = Clock::now() + 10s;
  for (;;) {
    RawConnection connection(ip, port);
    if (connection.valid() || Clock::now() > give_up) return connection;
    std::this_thread::sleep_for(10ms);
  }
}

struct Outcome {
  std::vector<uint8_t> blob;
  std::string error;
};

RendezvousOptions options_for(const std::string& addr, int port, int rank, int world_size, const std::string& job,
                              std::chrono::milliseconds timeout = 20s) {
  RendezvousOptions options;
  options.addr = addr;
  options.port = port;
  options.rank = rank;
  options.world_size = world_size;
  options.job_id = job;
  options.timeout = timeout;
  return options;
}

/// Runs one rank on a thread of its own, its outcome written where given.
std::thread run_rank(const RendezvousOptions& options, const std::vector<uint8_t>& blob, Outcome& outcome) {
  return std::thread([options, blob, &outcome] {
    try {
      outcome.blob = tcp_rendezvous_broadcast(options, blob);
    } catch (const Error& error) {
      outcome.error = error.what();
    }
  });
}

const std::vector<uint8_t> kBlob = {1, 2, 3, 4, 5, 6, 7, 8};

TEST(RendezvousPeers, ListensOnlyOnTheAddressItIsGiven) {
  // The whole of 127.0.0.0/8 is this host: rank 0 told 127.0.0.2 must not answer on 127.0.0.1.
  const int port = free_port();
  Outcome rank0, rank1;
  std::thread server = run_rank(options_for("127.0.0.2", port, 0, 2, "job"), kBlob, rank0);
  const RawConnection probe = connect_when_listening("127.0.0.2", port);
  ASSERT_TRUE(probe.valid()) << "rank 0 never listened on 127.0.0.2:" << port << ": " << rank0.error;
  const RawConnection elsewhere("127.0.0.1", port);
  EXPECT_FALSE(elsewhere.valid());
  EXPECT_EQ(elsewhere.error(), ECONNREFUSED);
  std::thread client = run_rank(options_for("127.0.0.2", port, 1, 2, "job"), {}, rank1);
  client.join();
  server.join();
  EXPECT_EQ(rank0.error, "");
  EXPECT_EQ(rank1.error, "");
  EXPECT_EQ(rank1.blob, kBlob);
}

TEST(RendezvousPeers, AnAddressOfAnotherHostIsAClearError) {
  // 192.0.2.1 is TEST-NET-1 (RFC 5737): never an address of this host.
  const int port = free_port();
  EXPECT_ERROR_CONTAINS(tcp_rendezvous_broadcast(options_for("192.0.2.1", port, 0, 2, "job", 2s), kBlob),
                        fmt::format("rank 0 cannot listen on port {} of 192.0.2.1", port));
}

TEST(RendezvousPeers, ARankOfAnotherJobIsTurnedAwayAndTheJobGoesOn) {
  const int port = free_port();
  Outcome rank0, stranger, rank1;
  std::thread server = run_rank(options_for("127.0.0.1", port, 0, 2, "job-a"), kBlob, rank0);
  std::thread other = run_rank(options_for("127.0.0.1", port, 1, 2, "job-b"), {}, stranger);
  other.join();
  EXPECT_NE(stranger.error.find(fmt::format("rank 0 at 127.0.0.1:{} refused rank 1 of job 'job-b'", port)),
            std::string::npos)
      << stranger.error;
  EXPECT_NE(stranger.error.find("rank 0 there serves job 'job-a'"), std::string::npos) << stranger.error;
  EXPECT_NE(stranger.error.find("MASTER_PORT"), std::string::npos) << stranger.error;
  std::thread client = run_rank(options_for("127.0.0.1", port, 1, 2, "job-a"), {}, rank1);
  client.join();
  server.join();
  EXPECT_EQ(rank0.error, "");
  EXPECT_EQ(rank1.error, "");
  EXPECT_EQ(rank1.blob, kBlob);
}

TEST(RendezvousPeers, ARankWithAnotherWorldSizeFailsOnBothSides) {
  const int port = free_port();
  Outcome rank0, rank1;
  std::thread server = run_rank(options_for("127.0.0.1", port, 0, 2, "job"), kBlob, rank0);
  std::thread client = run_rank(options_for("127.0.0.1", port, 1, 3, "job"), {}, rank1);
  client.join();
  server.join();
  EXPECT_NE(rank0.error.find("rank 1 says the world has 3 ranks, rank 0 says 2; every rank needs the same WORLD_SIZE"),
            std::string::npos)
      << rank0.error;
  EXPECT_NE(rank1.error.find(fmt::format("rank 0 at 127.0.0.1:{} refused rank 1 of job 'job'", port)),
            std::string::npos)
      << rank1.error;
  EXPECT_NE(rank1.error.find("rank 1 says the world has 3 ranks, rank 0 says 2"), std::string::npos) << rank1.error;
}

TEST(RendezvousPeers, TwoProcessesClaimingOneRankFailOnBothSides) {
  const int port = free_port();
  Outcome rank0, first, second;
  std::thread server = run_rank(options_for("127.0.0.1", port, 0, 3, "job"), kBlob, rank0);
  std::thread a = run_rank(options_for("127.0.0.1", port, 1, 3, "job", 5s), {}, first);
  std::thread b = run_rank(options_for("127.0.0.1", port, 1, 3, "job", 5s), {}, second);
  a.join();
  b.join();
  server.join();
  EXPECT_NE(rank0.error.find("two processes claim rank 1; every rank needs its own RANK"), std::string::npos)
      << rank0.error;
  // One of the two was refused with that reason; the other lost its connection when rank 0 gave up.
  const std::string& refused = first.error.find("refused") != std::string::npos ? first.error : second.error;
  EXPECT_NE(refused.find("two processes claim rank 1"), std::string::npos) << first.error << "\n" << second.error;
}

TEST(RendezvousPeers, GarbageBytesAndBareConnectionsNeitherCrashNorHoldUpTheRanks) {
  const int port = free_port();
  Outcome rank0, rank1, rank2;
  std::thread server = run_rank(options_for("127.0.0.1", port, 0, 3, "job"), kBlob, rank0);
  // Before the ranks: a bare connection that never sends (held open throughout), one that sends half
  // a hello and stops, one that sends garbage, one that sends a hello-sized run of garbage, and a
  // hello of colossal's magic from another job with an absurd rank and world size.
  std::vector<RawConnection> strangers;
  strangers.push_back(connect_when_listening("127.0.0.1", port));
  ASSERT_TRUE(strangers.back().valid()) << rank0.error;
  std::vector<uint8_t> half = detail::encode_hello(1, 3, "job");
  half.resize(half.size() / 2);
  std::vector<uint8_t> noise(detail::kHelloBytes);
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<uint8_t>(i * 97 + 13);
  for (const std::vector<uint8_t>& bytes : {half, std::vector<uint8_t>{'G', 'E', 'T', ' ', '/', '\r', '\n'}, noise,
                                            detail::encode_hello(-5, 1 << 30, "another job")}) {
    strangers.emplace_back("127.0.0.1", port);
    ASSERT_TRUE(strangers.back().valid());
    EXPECT_TRUE(strangers.back().send(bytes));
  }
  // The real ranks are answered at once, not after the strangers' 5 s hello wait.
  const auto start = Clock::now();
  std::thread a = run_rank(options_for("127.0.0.1", port, 1, 3, "job"), {}, rank1);
  std::thread b = run_rank(options_for("127.0.0.1", port, 2, 3, "job"), {}, rank2);
  a.join();
  b.join();
  server.join();
  const auto took = Clock::now() - start;
  EXPECT_EQ(rank0.error, "");
  EXPECT_EQ(rank1.error, "");
  EXPECT_EQ(rank2.error, "");
  EXPECT_EQ(rank1.blob, kBlob);
  EXPECT_EQ(rank2.blob, kBlob);
  // Well under the 5 s a silent stranger may hold its own slot (the ranks take milliseconds; 3 s leaves
  // room for a loaded machine).
  EXPECT_LT(took, 3s);
}

TEST(RendezvousPeers, OnlyStrangersMeansATimeoutNamingTheMissingRanks) {
  const int port = free_port();
  Outcome rank0;
  std::thread server = run_rank(options_for("127.0.0.1", port, 0, 2, "job", 1500ms), kBlob, rank0);
  const RawConnection silent = connect_when_listening("127.0.0.1", port);
  server.join();
  EXPECT_NE(rank0.error.find("rank 1 of 2 never connected to rank 0"), std::string::npos) << rank0.error;
}

TEST(RendezvousJobId, FromTheLaunchersVariables) {
  std::map<std::string, std::string> torchrun = {{"RANK", "0"},
                                                 {"LOCAL_RANK", "0"},
                                                 {"WORLD_SIZE", "2"},
                                                 {"LOCAL_WORLD_SIZE", "2"},
                                                 {"MASTER_ADDR", "127.0.0.1"},
                                                 {"MASTER_PORT", "29500"},
                                                 {"TORCHELASTIC_RUN_ID", "run-7"}};
  EXPECT_EQ(parse_dist_env(torchrun).job_id, "run-7");
  torchrun["COLOSSAL_JOB_ID"] = "mine";
  EXPECT_EQ(parse_dist_env(torchrun).job_id, "mine");
  const std::map<std::string, std::string> slurm = {{"SLURM_PROCID", "0"},    {"SLURM_NTASKS", "1"},
                                                    {"SLURM_LOCALID", "0"},   {"SLURM_NTASKS_PER_NODE", "1"},
                                                    {"SLURM_JOB_ID", "1234"}, {"SLURM_STEP_ID", "2"}};
  EXPECT_EQ(parse_dist_env(slurm).job_id, "1234.2");
  EXPECT_EQ(parse_dist_env(std::map<std::string, std::string>{}).job_id, "");
}

TEST(RendezvousMessages, HelloAndAnswersRoundTrip) {
  const std::vector<uint8_t> bytes = detail::encode_hello(3, 8, "job");
  ASSERT_EQ(bytes.size(), detail::kHelloBytes);
  const auto hello = detail::decode_hello(std::span<const uint8_t, detail::kHelloBytes>(bytes.data(), bytes.size()));
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(hello->rank, 3);
  EXPECT_EQ(hello->world_size, 8);
  EXPECT_EQ(hello->job, detail::job_hash("job"));
  EXPECT_NE(detail::job_hash("job"), detail::job_hash("job2"));
  RendezvousOptions options;
  const std::vector<uint8_t> refusal = detail::encode_refusal(std::string(10000, 'x'));
  EXPECT_EQ(refusal.size(), detail::kAnswerHeaderBytes + 4 + detail::kMaxRefusalBytes);
  EXPECT_EQ(
      detail::decode_answer_header(
          std::span<const uint8_t, detail::kAnswerHeaderBytes>(refusal.data(), detail::kAnswerHeaderBytes), options),
      detail::kRefusal);
  const std::vector<uint8_t> big = {0x43, 0x4c, 0x53, 0x53, 0x7f, 0xff, 0xff, 0xff};
  EXPECT_ERROR_CONTAINS(detail::decode_answer_header(
                            std::span<const uint8_t, detail::kAnswerHeaderBytes>(big.data(), big.size()), options),
                        "not colossal's rendezvous");
}

}  // namespace
}  // namespace colossal::comm
