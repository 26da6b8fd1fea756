// Bootstrap without MPI: DistEnv from each launcher's variables (ours, torchrun, Open MPI, Slurm), the
// order they win in, the errors of partial or inconsistent environments; and the TCP rendezvous with
// threads as ranks (late rank 0, a rank that never comes, no rank 0 at all, disagreeing peers, a port
// in use, a stranger on the port).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "colossal/comm/bootstrap.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::comm {
namespace {

using Vars = std::map<std::string, std::string>;

Vars torchrun_vars() {
  return {{"RANK", "3"},
          {"LOCAL_RANK", "1"},
          {"WORLD_SIZE", "8"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "node0"},
          {"MASTER_PORT", "29500"}};
}

TEST(DistEnv, NothingSetIsASingleProcess) {
  const DistEnv env = parse_dist_env(Vars{});
  EXPECT_EQ(env.source, EnvSource::single);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 1);
}

TEST(DistEnv, Torchrun) {
  const DistEnv env = parse_dist_env(torchrun_vars());
  EXPECT_EQ(env.source, EnvSource::torchrun);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "node0");
  EXPECT_EQ(env.master_port, 29500);
  // torchrun's own store holds MASTER_PORT.
  EXPECT_EQ(env.rendezvous_port(), 29501);
  EXPECT_NE(env.describe().find("rank 3 of 8 (local 1 of 2), from torchrun"), std::string::npos) << env.describe();
}

TEST(DistEnv, OurLauncherUsesTorchrunNamesAndTheMasterPortItself) {
  Vars vars = torchrun_vars();
  vars["COLOSSAL_LAUNCHER"] = "1";
  const DistEnv env = parse_dist_env(vars);
  EXPECT_EQ(env.source, EnvSource::launcher);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.rendezvous_port(), 29500);
}

TEST(DistEnv, OpenMpi) {
  const DistEnv env = parse_dist_env(Vars{{"OMPI_COMM_WORLD_RANK", "5"},
                                          {"OMPI_COMM_WORLD_SIZE", "6"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
  EXPECT_EQ(env.source, EnvSource::openmpi);
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 6);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.local_world_size, 3);
}

TEST(DistEnv, SlurmReadsTasksPerNodeHostListAndJobPort) {
  const DistEnv env = parse_dist_env(Vars{{"SLURM_PROCID", "6"},
                                          {"SLURM_NTASKS", "7"},
                                          {"SLURM_LOCALID", "0"},
                                          {"SLURM_NODEID", "3"},
                                          {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                                          {"SLURM_JOB_NODELIST", "gpu-[003-004,007],login1"},
                                          {"SLURM_JOB_ID", "123456"}});
  EXPECT_EQ(env.source, EnvSource::slurm);
  EXPECT_EQ(env.rank, 6);
  EXPECT_EQ(env.world_size, 7);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 1);  // node 3 is the "1" after three nodes of 2
  EXPECT_EQ(env.master_addr, "gpu-003");
  EXPECT_EQ(env.master_port, 20000 + 123456 % 20000);
  EXPECT_EQ(env.rendezvous_port(), env.master_port);
}

TEST(DistEnv, SlurmPrefersTheStepsDistributionAndExplicitMaster) {
  const DistEnv env = parse_dist_env(Vars{{"SLURM_PROCID", "1"},
                                          {"SLURM_NTASKS", "4"},
                                          {"SLURM_LOCALID", "1"},
                                          {"SLURM_NODEID", "0"},
                                          {"SLURM_STEP_TASKS_PER_NODE", "4"},
                                          {"SLURM_TASKS_PER_NODE", "1(x4)"},
                                          {"SLURM_JOB_NODELIST", "a,b"},
                                          {"MASTER_ADDR", "10.0.0.7"},
                                          {"MASTER_PORT", "31000"}});
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "10.0.0.7");
  EXPECT_EQ(env.master_port, 31000);
}

TEST(DistEnv, FirstSlurmHost) {
  EXPECT_EQ(first_slurm_host("node17"), "node17");
  EXPECT_EQ(first_slurm_host("a,b,c"), "a");
  EXPECT_EQ(first_slurm_host("gpu-[003-004,007]"), "gpu-003");
  EXPECT_EQ(first_slurm_host("gpu[12,14-15],cpu[1-2]"), "gpu12");
  EXPECT_EQ(first_slurm_host("rack[1-2]-node[08-09]"), "rack1-node08");
}

