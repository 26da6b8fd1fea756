// CUDA matrix products through cuBLASLt: the batched GEMM and the GEMM with fused epilogues (bias,
// bias + tanh-GELU keeping the pre-activation, bias gradient, GELU gradient with or without the bias
// gradient) of ops/linalg_kernels.h. Host code
// only: one cuBLASLt handle per device, a workspace per stream, and per problem the fastest of the
// heuristic's candidates, timed once and cached. See Note [Row-major GEMM on column-major cuBLASLt]
// and Note [GEMM autotuning].
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "colossal/core/cuda/cuda_check.h"  // COLOSSAL_CUDA_CHECK
#include "colossal/core/cuda_device.h"      // DeviceGuard, current_stream
#include "colossal/core/view.h"             // contiguous_raw, narrow_raw
#include "colossal/ops/gemm_tuning_file.h"  // GemmTuningFile
#include "colossal/ops/linalg.h"            // float32_matmul_precision
#include "colossal/ops/linalg_kernels.h"

#define COLOSSAL_CUBLASLT_CHECK(expr)                                                                 \
  do {                                                                                                \
    const cublasStatus_t colossal_cublas_status_ = (expr);                                            \
    if (colossal_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                              \
      COLOSSAL_FAIL("cuBLASLt error {} ({}) from {}", cublasLtGetStatusName(colossal_cublas_status_), \
                    cublasLtGetStatusString(colossal_cublas_status_), #expr);                         \
    }                                                                                                 \
  } while (0)

namespace colossal::ops {
namespace {

// Note [Row-major GEMM on column-major cuBLASLt]
// Our tensors are row-major: out [M, N] = a [M, K] b [K, N]. A row-major [R, C] matrix is the same
// memory as a column-major [C, R] one, so cuBLASLt computes the transposed product instead:
// out^T [N, M] = b^T [N, K] a^T [K, M], with cuBLAS's A = our b and cuBLAS's B = our a, and
// (m, n, k) = (N, M, K). An operand whose last dimension has unit stride enters untransposed with
// leading dimension = its row stride; one whose second-to-last dimension has unit stride (a
// transposed view) enters with the transpose flag and leading dimension = its column stride.
// linear's x @ W^T thus becomes the "TN" GEMM cuBLASLt is fastest at. Epilogues follow the swap:
// the bias over out's columns is a bias over the rows of cuBLAS's D (CUBLASLT_EPILOGUE_BIAS), and
// the row sums of our a are the bias gradient of cuBLAS's B (CUBLASLT_EPILOGUE_BGRADB), and the
// column sums of our out are the row sums of D (CUBLASLT_EPILOGUE_DGELU_BGRAD). The GELU epilogues'
// auxiliary matrix (the pre-activation) has D's layout, so our row-major [M, N] with a row stride
// that is a multiple of 8, written by GELU_AUX_BIAS and read back unchanged by DGELU_BGRAD.
// This is the swap PyTorch makes too. The layouts keep cuBLASLt's default CUBLASLT_ORDER_COL (its
// ROW order runs slower kernels), contiguous operands keep their packed leading dimensions, and the
// preference states each pointer's real alignment (256 bytes for fresh allocations) so that no
// kernel is excluded for fear of misalignment.

// Note [GEMM autotuning]
// cuBLASLt's heuristic ranks algorithms by a model, and its first pick is measurably off the
// fastest for some common shapes (on an H100, bf16 4096^3 and GPT-2's 16384 x 768 x 3072 ran ~10%
// behind torch.matmul). So the first time a problem (AlgoKey) is seen, and it is big enough for
// the difference to matter (2 M N K >= kAutotuneMinFlops per strided batch; below that launch
// overhead dominates), up to kAutotuneCandidates of the heuristic's answers are run on the call's
// own operands on the current stream: one warm-up each, then kAutotuneRounds rounds that run every
// candidate once between CUDA events, and the one with the smallest median time is cached. The
// rounds interleave the candidates rather than timing each candidate's runs together, so that a
// drift while they are timed (the first problems are tuned while the GPU's clocks rise from idle,
// and under data parallelism beside another rank's all-reduce) falls on every candidate alike. The
// best few candidates are often within 2-5% of each other, and which one wins still differs from
// process to process (Note [GEMM tuning file]). The output is scratch while timing
// (with beta = 0: every algorithm overwrites it, and the epilogues' bias gradient and the forward's
// pre-activation too; DGELU only reads its pre-activation); a call that accumulates (beta != 0) is
// timed into a temporary output. The epilogue is part of the key, so DGELU_BGRAD is tuned apart
// from the plain GEMM of the same shape.
// The choices are kept in the tuning file (Note [GEMM tuning file] in ops/gemm_tuning_file.cpp), so
// a problem is tuned once per kind of GPU and library version, not once per process: every later
// process and every rank runs the same kernels.
// Costs: one host synchronization and a few milliseconds per new problem, once per tuning file.
// - COLOSSAL_GEMM_AUTOTUNE=0 in the environment turns it off: the heuristic's first pick, no sync.
// - A stream being captured into a CUDA graph cannot be synchronized: captured calls take the
//   heuristic's pick, cached as unsettled, and the first call outside a capture tunes the problem.
// - Timing runs in the relaxed capture mode, so that a global-mode capture on another thread does
//   not forbid the event synchronization.

/// 32 MiB: what cuBLAS recommends for Hopper; lets the heuristic pick split-K and stream-K kernels.
/// cudaMalloc'ed, so 256-byte aligned as cuBLASLt requires.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
/// cuBLASLt's default (and largest) alignment assumption, in bytes.
constexpr uint32_t kMaxAlignment = 256;
/// Algorithms remembered per process; see CublasLtState::remember_algo.
constexpr size_t kMaxCachedAlgos = 4096;
/// See Note [GEMM autotuning].
constexpr double kAutotuneMinFlops = 1e9;
constexpr int kAutotuneCandidates = 8;
constexpr int kAutotuneRounds = 5;

// ---- library state

/// A GEMM problem (key_of): the tuning file keys it the same way.
using AlgoKey = GemmTuningKey;

/// What the cache holds per problem: the algorithm (nullopt when cuBLASLt has none), and whether
/// it is final. An unsettled one is the heuristic's pick for a problem worth autotuning that could
/// not be tuned yet (autotuning off, or a stream capture); see Note [GEMM autotuning].
struct CachedAlgo {
  std::optional<cublasLtMatmulAlgo_t> algo;
  bool settled = false;
};

/// Handles, workspaces and the algorithm cache, shared by every thread. Created on first use and
/// never destroyed: tearing cuBLASLt down from a static destructor races the CUDA runtime's own
/// shutdown, and the process exit frees everything anyway.
class CublasLtState {
 public:
  static CublasLtState& instance() {
    static CublasLtState* state = new CublasLtState();
    return *state;
  }

  /// The device's handle, created on first use (the caller has made the device current).
  cublasLtHandle_t handle(int device) {
    std::lock_guard lock(mutex_);
    auto [it, inserted] = handles_.try_emplace(device, nullptr);
    if (inserted) {
      try {
        COLOSSAL_CUBLASLT_CHECK(cublasLtCreate(&it->second));
      } catch (...) {
        handles_.erase(it);
        throw;
      }
    }
    return it->second;
  }

  /// The workspace of a stream. One per stream rather than per device: GEMMs on two streams of a
  /// device may run at the same time and must not share scratch memory. Allocated with cudaMalloc
  /// once, outside the caching allocator, so that tensor memory statistics stay about tensors.
  void* workspace(int device, cudaStream_t stream) {
    std::lock_guard lock(mutex_);
    auto [it, inserted] = workspaces_.try_emplace({device, stream}, nullptr);
    if (inserted) {
      const cudaError_t status = cudaMalloc(&it->second, kWorkspaceBytes);
      if (status != cudaSuccess) {
        workspaces_.erase(it);
        cudaGetLastError();
        COLOSSAL_FAIL("matmul: cannot allocate the {} MiB cuBLASLt workspace on cuda:{}: {}", kWorkspaceBytes >> 20,
                      device, cudaGetErrorString(status));
      }
    }
    return it->second;
  }

  /// The cached answer for a problem. Returns false when the problem was never asked about.
  bool find_algo(const AlgoKey& key, CachedAlgo* algo) {
    std::lock_guard lock(mutex_);
    if (const int64_t generation = gemm_algo_generation.load(std::memory_order_relaxed); generation != generation_) {
      algos_.clear();  // forget_gemm_algos
      generation_ = generation;
    }
    const auto it = algos_.find(key);
    if (it == algos_.end()) return false;
    *algo = it->second;
    return true;
  }

  void remember_algo(const AlgoKey& key, const CachedAlgo& algo) {
    std::lock_guard lock(mutex_);
    // Training loops use a few dozen shapes; the bound only stops unbounded growth when shapes keep
    // changing (e.g. variable sequence lengths). Starting over costs one heuristic query (and, for
    // big problems, one autotuning) per shape.
    if (algos_.size() >= kMaxCachedAlgos) algos_.clear();
    algos_[key] = algo;
  }

  /// The algorithm the device's tuning file holds for a problem (Note [GEMM tuning file]), if any.
  std::optional<cublasLtMatmulAlgo_t> find_tuned(int device, const AlgoKey& key) {
    std::lock_guard lock(mutex_);
    const GemmTuningFile* file = tuning_file(device);
    if (file == nullptr) return std::nullopt;
    const std::optional<GemmTuningAlgo> words = file->find(key);
    if (!words) return std::nullopt;
    cublasLtMatmulAlgo_t algo;
    static_assert(sizeof(algo) == sizeof(GemmTuningAlgo), "cublasLtMatmulAlgo_t is not 8 words");
    std::memcpy(&algo, words->data(), sizeof(algo));
    return algo;
  }

  /// Adds a tuned problem to the device's tuning file; a file that cannot be written is said once.
  void record_tuned(int device, const AlgoKey& key, const cublasLtMatmulAlgo_t& algo) {
    std::lock_guard lock(mutex_);
    GemmTuningFile* file = tuning_file(device);
    if (file == nullptr) return;
    GemmTuningAlgo words;
    std::memcpy(words.data(), &algo, sizeof(algo));
    const std::string error = file->append(key, words);
    if (!error.empty() && !tuning_file_warned_) {
      tuning_file_warned_ = true;
      std::fprintf(stderr,
                   "colossal: the GEMM tuning file is not written (%s); tuned choices stay in this process. "
                   "COLOSSAL_GEMM_CACHE=<folder> puts it elsewhere, COLOSSAL_GEMM_CACHE=off turns it off.\n",
                   error.c_str());
    }
  }

 private:
  struct StreamKey {
    int device;
    cudaStream_t stream;
    bool operator==(const StreamKey&) const = default;
  };
  struct StreamKeyHash {
    size_t operator()(const StreamKey& k) const {
      return std::hash<const void*>()(k.stream) ^ (static_cast<size_t>(k.device) * 0x9e3779b97f4a7c15ull);
    }
  };

  /// The device's tuning file, read on first use and read again when COLOSSAL_GEMM_CACHE names
  /// another folder (tests switch it); null when off. Called with mutex_ held.
  GemmTuningFile* tuning_file(int device) {
    const std::optional<std::string> dir = gemm_tuning_dir();
    if (!dir) return nullptr;
    auto [it, inserted] = tuning_files_.try_emplace(device);
    if (inserted || it->second.dir != *dir) {
      cudaDeviceProp prop{};
      COLOSSAL_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
      const std::string signature =
          fmt::format("{} sm{}{} cublasLt {}", prop.name, prop.major, prop.minor, cublasLtGetVersion());
      it->second.dir = *dir;
      it->second.file = std::make_unique<GemmTuningFile>(gemm_tuning_path(*dir, signature));
    }
    return it->second.file.get();
  }

  struct TuningFileSlot {
    std::string dir;
    std::unique_ptr<GemmTuningFile> file;
  };

  std::mutex mutex_;
  std::unordered_map<int, TuningFileSlot> tuning_files_;
  bool tuning_file_warned_ = false;
  int64_t generation_ = 0;
  std::unordered_map<int, cublasLtHandle_t> handles_;
  std::unordered_map<StreamKey, void*, StreamKeyHash> workspaces_;
  std::unordered_map<AlgoKey, CachedAlgo, GemmKeyHash> algos_;
};

// ---- problem description

/// The largest power of two (up to 256) dividing the address: what cuBLASLt may assume about it.
uint32_t alignment_of(const void* ptr) {
  if (ptr == nullptr) return kMaxAlignment;
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  uint32_t alignment = 1;
  while (alignment < kMaxAlignment && address % (2 * alignment) == 0) alignment *= 2;
  return alignment;
}

/// One input as cuBLASLt reads it: a stored column-major [rows, cols] matrix with leading
/// dimension ld, transposed or not, and the element stride between batch entries.
struct MatrixOperand {
  const void* data = nullptr;
  bool transpose = false;
  int64_t rows = 0, cols = 0, ld = 0;
  int64_t batch_stride = 0;
};

/// How cuBLASLt reads the transpose of a row-major [rows, cols] matrix with element strides
/// (row_stride, col_stride), or nothing when neither dimension has unit stride. The stride of a
/// size-1 dimension is never used, so it is chosen to suit cuBLASLt (views from unsqueeze or
/// expand often carry odd ones there).
std::optional<MatrixOperand> describe_transposed(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  {  // unit stride along columns: the transpose is a column-major [cols, rows], ld = row stride
    const int64_t rs = rows == 1 ? std::max<int64_t>(cols, 1) : row_stride;
    const int64_t cs = cols == 1 ? 1 : col_stride;
    if (cs == 1 && rs >= std::max<int64_t>(cols, 1)) return MatrixOperand{nullptr, false, cols, rows, rs, 0};
  }
  {  // unit stride along rows: a column-major [rows, cols] read transposed, ld = column stride
    const int64_t rs = rows == 1 ? 1 : row_stride;
    const int64_t cs = cols == 1 ? std::max<int64_t>(rows, 1) : col_stride;
    if (rs == 1 && cs >= std::max<int64_t>(rows, 1)) return MatrixOperand{nullptr, true, rows, cols, cs, 0};
  }
  return std::nullopt;
}

bool describable(const Tensor& t) {
  const int64_t r = t.dim();
  return describe_transposed(t.size(r - 2), t.size(r - 1), t.stride(r - 2), t.stride(r - 1)).has_value();
}

/// The operand of a [..., rows, cols] tensor t whose matrix starts `element_offset` elements past
/// t's first element; t must be describable.
MatrixOperand operand_of(const Tensor& t, int64_t element_offset, int64_t batch_stride) {
  const int64_t r = t.dim();
  MatrixOperand op = *describe_transposed(t.size(r - 2), t.size(r - 1), t.stride(r - 2), t.stride(r - 1));
  op.data = static_cast<const char*>(t.raw_data()) + element_offset * static_cast<int64_t>(t.element_size());
  op.batch_stride = batch_stride;
  return op;
}

/// D [m, n] (column-major, leading dimension ldd) = epilogue(op(A) [m, k] op(B) [k, n]) + beta D,
/// for batch_count matrices at the given strides.
struct GemmProblem {
  cudaDataType_t data_type = CUDA_R_32F;
  cublasComputeType_t compute_type = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale_type = CUDA_R_32F;
  MatrixOperand a, b;
  void* d = nullptr;
  int64_t m = 0, n = 0, k = 0, ldd = 0, d_batch_stride = 0;
  int64_t batch_count = 1;
  double beta = 0.0;
  /// C when it is not D (same layout as D), read with beta; null: C = D.
  const void* c = nullptr;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;  // bias (read) or bias gradient (written)
  void* aux = nullptr;   // GELU pre-activation (written by GELU_AUX*, read by DGELU*)
  int64_t aux_ld = 0;
};

struct TypeConfig {
  cudaDataType_t data_type;
  cublasComputeType_t compute_type;
  cudaDataType_t scale_type;
};

/// f16/bf16 accumulate in f32; f32 uses TF32 tensor cores unless the user asked for full f32
/// (ops::set_float32_matmul_precision); f64 stays f64 so that tests can compare tightly.
TypeConfig type_config(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return {CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::bf16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::f32:
      return {CUDA_R_32F,
              float32_matmul_precision() == Float32MatmulPrecision::high ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                         : CUBLAS_COMPUTE_32F,
              CUDA_R_32F};
    case DType::f64:
      return {CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
    default:
      break;
  }
  COLOSSAL_FAIL("matmul: cuBLASLt handles f32, f64, f16 and bf16, got {}", dtype);
}

AlgoKey key_of(int device, const GemmProblem& p) {
  return {device,
          p.data_type,
          p.compute_type,
          static_cast<int64_t>(p.epilogue),
          p.a.transpose,
          p.b.transpose,
          p.m,
          p.n,
          p.k,
          p.a.ld,
          p.b.ld,
          p.ldd,
          p.batch_count,
          p.a.batch_stride,
          p.b.batch_stride,
          p.d_batch_stride,
          p.aux_ld,
          alignment_of(p.a.data),
          alignment_of(p.b.data),
          std::min(alignment_of(p.d), alignment_of(p.c != nullptr ? p.c : p.d)),
          alignment_of(p.bias),
          alignment_of(p.aux),
          p.a.rows,
          p.b.rows};
}

void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const void* value, size_t size) {
  COLOSSAL_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, value, size));
}

void init_layout(cublasLtMatrixLayout_t layout, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                 int64_t batch_count, int64_t batch_stride) {
  COLOSSAL_CUBLASLT_CHECK(
      cublasLtMatrixLayoutInit(layout, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  if (batch_count > 1) {
    const int32_t count = static_cast<int32_t>(batch_count);
    COLOSSAL_CUBLASLT_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    COLOSSAL_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                             &batch_stride, sizeof(batch_stride)));
  }
}

/// The heuristic's algorithms for the problem, best first (at most `count`), or none.
std::vector<cublasLtMatmulHeuristicResult_t> heuristic_algos(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                             cublasLtMatrixLayout_t a_layout,
                                                             cublasLtMatrixLayout_t b_layout,
                                                             cublasLtMatrixLayout_t d_layout, const GemmProblem& p,
                                                             int count) {
  cublasLtMatmulPreferenceOpaque_t preference_storage;
  const cublasLtMatmulPreference_t preference = &preference_storage;
  COLOSSAL_CUBLASLT_CHECK(cublasLtMatmulPreferenceInit(preference));
  const uint64_t workspace_bytes = kWorkspaceBytes;
  COLOSSAL_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &workspace_bytes, sizeof(workspace_bytes)));
  // Split-K partial sums stay in the compute type: reducing them in bf16/f16 (the OUTPUT_TYPE and
  // INPLACE schemes) would round every partial sum and break the f32-accumulation contract.
  const uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  COLOSSAL_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                               &reduction_mask, sizeof(reduction_mask)));
  // The heuristic assumes 256-byte aligned pointers unless told otherwise; views with offsets
  // (narrow, select, batch entries) are less aligned. Fresh tensors are told 256, so no kernel is
  // excluded for them.
  const std::array<std::pair<cublasLtMatmulPreferenceAttributes_t, const void*>, 4> alignments = {
      {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.a.data},
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.b.data},
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.c != nullptr ? p.c : p.d},
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.d}}};
  for (const auto& [attribute, ptr] : alignments) {
    const uint32_t alignment = alignment_of(ptr);
    COLOSSAL_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof(alignment)));
  }
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(count));
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, desc, a_layout, b_layout, d_layout, d_layout,
                                                               preference, count, results.data(), &found);
  if (status != CUBLAS_STATUS_SUCCESS) {
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) COLOSSAL_CUBLASLT_CHECK(status);
    found = 0;
  }
  results.resize(static_cast<size_t>(std::clamp(found, 0, count)));
  std::erase_if(results, [](const cublasLtMatmulHeuristicResult_t& r) { return r.state != CUBLAS_STATUS_SUCCESS; });
  return results;
}

