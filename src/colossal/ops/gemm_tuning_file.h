// The GEMM tuning file: the algorithms that autotuning chose (Note [GEMM autotuning] in
// ops/cuda/linalg_kernels.cpp), kept between processes. See Note [GEMM tuning file] in
// gemm_tuning_file.cpp. Host code only, so that the CPU build tests it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace colossal::ops {

/// A GEMM problem as the tuning file keys it: the fields of the backend's problem key, with the
/// device index left out (0), since the file is for one kind of GPU, not one GPU.
using GemmTuningKey = std::array<int64_t, 24>;
/// An algorithm as the GEMM library describes it (cuBLASLt's cublasLtMatmulAlgo_t: 8 words).
using GemmTuningAlgo = std::array<uint64_t, 8>;

/// FNV-1a over a problem key's fields: the hash of the backend's per-process algorithm cache and of
/// the tuning file's.
struct GemmKeyHash {
  size_t operator()(const GemmTuningKey& key) const;
};

/// The folder of tuning files: COLOSSAL_GEMM_CACHE when set ("off", "0" or empty: none), else
/// $XDG_CACHE_HOME/colossal, else $HOME/.cache/colossal; nullopt when there is none.
std::optional<std::string> gemm_tuning_dir();

/// The file for one GPU kind and library version under `dir`: `signature` (e.g. "NVIDIA H100 80GB
/// HBM3 sm90 cublasLt 130100") with every character but letters, digits, '.' and '-' made '_'.
std::string gemm_tuning_path(std::string_view dir, std::string_view signature);

/// One line of the file (newline included), and its reading: nullopt for anything else (a line cut
/// short, another version's line, a bad checksum).
std::string format_gemm_tuning_line(const GemmTuningKey& key, const GemmTuningAlgo& algo);
std::optional<std::pair<GemmTuningKey, GemmTuningAlgo>> parse_gemm_tuning_line(std::string_view line);

class GemmTuningFile {
 public:
  /// Reads what `path` holds (a missing file holds nothing; lines that do not parse are skipped).
  /// Where a key appears twice, the first line wins, so every process reading the file agrees.
  explicit GemmTuningFile(std::string path);

  const std::string& path() const { return path_; }
  size_t size() const { return algos_.size(); }
  std::optional<GemmTuningAlgo> find(const GemmTuningKey& key) const;

  /// Appends the line for (key, algo), creating the folder and the file where missing; a key the
  /// file already holds keeps its first answer. Returns an empty string, or why it could not write.
  std::string append(const GemmTuningKey& key, const GemmTuningAlgo& algo);

 private:
  std::string path_;
  std::unordered_map<GemmTuningKey, GemmTuningAlgo, GemmKeyHash> algos_;
};

}  // namespace colossal::ops