TEST(DistEnv, PrecedenceLauncherTorchrunOpenMpiSlurm) {
  Vars vars = torchrun_vars();
  vars["OMPI_COMM_WORLD_RANK"] = "0";
  vars["SLURM_PROCID"] = "0";
  EXPECT_EQ(parse_dist_env(vars).source, EnvSource::torchrun);
  vars["COLOSSAL_LAUNCHER"] = "1";
  EXPECT_EQ(parse_dist_env(vars).source, EnvSource::launcher);
  // mpirun inside a Slurm allocation: every process has the batch step's SLURM_PROCID=0.
  const Vars mpirun_in_slurm{
      {"OMPI_COMM_WORLD_RANK", "1"},       {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"SLURM_PROCID", "0"},         {"SLURM_NTASKS", "1"}};
  const DistEnv env = parse_dist_env(mpirun_in_slurm);
  EXPECT_EQ(env.source, EnvSource::openmpi);
  EXPECT_EQ(env.rank, 1);
}

TEST(DistEnv, PartialEnvironmentsNameEveryMissingVariable) {
  EXPECT_ERROR_CONTAINS(parse_dist_env(Vars{{"RANK", "0"}}),
                        "torchrun: RANK is set, so this is a torchrun environment, but LOCAL_RANK, WORLD_SIZE, "
                        "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT are missing");
  Vars launcher = torchrun_vars();
  launcher["COLOSSAL_LAUNCHER"] = "1";
  launcher.erase("LOCAL_WORLD_SIZE");
  launcher["MASTER_PORT"] = "";  // set but empty counts as missing
  EXPECT_ERROR_CONTAINS(parse_dist_env(launcher), "but LOCAL_WORLD_SIZE, MASTER_PORT are missing");
  EXPECT_ERROR_CONTAINS(parse_dist_env(Vars{{"WORLD_SIZE", "4"}}), "torchrun: WORLD_SIZE is set");
  EXPECT_ERROR_CONTAINS(parse_dist_env(Vars{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
                        "but OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE are missing");
  EXPECT_ERROR_CONTAINS(parse_dist_env(Vars{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}), "SLURM_LOCALID is missing");
  EXPECT_ERROR_CONTAINS(parse_dist_env(Vars{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}}),
                        "cannot tell how many tasks run on this node");
}

TEST(DistEnv, InconsistentEnvironmentsSayWhatIsWrong) {
  auto with = [](std::string name, std::string value) {
    Vars vars = torchrun_vars();
    vars[name] = value;
    return vars;
  };
  EXPECT_ERROR_CONTAINS(parse_dist_env(with("RANK", "8")),
                        "torchrun: RANK=8 is outside the world (WORLD_SIZE=8: ranks 0 to 7)");
  EXPECT_ERROR_CONTAINS(parse_dist_env(with("RANK", "-1")), "RANK=-1 is outside the world");
  EXPECT_ERROR_CONTAINS(parse_dist_env(with("RANK", "three")), "torchrun: RANK='three' is not an integer");
  EXPECT_ERROR_CONTAINS(parse_dist_env(with("WORLD_SIZE", "4x")), "WORLD_SIZE='4x' is not an integer");
  EXPECT_ERROR_CONTAINS(parse_dist_env(with("LOCAL_RANK", "2")), "LOCAL_RANK=2 is outside this node's 2 processes");
  EXPECT_ERROR_CONTAINS(parse_dist_env(with("LOCAL_WORLD_SIZE", "9")),
                        "LOCAL_WORLD_SIZE=9 must be between 1 and WORLD_SIZE=8");
  EXPECT_ERROR_CONTAINS(parse_dist_env(with("MASTER_PORT", "70000")), "MASTER_PORT=70000 is not a TCP port");
  EXPECT_ERROR_CONTAINS(parse_dist_env(with("MASTER_PORT", "65535")), "leaves no port for the rendezvous");
  EXPECT_ERROR_CONTAINS(
      parse_dist_env(
          Vars{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"SLURM_TASKS_PER_NODE", "two"}}),
      "cannot read node 0's task count from SLURM_TASKS_PER_NODE='two'");
}