/// COLOSSAL_GEMM_AUTOTUNE=0 turns autotuning off. Read at each decision rather than once, so that
/// a process (a test) may switch it; that happens only for problems not settled yet.
bool autotune_enabled() {
  const char* value = std::getenv("COLOSSAL_GEMM_AUTOTUNE");
  return value == nullptr || std::string_view(value) != "0";
}

/// Whether the stream is being captured into a CUDA graph, where nothing may synchronize.
bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    // The legacy stream while another stream captures: as good as capturing. Clear the error.
    cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

/// Sets this thread's stream-capture mode to relaxed for a scope (what PyTorch does around
/// cudaMalloc), so a global-mode capture elsewhere does not forbid our event synchronization.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { COLOSSAL_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&previous_)); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&previous_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
};

/// One prepared cublasLtMatmul: everything but the algorithm, beta, C and the output D (C has D's
/// layout).
struct MatmulLaunch {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a_layout, b_layout, d_layout;
  const void* a;
  const void* b;
  const void* alpha;
  void* workspace;
  cudaStream_t stream;

  cublasStatus_t operator()(const cublasLtMatmulAlgo_t& algo, const void* beta, const void* c, void* d) const {
    return cublasLtMatmul(handle, desc, alpha, a, a_layout, b, b_layout, beta, c, d_layout, d, d_layout, &algo,
                          workspace, kWorkspaceBytes, stream);
  }
};

