// A small TCP rendezvous: rank 0 listens, every other rank connects (retrying until rank 0 is up), and
// rank 0 sends each of them one blob (the NCCL unique id, 128 bytes). Used to start NCCL when MPI is
// not the bootstrap (torchrun, our launcher, Slurm). Not a data path: it moves one small blob once.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace colossal::comm {

/// How long a rendezvous waits for every rank by default: COLOSSAL_RENDEZVOUS_TIMEOUT (seconds, may
/// be fractional) when set, else 300 s. A malformed value throws naming the variable.
std::chrono::milliseconds default_rendezvous_timeout();

struct RendezvousOptions {
  /// Host of rank 0 (name or address). Rank 0 listens on every interface of its host.
  std::string addr = "127.0.0.1";
  int port = 29500;
  int rank = 0;
  int world_size = 1;
  /// From each rank's start of the rendezvous: rank 0 waits this long for the others to arrive; the
  /// others retry connecting this long and wait for the blob up to min(timeout, 5 s) longer (so they
  /// hear rank 0 give up rather than give up at the same moment).
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
};

/// Rank 0 passes `blob` and gets it back; every other rank passes anything (ignored) and gets rank 0's.
/// Throws colossal::Error when the port cannot be bound, when ranks never arrive (naming them and the
/// address), when rank 0 cannot be reached, or when a peer disagrees on the world size or reuses a rank.
std::vector<uint8_t> tcp_rendezvous_broadcast(const RendezvousOptions& options, const std::vector<uint8_t>& blob);

}  // namespace colossal::comm