TEST(DistEnv, ReadsTheProcessEnvironment) {
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  const char* saved_rank = std::getenv("RANK");
  const char* saved_world = std::getenv("WORLD_SIZE");
  const char* saved_launcher = std::getenv("COLOSSAL_LAUNCHER");
  if (saved_rank == nullptr && saved_world == nullptr && saved_launcher == nullptr) {
    const DistEnv env = read_dist_env();
    EXPECT_EQ(env.source, EnvSource::openmpi);
    EXPECT_EQ(env.rank, 1);
  }
  for (const char* name :
       {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    ::unsetenv(name);
  }
}

TEST(RendezvousTimeout, DefaultAndEnvironment) {
  ::unsetenv("COLOSSAL_RENDEZVOUS_TIMEOUT");
  EXPECT_EQ(default_rendezvous_timeout(), std::chrono::seconds(300));
  ::setenv("COLOSSAL_RENDEZVOUS_TIMEOUT", "2.5", 1);
  EXPECT_EQ(default_rendezvous_timeout(), std::chrono::milliseconds(2500));
  ::setenv("COLOSSAL_RENDEZVOUS_TIMEOUT", "soon", 1);
  EXPECT_ERROR_CONTAINS(default_rendezvous_timeout(), "COLOSSAL_RENDEZVOUS_TIMEOUT='soon' is not a positive number");
  ::setenv("COLOSSAL_RENDEZVOUS_TIMEOUT", "0", 1);
  EXPECT_ERROR_CONTAINS(default_rendezvous_timeout(), "is not a positive number");
  ::unsetenv("COLOSSAL_RENDEZVOUS_TIMEOUT");
}

// ---- TCP rendezvous, ranks as threads

/// A port nothing listens on right now (the kernel's pick for an ephemeral bind).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

struct RankOutcome {
  std::vector<uint8_t> blob;
  std::string error;
};

/// Runs `ranks` of a world of `world_size` as threads, rank 0 started `rank0_delay` after the others.
std::vector<RankOutcome> run_ranks(const std::vector<int>& ranks, int world_size, int port,
                                   std::chrono::milliseconds timeout, const std::vector<uint8_t>& blob,
                                   std::chrono::milliseconds rank0_delay = std::chrono::milliseconds(0),
                                   std::function<int(int)> claimed_world_size = nullptr) {
  std::vector<RankOutcome> outcomes(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  for (int rank : ranks) {
    threads.emplace_back([&, rank] {
      if (rank == 0) std::this_thread::sleep_for(rank0_delay);
      RendezvousOptions options;
      options.addr = "127.0.0.1";
      options.port = port;
      options.rank = rank;
      options.world_size = claimed_world_size ? claimed_world_size(rank) : world_size;
      options.timeout = timeout;
      try {
        outcomes[static_cast<size_t>(rank)].blob =
            tcp_rendezvous_broadcast(options, rank == 0 ? blob : std::vector<uint8_t>{});
      } catch (const Error& error) {
        outcomes[static_cast<size_t>(rank)].error = error.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return outcomes;
}

std::vector<uint8_t> unique_id_like_blob() {
  std::vector<uint8_t> blob(128);
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<uint8_t>(i * 37 + 11);
  return blob;
}

TEST(TcpRendezvous, EveryRankGetsRankZerosBlobEvenWhenRankZeroIsLate) {
  const auto blob = unique_id_like_blob();
  const auto outcomes = run_ranks({0, 1, 2, 3}, 4, free_port(), std::chrono::seconds(20), blob,
                                  /*rank0_delay=*/std::chrono::milliseconds(300));
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    SCOPED_TRACE(rank);
    EXPECT_EQ(outcomes[rank].error, "");
    EXPECT_EQ(outcomes[rank].blob, blob);
  }
}

TEST(TcpRendezvous, SingleRankNeedsNoNetwork) {
  RendezvousOptions options;
  options.port = 1;  // never bound
  EXPECT_EQ(tcp_rendezvous_broadcast(options, {1, 2, 3}), (std::vector<uint8_t>{1, 2, 3}));
}

TEST(TcpRendezvous, AMissingRankTimesOutNamingItAndTheAddress) {
  const int port = free_port();
  const auto outcomes = run_ranks({0, 1, 3}, 4, port, std::chrono::milliseconds(1000), unique_id_like_blob());
  EXPECT_NE(
      outcomes[0].error.find(fmt::format("rank 2 of 4 never connected to rank 0 at 127.0.0.1:{} within 1 s", port)),
      std::string::npos)
      << outcomes[0].error;
  EXPECT_NE(outcomes[0].error.find("COLOSSAL_RENDEZVOUS_TIMEOUT"), std::string::npos);
  for (size_t rank : {1u, 3u}) {
    SCOPED_TRACE(rank);
    EXPECT_NE(outcomes[rank].error.find("closed the connection before sending the id"), std::string::npos)
        << outcomes[rank].error;
  }
}

TEST(TcpRendezvous, SeveralMissingRanksAreAllNamed) {
  const auto outcomes = run_ranks({0, 2}, 5, free_port(), std::chrono::milliseconds(500), unique_id_like_blob());
  EXPECT_NE(outcomes[0].error.find("ranks 1, 3, 4 of 5 never connected"), std::string::npos) << outcomes[0].error;
}

TEST(TcpRendezvous, NoRankZeroTimesOutNamingTheAddress) {
  const int port = free_port();
  const auto outcomes = run_ranks({1}, 2, port, std::chrono::milliseconds(500), {});
  EXPECT_NE(outcomes[1].error.find(fmt::format("rank 1 could not reach rank 0 at 127.0.0.1:{} within 0.5 s", port)),
            std::string::npos)
      << outcomes[1].error;
  EXPECT_NE(outcomes[1].error.find("last error"), std::string::npos);
}

TEST(TcpRendezvous, PeersDisagreeingOnTheWorldSizeAreRejected) {
  const auto outcomes = run_ranks({0, 1}, 2, free_port(), std::chrono::seconds(10), unique_id_like_blob(),
                                  std::chrono::milliseconds(0), [](int rank) { return rank == 0 ? 2 : 3; });
  EXPECT_NE(outcomes[0].error.find("rank 1 says the world has 3 ranks, rank 0 says 2"), std::string::npos)
      << outcomes[0].error;
  EXPECT_NE(outcomes[1].error, "");
}

TEST(TcpRendezvous, APortInUseIsReportedByRankZero) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  const int port = ntohs(address.sin_port);
  const auto outcomes = run_ranks({0}, 2, port, std::chrono::seconds(5), unique_id_like_blob());
  ::close(fd);
  EXPECT_NE(outcomes[0].error.find(fmt::format("rank 0 cannot listen on port {}", port)), std::string::npos)
      << outcomes[0].error;
}

TEST(TcpRendezvous, AStrangerOnThePortIsIgnored) {
  const int port = free_port();
  const auto blob = unique_id_like_blob();
  RankOutcome rank0;
  std::thread server([&] {
    RendezvousOptions options;
    options.port = port;
    options.world_size = 3;
    options.timeout = std::chrono::seconds(20);
    try {
      rank0.blob = tcp_rendezvous_broadcast(options, blob);
    } catch (const Error& error) {
      rank0.error = error.what();
    }
  });
  // Before any rank: connect once rank 0 listens, send something that is not a hello, hang up.
  bool stranger_got_in = false;
  for (int attempt = 0; attempt < 500 && !stranger_got_in; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
      const char junk[] = "GET / HTTP/1.0\r\n\r\n";
      stranger_got_in = ::send(fd, junk, sizeof junk, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof junk);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::close(fd);
  }
  EXPECT_TRUE(stranger_got_in);
  const auto outcomes = run_ranks({1, 2}, 3, port, std::chrono::seconds(20), {});
  server.join();
  EXPECT_EQ(rank0.error, "");
  EXPECT_EQ(rank0.blob, blob);
  for (size_t rank : {1u, 2u}) {
    SCOPED_TRACE(rank);
    EXPECT_EQ(outcomes[rank].error, "");
    EXPECT_EQ(outcomes[rank].blob, blob);
  }
}

TEST(TcpRendezvous, BadOptionsAreRejected) {
  RendezvousOptions options;
  options.world_size = 2;
  options.rank = 2;
  EXPECT_ERROR_CONTAINS(tcp_rendezvous_broadcast(options, {}), "rank 2 is outside a world of 2 ranks");
  options.rank = 0;
  options.port = 0;
  EXPECT_ERROR_CONTAINS(tcp_rendezvous_broadcast(options, {}), "port 0 is not a TCP port");
}

}  // namespace
}  // namespace colossal::comm