/// Whether cuBLASLt runs `algo` on the launch's problem within our workspace (an algorithm read
/// from the tuning file, Note [GEMM tuning file]).
bool algo_fits(const MatmulLaunch& launch, const cublasLtMatmulAlgo_t& algo) {
  cublasLtMatmulHeuristicResult_t result{};
  return cublasLtMatmulAlgoCheck(launch.handle, launch.desc, launch.a_layout, launch.b_layout, launch.d_layout,
                                 launch.d_layout, &algo, &result) == CUBLAS_STATUS_SUCCESS &&
         result.workspaceSize <= kWorkspaceBytes;
}

/// The fastest of the candidates (at least one) on the launch's operands, writing into `d` with
/// beta = `zero` (the scale type's 0); see Note [GEMM autotuning]. Waits for the stream.
cublasLtMatmulAlgo_t fastest_algo(const MatmulLaunch& launch, const void* zero, void* d, Device device,
                                  const std::vector<cublasLtMatmulHeuristicResult_t>& candidates) {
  const core::Stream stream{device, launch.stream};
  const RelaxedCaptureMode relaxed;
  // Warm-ups: a candidate that cannot run is left out of the rounds.
  std::vector<size_t> runnable;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (launch(candidates[i].algo, zero, d, d) == CUBLAS_STATUS_SUCCESS) runnable.push_back(i);
  }
  // marks[r][j], marks[r][j + 1]: round r's events around runnable[j]'s run (a failed run marks
  // its candidate out).
  std::vector<bool> failed(runnable.size(), false);
  std::vector<std::vector<core::cuda::Event>> marks(kAutotuneRounds);
  for (auto& round : marks) {
    round.reserve(runnable.size() + 1);
    round.emplace_back(true).record(stream);
    for (size_t j = 0; j < runnable.size(); ++j) {
      if (launch(candidates[runnable[j]].algo, zero, d, d) != CUBLAS_STATUS_SUCCESS) failed[j] = true;
      round.emplace_back(true).record(stream);
    }
  }
  size_t best = 0;
  float best_ms = 0;
  bool any = false;
  if (!runnable.empty()) marks.back().back().synchronize();
  for (size_t j = 0; j < runnable.size(); ++j) {
    if (failed[j]) continue;
    std::array<float, kAutotuneRounds> times{};
    for (int r = 0; r < kAutotuneRounds; ++r) times[r] = marks[r][j].elapsed_ms(marks[r][j + 1]);
    std::sort(times.begin(), times.end());
    const float median = times[kAutotuneRounds / 2];
    if (!any || median < best_ms) {  // ties keep the heuristic's order
      best = runnable[j];
      best_ms = median;
      any = true;
    }
  }
  return candidates[best].algo;  // the heuristic's first when nothing ran: the real call reports why
}

