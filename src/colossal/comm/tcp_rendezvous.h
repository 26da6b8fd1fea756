// A small TCP rendezvous: rank 0 listens, every other rank connects (retrying until rank 0 is up), and
// rank 0 sends each of them one blob (the NCCL unique id, 128 bytes). Used to start NCCL when MPI is
// not the bootstrap (torchrun, our launcher, Slurm). Not a data path: it moves one small blob once.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace colossal::comm {

/// How long a rendezvous waits for every rank by default: COLOSSAL_RENDEZVOUS_TIMEOUT (seconds, may
/// be fractional) when set, else 300 s. A malformed value throws naming the variable.
std::chrono::milliseconds default_rendezvous_timeout();

struct RendezvousOptions {
  /// Host of rank 0 (name or address). Rank 0 listens on this address only (the first of the name's
  /// addresses that binds), so the name must resolve on rank 0's host to an address the others reach:
  /// a host name that /etc/hosts maps to 127.0.1.1 (Debian's default) is reachable from that host only.
  std::string addr = "127.0.0.1";
  int port = 29500;
  int rank = 0;
  int world_size = 1;
  /// From each rank's start of the rendezvous: rank 0 waits this long for the others to arrive; the
  /// others retry connecting this long and wait for the blob up to min(timeout, 5 s) longer (so they
  /// hear rank 0 give up rather than give up at the same moment).
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  /// Names the job (bootstrap's DistEnv::job_id), so that rank 0 turns away, with a refusal naming both
  /// jobs, a rank of another job given the same port, and keeps waiting for its own. Every rank of a
  /// job passes the same id; "" is a job id like any other.
  std::string job_id;
};

/// Rank 0 passes `blob` and gets it back; every other rank passes anything (ignored) and gets rank 0's.
/// Throws colossal::Error when the port cannot be bound, when ranks never arrive (naming them and the
/// address), when rank 0 cannot be reached, when a peer of the same job disagrees on the world size or
/// reuses a rank (on rank 0 and on that peer), or when rank 0 serves another job (on the peer).
/// Connections that never send a whole hello, or send one without colossal's magic, are dropped after
/// at most 5 s without holding up the others.
std::vector<uint8_t> tcp_rendezvous_broadcast(const RendezvousOptions& options, const std::vector<uint8_t>& blob);

namespace detail {

// The messages, read apart from the sockets so that the fuzz target (fuzz/rendezvous_fuzz.cpp) and the
// tests reach them. Integers big-endian. A rank's hello: {magic, version, rank, world_size} (4 x u32)
// and the hash of its job id (u64). Rank 0's answer: {magic, blob length} (2 x u32) and the blob; or,
// to a peer it will not take, {magic, kRefusal}, the reason's length (u32) and the reason (text).

inline constexpr size_t kHelloBytes = 24;
inline constexpr size_t kAnswerHeaderBytes = 8;
/// The largest blob rank 0 sends or a rank accepts.
inline constexpr uint32_t kMaxRendezvousBlob = 1u << 20;
/// The length field of a refusal.
inline constexpr uint32_t kRefusal = 0xffffffffu;
/// The longest reason a refusal carries (longer ones are cut).
inline constexpr uint32_t kMaxRefusalBytes = 4096;

struct RendezvousHello {
  uint32_t version = 0;
  int rank = 0;
  int world_size = 0;
  uint64_t job = 0;  ///< job_hash of the peer's job id
};

/// FNV-1a of the job id: what a hello carries of it.
uint64_t job_hash(std::string_view job_id);

std::vector<uint8_t> encode_hello(int rank, int world_size, std::string_view job_id);

/// A hello as rank 0 reads it: nullopt when the magic is not colossal's (a stranger on the port, whom
/// rank 0 ignores).
std::optional<RendezvousHello> decode_hello(std::span<const uint8_t, kHelloBytes> bytes);

/// Throws colossal::Error naming what disagrees when rank 0 (options) cannot take this hello of its own
/// job: another version, another world size, a rank outside 1 .. world_size - 1, or a rank that
/// `arrived` already holds (arrived[r]: rank r is in; its size is the world size).
void check_hello(const RendezvousHello& hello, const RendezvousOptions& options, const std::vector<bool>& arrived);

std::vector<uint8_t> encode_answer_header(uint32_t blob_length);
/// A refusal: the header with kRefusal, the reason's length and the reason (cut to kMaxRefusalBytes).
std::vector<uint8_t> encode_refusal(std::string_view reason);

/// The blob length in rank 0's answer, or kRefusal; throws colossal::Error when the answer is not
/// colossal's (a wrong magic, or a length over kMaxRendezvousBlob that is not kRefusal).
uint32_t decode_answer_header(std::span<const uint8_t, kAnswerHeaderBytes> bytes, const RendezvousOptions& options);

}  // namespace detail

}  // namespace colossal::comm
