// What the CLI checkpoint tests under MPI ranks share (tests/cli/train_{tp,zero,pipeline}_checkpoint_mpi_test):
// a folder every rank sees, made afresh by rank 0, and the token file their tiny GPT-2s train on.
#pragma once

#include <unistd.h>  // getpid

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "colossal/comm/process_group.h"
#include "colossal/core/tensor.h"

namespace colossal::testing {

/// `count` uint16 token ids below `vocab` in a fixed, varied pattern, written to `path`.
inline void write_pattern_tokens(const std::filesystem::path& path, int count, int vocab) {
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < count; ++i) {
    const auto t = static_cast<uint16_t>((i * 7 + i / 5 + (i * i) % 13) % vocab);
    const char bytes[2] = {static_cast<char>(t & 0xFF), static_cast<char>(t >> 8)};
    out.write(bytes, 2);
  }
}

/// The temporary folder `prefix`_<rank 0's pid>_<world size>, the same on every rank of `world`
/// (the pid is broadcast); rank 0 empties it and runs `fill` (write the token file, the configs), and
/// every rank returns after a barrier, when the folder is ready.
inline std::filesystem::path shared_run_dir(comm::ProcessGroup& world, const std::string& prefix,
                                            const std::function<void(const std::filesystem::path&)>& fill) {
  Tensor stamp = core::from_vector<int64_t>({static_cast<int64_t>(::getpid())}, {1});
  world.broadcast(stamp, 0);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      (prefix + "_" + std::to_string(stamp.item<int64_t>()) + "_" + std::to_string(world.size()));
  if (world.rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    fill(dir);
  }
  world.barrier();
  return dir;
}

}  // namespace colossal::testing