/// Runs one cuBLASLt matmul. Returns false, having launched nothing, when cuBLASLt has no
/// algorithm for the problem.
bool run_gemm(Device device, const GemmProblem& p) {
  CublasLtState& state = CublasLtState::instance();
  const cudaStream_t stream = static_cast<cudaStream_t>(core::cuda::current_stream(device).handle);
  const cublasLtHandle_t handle = state.handle(device.index);

  // Descriptors live on the stack (the *Init functions fill caller-owned storage): no allocations.
  cublasLtMatmulDescOpaque_t desc_storage;
  const cublasLtMatmulDesc_t desc = &desc_storage;
  COLOSSAL_CUBLASLT_CHECK(cublasLtMatmulDescInit(desc, p.compute_type, p.scale_type));
  const int32_t trans_a = p.a.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t trans_b = p.b.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a));
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b));
  if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof(p.epilogue));
    if (p.bias != nullptr) {
      const int32_t bias_type = p.data_type;  // our bias and bias gradient have the output's dtype
      set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
      set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias));
    }
    if (p.aux != nullptr) {
      set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p.aux, sizeof(p.aux));
      set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &p.aux_ld, sizeof(p.aux_ld));
    }
  }

  // Default order CUBLASLT_ORDER_COL: see Note [Row-major GEMM on column-major cuBLASLt].
  cublasLtMatrixLayoutOpaque_t a_storage, b_storage, d_storage;
  const cublasLtMatrixLayout_t a_layout = &a_storage, b_layout = &b_storage, d_layout = &d_storage;
  init_layout(a_layout, p.data_type, p.a.rows, p.a.cols, p.a.ld, p.batch_count, p.a.batch_stride);
  init_layout(b_layout, p.data_type, p.b.rows, p.b.cols, p.b.ld, p.batch_count, p.b.batch_stride);
  init_layout(d_layout, p.data_type, p.m, p.n, p.ldd, p.batch_count, p.d_batch_stride);

  // alpha and beta have the scale type: double for f64, float otherwise.
  const double alpha_f64 = 1.0, beta_f64 = p.beta, zero_f64 = 0.0;
  const float alpha_f32 = 1.0f, beta_f32 = static_cast<float>(p.beta), zero_f32 = 0.0f;
  const bool f64_scale = p.scale_type == CUDA_R_64F;
  const void* alpha = f64_scale ? static_cast<const void*>(&alpha_f64) : static_cast<const void*>(&alpha_f32);
  const void* beta = f64_scale ? static_cast<const void*>(&beta_f64) : static_cast<const void*>(&beta_f32);
  const void* zero = f64_scale ? static_cast<const void*>(&zero_f64) : static_cast<const void*>(&zero_f32);
  const MatmulLaunch launch{
      handle, desc, a_layout, b_layout, d_layout, p.a.data, p.b.data, alpha, state.workspace(device.index, stream),
      stream};

  // See Note [GEMM autotuning].
  const AlgoKey key = key_of(device.index, p);
  CachedAlgo cached;
  const bool known = state.find_algo(key, &cached);
  if (!known || !cached.settled) {
    const double flops = 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k) *
                         static_cast<double>(p.batch_count);
    const bool worth_tuning = flops >= kAutotuneMinFlops;
    const bool tune_now = worth_tuning && autotune_enabled() && !is_capturing(stream);
    // A problem another process tuned: its choice from the tuning file (Note [GEMM tuning file]),
    // where the library still takes it for this problem.
    std::optional<cublasLtMatmulAlgo_t> filed;
    if (worth_tuning && autotune_enabled()) filed = state.find_tuned(device.index, key);
    if (filed && !algo_fits(launch, *filed)) filed.reset();
    if (filed) {
      gemm_tuning_file_counter.fetch_add(1, std::memory_order_relaxed);
      cached = {filed, true};
      state.remember_algo(key, cached);
    } else if (!known || tune_now) {
      const std::vector<cublasLtMatmulHeuristicResult_t> candidates =
          heuristic_algos(handle, desc, a_layout, b_layout, d_layout, p, worth_tuning ? kAutotuneCandidates : 1);
      cached.algo = candidates.empty() ? std::nullopt : std::optional(candidates.front().algo);
      cached.settled = candidates.size() <= 1;
      if (!cached.settled && tune_now) {
        if (p.beta == 0.0) {
          cached.algo = fastest_algo(launch, zero, p.d, device, candidates);
        } else {  // the real call accumulates into d: time into scratch of d's extent instead
          const int64_t extent = (p.batch_count - 1) * p.d_batch_stride + (p.n - 1) * p.ldd + p.m;
          const int64_t element_bytes = p.data_type == CUDA_R_64F ? 8 : p.data_type == CUDA_R_32F ? 4 : 2;
          const Tensor scratch = core::empty({extent * element_bytes}, TensorOptions(DType::u8, device));
          cached.algo = fastest_algo(launch, zero, scratch.raw_data(), device, candidates);
        }
        cached.settled = true;
        gemm_autotune_counter.fetch_add(1, std::memory_order_relaxed);
        state.record_tuned(device.index, key, *cached.algo);
      }
      state.remember_algo(key, cached);
    }
  }
  if (!cached.algo) return false;
  COLOSSAL_CUBLASLT_CHECK(launch(*cached.algo, beta, p.c != nullptr ? p.c : p.d, p.d));
  return true;
}

// ---- operand checks

/// Every operand must be a CUDA tensor on out's device, with out's dtype.
void check_operands(const char* op, const Tensor& out,
                    std::initializer_list<std::pair<const char*, const Tensor*>> operands) {
  COLOSSAL_CHECK(out.device().is_cuda(), "{} (cuBLASLt): output {} is on {}, expected a CUDA tensor", op, out.shape(),
                 out.device());
  for (const auto& [name, t] : operands) {
    COLOSSAL_CHECK(t->device() == out.device(),
                   "{} (cuBLASLt): {} {} is on {} but the output {} is on {}; move every operand to the same GPU", op,
                   name, t->shape(), t->device(), out.shape(), out.device());
    COLOSSAL_CHECK(t->dtype() == out.dtype(), "{} (cuBLASLt): {} is {} but the output is {}", op, name, t->dtype(),
                   out.dtype());
  }
}

/// cuBLASLt takes 32-bit sizes and leading dimensions in practice (see CUBLASLT_MATRIX_LAYOUT_ROWS).
void check_int32_sizes(const char* op, const GemmProblem& p) {
  constexpr int64_t kLimit = INT32_MAX;
  for (int64_t v : {p.m, p.n, p.k, p.a.ld, p.b.ld, p.ldd, p.aux_ld, p.batch_count}) {
    COLOSSAL_CHECK(v <= kLimit, "{} (cuBLASLt): a size or leading dimension of {} exceeds 2^31 - 1 (M {}, N {}, K {})",
                   op, v, p.n, p.m, p.k);
  }
}

// ---- kernels

/// A batch dimension of the product with the element strides of a, b and out along it.
struct BatchDim {
  int64_t size, a, b, out;
};

/// Batch dimensions of size > 1, with neighbours merged wherever all three operands step through
/// them as through one dimension (broadcast operands with stride 0 included). The largest comes
/// first: it becomes cuBLASLt's strided batch, and the caller loops over the others.
std::vector<BatchDim> merged_batch_dims(const Tensor& out, const Tensor& a, const Tensor& b) {
  std::vector<BatchDim> merged;
  for (int64_t d = out.dim() - 3; d >= 0; --d) {
    const BatchDim dim{out.size(d), a.stride(d), b.stride(d), out.stride(d)};
    if (dim.size == 1) continue;
    if (!merged.empty()) {
      BatchDim& inner = merged.back();
      if (dim.a == inner.a * inner.size && dim.b == inner.b * inner.size && dim.out == inner.out * inner.size) {
        inner.size *= dim.size;
        continue;
      }
    }
    merged.push_back(dim);
  }
  const auto largest = std::max_element(merged.begin(), merged.end(),
                                        [](const BatchDim& x, const BatchDim& y) { return x.size < y.size; });
  if (largest != merged.end()) std::iter_swap(merged.begin(), largest);
  return merged;
}

void batched_gemm_cuda(const Tensor& out, const Tensor& a_in, const Tensor& b_in, double beta) {
  check_operands("matmul", out, {{"a", &a_in}, {"b", &b_in}});
  COLOSSAL_CHECK(out.is_contiguous(), "matmul (cuBLASLt): the output {} must be contiguous", out.shape());
  const int64_t rank = out.dim();
  const int64_t m = out.size(rank - 2), n = out.size(rank - 1), k = a_in.size(rank - 1);
  if (out.numel() == 0) return;
  if (k == 0) {  // an empty sum
    if (beta == 0.0) out.zero_();
    return;
  }
  core::cuda::DeviceGuard guard(out.device());
  // Matrices with no unit stride in either dimension (a step along the last dimension) are packed;
  // everything else, transposed views and broadcast batches included, is read in place.
  const Tensor a = describable(a_in) ? a_in : core::contiguous_raw(a_in);
  const Tensor b = describable(b_in) ? b_in : core::contiguous_raw(b_in);

  const std::vector<BatchDim> batch = merged_batch_dims(out, a, b);
  const BatchDim inner = batch.empty() ? BatchDim{1, 0, 0, 0} : batch.front();
  const TypeConfig types = type_config(out.dtype());
  int64_t outer_count = 1;
  for (size_t i = 1; i < batch.size(); ++i) outer_count *= batch[i].size;

  // The outer batch dimensions that did not merge are walked here, one strided-batch call each.
  std::vector<int64_t> index(batch.size(), 0);
  for (int64_t call = 0; call < outer_count; ++call) {
    int64_t a_offset = 0, b_offset = 0, out_offset = 0;
    for (size_t i = 1; i < batch.size(); ++i) {
      a_offset += index[i] * batch[i].a;
      b_offset += index[i] * batch[i].b;
      out_offset += index[i] * batch[i].out;
    }
    GemmProblem p;
    p.data_type = types.data_type;
    p.compute_type = types.compute_type;
    p.scale_type = types.scale_type;
    p.a = operand_of(b, b_offset, inner.b);  // cuBLAS's A is our b; see the Note
    p.b = operand_of(a, a_offset, inner.a);
    p.d = static_cast<char*>(out.raw_data()) + out_offset * static_cast<int64_t>(out.element_size());
    p.m = n;
    p.n = m;
    p.k = k;
    p.ldd = n;
    p.d_batch_stride = inner.out;
    p.batch_count = inner.size;
    p.beta = beta;
    check_int32_sizes("matmul", p);
    COLOSSAL_CHECK(run_gemm(out.device(), p),
                   "matmul (cuBLASLt): no algorithm for {} a {} (strides {}) @ b {} (strides {}) on {}; make the "
                   "operands contiguous",
                   out.dtype(), a.shape(), a.strides(), b.shape(), b.strides(), out.device());
    for (size_t i = 1; i < batch.size() && ++index[i] == batch[i].size; ++i) index[i] = 0;
  }
}

bool fused_gemm_cuda(const Tensor& out, const Tensor& a_in, const Tensor& b_in, const GemmEpilogue& epilogue) {
  check_operands("linear", out, {{"a", &a_in}, {"b", &b_in}});
  const bool forward = epilogue.bias.defined() || epilogue.addend.defined() || epilogue.gelu_tanh;
  const bool gelu_backward = epilogue.gelu_grad_pre_activation.defined();
  const bool b_sums = epilogue.bias_grad_of_b.defined();
  const bool backward = gelu_backward || epilogue.bias_grad.defined() || b_sums;
  if (forward && (backward || epilogue.accumulate)) return false;  // no cuBLASLt epilogue does both
  if (!forward && !backward) return false;
  if (b_sums && (gelu_backward || epilogue.bias_grad.defined())) return false;  // one bias gradient an epilogue
  if (out.dim() != 2 || a_in.dim() != 2 || b_in.dim() != 2 || !out.is_contiguous()) return false;
  // f64 is the dtype of reference comparisons, and cuBLASLt does not document how its GELU is
  // computed; the composite's f64 tanh-GELU is exact to rounding.
  if ((epilogue.gelu_tanh || gelu_backward) && out.dtype() == DType::f64) return false;
  const int64_t m = out.size(0), n = out.size(1), k = a_in.size(1);
  if (m == 0 || n == 0 || k == 0) return false;  // nothing worth fusing; the composite handles it
  if (epilogue.bias.defined()) check_operands("linear", out, {{"bias", &epilogue.bias}});
  if (epilogue.addend.defined()) {
    check_operands("linear", out, {{"addend", &epilogue.addend}});
    COLOSSAL_CHECK(epilogue.addend.shape() == out.shape(), "linear (cuBLASLt): the addend {} must match the output {}",
                   epilogue.addend.shape(), out.shape());
    // cuBLASLt reads C with D's layout; GELU would apply to the sum with C, not what gelu_tanh means.
    if (!epilogue.addend.is_contiguous() || epilogue.gelu_tanh) return false;
    COLOSSAL_CHECK(epilogue.addend.raw_data() != out.raw_data(),
                   "linear (cuBLASLt): the addend must not be the output {}; accumulate with beta instead",
                   out.shape());
  }
  if (b_sums) {
    check_operands("linear", out, {{"bias gradient", &epilogue.bias_grad_of_b}});
    COLOSSAL_CHECK(epilogue.bias_grad_of_b.numel() == n,
                   "linear (cuBLASLt): the bias gradient {} must have {} elements for the output {}",
                   epilogue.bias_grad_of_b.shape(), n, out.shape());
    if (!epilogue.bias_grad_of_b.is_contiguous()) return false;
  }
  if (epilogue.bias_grad.defined()) {
    check_operands("linear", out, {{"bias gradient", &epilogue.bias_grad}});
    // BGRADB reduces a's rows, DGELU_BGRAD the output's columns (see GemmEpilogue::bias_grad).
    const int64_t expected = gelu_backward ? n : m;
    COLOSSAL_CHECK(epilogue.bias_grad.numel() == expected,
                   "linear (cuBLASLt): the bias gradient {} must have {} elements for the output {}",
                   epilogue.bias_grad.shape(), expected, out.shape());
  }
  // The epilogues read and write the bias vector with unit stride.
  if (epilogue.bias_grad.defined() && !epilogue.bias_grad.is_contiguous()) return false;
  if (gelu_backward) {
    const Tensor& aux = epilogue.gelu_grad_pre_activation;
    check_operands("linear", out, {{"GELU pre-activation", &aux}});
    COLOSSAL_CHECK(aux.dim() == 2 && aux.size(0) == m && aux.size(1) == n,
                   "linear (cuBLASLt): the GELU pre-activation {} must match the output {}", aux.shape(), out.shape());
    // cuBLASLt reads it as a column-major [n, m] with a leading dimension divisible by 8: the layout
    // the forward's CUBLASLT_EPILOGUE_GELU_AUX_BIAS wrote. Anything else goes to the composite.
    if (aux.stride(1) != 1 || aux.stride(0) % 8 != 0 || aux.stride(0) < n) return false;
  }

  core::cuda::DeviceGuard guard(out.device());
  const Tensor a = describable(a_in) ? a_in : core::contiguous_raw(a_in);
  const Tensor b = describable(b_in) ? b_in : core::contiguous_raw(b_in);
  const Tensor bias = epilogue.bias.defined() ? core::contiguous_raw(epilogue.bias) : Tensor();
  const TypeConfig types = type_config(out.dtype());

  GemmProblem p;
  p.data_type = types.data_type;
  p.compute_type = types.compute_type;
  p.scale_type = types.scale_type;
  p.a = operand_of(b, 0, 0);
  p.b = operand_of(a, 0, 0);
  p.d = out.raw_data();
  p.m = n;
  p.n = m;
  p.k = k;
  p.ldd = n;
  if (epilogue.addend.defined()) {  // C [n, m] column-major is the addend, as D is our out
    p.c = epilogue.addend.raw_data();
    p.beta = 1.0;
  }
  if (epilogue.accumulate) p.beta = 1.0;  // C = D

  Tensor aux;  // the pre-activation's storage, [M, round_up(N, 8)]
  if (gelu_backward) {
    // D [n, m] column-major is our out^T, so D's rows are our columns: the bias gradient of
    // DGELU_BGRAD (one per row of D, summed along D's columns) is the sum over our rows.
    p.epilogue = epilogue.bias_grad.defined() ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    if (epilogue.bias_grad.defined()) p.bias = epilogue.bias_grad.raw_data();
    p.aux = epilogue.gelu_grad_pre_activation.raw_data();  // read, not written, by the D* epilogues
    p.aux_ld = epilogue.gelu_grad_pre_activation.stride(0);
  } else if (b_sums) {
    // cuBLAS's A is our b, [n, k] column-major: BGRADA sums it over k, one value per row of D, our
    // columns.
    p.epilogue = CUBLASLT_EPILOGUE_BGRADA;
    p.bias = epilogue.bias_grad_of_b.raw_data();
  } else if (!forward) {
    p.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    p.bias = epilogue.bias_grad.raw_data();
  } else if (!epilogue.gelu_tanh) {
    if (bias.defined()) {  // else the default epilogue: the product plus the addend
      p.epilogue = CUBLASLT_EPILOGUE_BIAS;
      p.bias = bias.raw_data();
    }
  } else {
    const bool keep = epilogue.pre_activation != nullptr;
    if (bias.defined()) {
      p.epilogue = keep ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
      p.bias = bias.raw_data();
    } else {
      p.epilogue = keep ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU;
    }
    if (keep) {
      // cuBLASLt wants the auxiliary leading dimension divisible by 8; pad the rows when N is not.
      p.aux_ld = (n + 7) / 8 * 8;
      aux = core::empty({m, p.aux_ld}, TensorOptions(out.dtype(), out.device()));
      p.aux = aux.raw_data();
    }
  }
  check_int32_sizes("linear", p);
  if (!run_gemm(out.device(), p)) return false;
  if (aux.defined()) *epilogue.pre_activation = p.aux_ld == n ? aux : core::narrow_raw(aux, 1, 0, n);
  return true;
}

COLOSSAL_REGISTER_KERNEL(batched_gemm_stub, core::DeviceType::cuda, batched_gemm_cuda);
COLOSSAL_REGISTER_KERNEL(fused_gemm_stub, core::DeviceType::cuda, fused_gemm_cuda);

}  // namespace
}  // namespace colossal::ops
