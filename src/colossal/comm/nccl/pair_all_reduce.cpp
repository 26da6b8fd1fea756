// PairAllReduce: see pair_all_reduce.h.
#include "colossal/comm/nccl/pair_all_reduce.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "colossal/comm/nccl/pair_reduce.h"
#include "colossal/core/cuda/cuda_check.h"
#include "colossal/core/cuda_device.h"  // DeviceGuard
#include "colossal/core/error.h"
#include "colossal/core/tensor.h"

namespace colossal::comm {

// Note [Pair all-reduce by the copy engines]
// NCCL's kernels hold SMs while they run, and the GEMMs beside them lose a third to a half of their
// speed (bench/nccl_overlap_bench, session 17). Between two GPUs of one host the copy engines can move
// the data instead: each rank has a PairWindow of two halves, A and B, mapped into the other's
// process. For the g-th piece (a tensor larger than the window goes in pieces), split at a multiple of
// 8 elements into half 0 (rank 0's) and half 1 (rank 1's), each rank, on one stream:
//   1. copies its values of the other's half into the other's A and raises the other's counter
//      arrived_A to g;
//   2. waits for its own arrived_A >= g and adds A into its half (pair_reduce: a few SMs);
//   3. writes its summed half into the other's B (the adding kernel's stores, over NVLink) and
//      raises the other's arrived_B to g;
//   4. waits for its own arrived_B >= g and copies B into its other half.
// Every element is summed once, on the rank that owns it, and copied to the other: both ranks hold
// the same bits, NCCL's a + b rounded to the dtype. The window is reused without "free" counters
// because each rank runs its pieces one after another on one stream: a rank writes the other's A for
// piece g only after its piece g - 1 waited for arrived_B(g - 1), which the other raised after adding
// its A of g - 1; it writes the other's B for piece g only after arrived_A(g), which the other raised
// after its piece g - 1 had copied its B out. The counters are the driver's stream memory operations
// (no kernel spins; a stream waiting on one holds no SM); a rank whose peer never raises one holds
// the group's stream until the watchdog ends it at the group's timeout, as it would a hung NCCL call.
// Who moves the data (by_kernel_): a copy engine moves a 16 MiB half at about 170 GB/s, the adding
// kernel's own stores over NVLink much faster, so the sums go by the kernel and the other copies by the
// copy engines. Measured on 2 H100s (session 21, docs/benchmarks.md): bf16 all-reduce of 32 MiB in 130
// us against NCCL's 146 (copy engines for all three copies: 218 us); GPT 1.3B at tp=2 (tp_mfu.sh) 81.6-81.8
// ms a step against 86.5 with NCCL in the same call, GPT-2 350M 32.2 against 37.1 (session 22, with
// the residual in the row layers' GEMMs too: 79.0-80.6 against 86.8-87.1, and 31.6 against 36.3). So
// `colossal train` sums the tensor group's large tensors this way wherever it can
// (parallel.tensor.all_reduce = "auto"). The windows are never freed: Note [Pair window teardown] in
// pair_window.cpp.

namespace {

enum Counter : size_t { kArrivedA = 0, kArrivedB = 1, kCounters = 2 };
/// The halves split at a multiple of this many elements, so the adding kernel reads 16-byte vectors.
constexpr int64_t kSplitAlign = 8;
/// Each half of a window of `window_bytes`: half of it and the split's slack (kSplitAlign elements of
/// up to 8 bytes), in 256-byte units, so that a tensor of window_bytes goes in one piece.
int64_t half_of(int64_t window_bytes) {
  COLOSSAL_CHECK(window_bytes >= 4096, "PairAllReduce: a window of {} bytes; it needs at least 4096", window_bytes);
  return (window_bytes / 2 + kSplitAlign * 8 + 255) / 256 * 256;
}

}  // namespace

PairAllReduce::PairAllReduce(ProcessGroup& group, int64_t window_bytes, int64_t min_bytes)
    : window_(group, static_cast<size_t>(2 * half_of(window_bytes)), kCounters),
      rank_(group.rank()),
      half_bytes_(half_of(window_bytes)),
      min_bytes_(min_bytes) {
  // Measurement switches: COLOSSAL_PAIR_MODE (by_kernel_), COLOSSAL_PAIR_BLOCKS (the
  // kernels' most blocks).
  if (const char* mode = std::getenv("COLOSSAL_PAIR_MODE"); mode != nullptr && *mode != '\0') {
    const std::string_view m(mode);
    const std::string_view named = m == "copy_engines" ? "ccc" : m == "push" ? "csc" : m;
    COLOSSAL_CHECK(named.size() == 3 && named.find_first_not_of("cs") == std::string_view::npos,
                   "COLOSSAL_PAIR_MODE must be copy_engines, push or three letters c (a copy engine) or s (the SMs) "
                   "for the first copy, the sums' copy and the last copy, got '{}'",
                   m);
    // Both orders with the first copy by the SMs that were run ("sss", "scc") hung on 2 H100s
    // (sessions 21 and 22: a test's back-to-back sums stopped); csc, ccs and ccc passed every run.
    COLOSSAL_CHECK(named[0] == 'c',
                   "COLOSSAL_PAIR_MODE '{}': the first copy by the SMs hung in the tests on 2 H100s (sessions 21 "
                   "and 22); use c for it (csc, the default, ccs or ccc)",
                   m);
    by_kernel_ = {named[0] == 's', named[1] == 's', named[2] == 's'};
  }
  trace_ = std::getenv("COLOSSAL_TRACE_COMM") != nullptr && *std::getenv("COLOSSAL_TRACE_COMM") != '\0';
  if (const char* blocks = std::getenv("COLOSSAL_PAIR_BLOCKS"); blocks != nullptr && *blocks != '\0') {
    char* end = nullptr;
    const long value = std::strtol(blocks, &end, 10);
    COLOSSAL_CHECK(end != blocks && *end == '\0' && value >= 1 && value <= 4096,
                   "COLOSSAL_PAIR_BLOCKS must be a whole number of blocks from 1 to 4096, got '{}'", blocks);
    blocks_ = static_cast<int>(value);
  }
}

bool PairAllReduce::takes(const Tensor& tensor, ReduceOp op) const {
  const DType d = tensor.dtype();
  return op == ReduceOp::sum && (d == DType::f32 || d == DType::bf16 || d == DType::f16) && tensor.is_contiguous() &&
         static_cast<int64_t>(tensor.nbytes()) >= min_bytes_;
}

void PairAllReduce::copy(void* dst, const void* src, int64_t bytes, cudaStream_t s, bool by_kernel) const {
  if (bytes == 0) return;
  const bool aligned =
      bytes % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
  if (by_kernel && aligned) {
    cuda_detail::pair_copy(dst, src, bytes, s, blocks_);
  } else {
    COLOSSAL_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, s));
  }
}

void PairAllReduce::enqueue(const Tensor& tensor, core::Stream stream) {
  core::cuda::DeviceGuard guard(window_.device());
  const cudaStream_t s = static_cast<cudaStream_t>(stream.handle);
  const int64_t element = static_cast<int64_t>(core::element_size(tensor.dtype()));
  // A piece's halves are at most piece / 2 + kSplitAlign elements: each fits a half of the window.
  const int64_t piece = 2 * (half_bytes_ / element - kSplitAlign);
  char* const data = static_cast<char*>(tensor.raw_data());
  char* const a_mine = window_.mine();
  char* const b_mine = window_.mine() + half_bytes_;
  char* const a_other = window_.other();
  char* const b_other = window_.other() + half_bytes_;
  const int64_t n = tensor.numel();
  for (int64_t begin = 0; begin < n; begin += piece) {
    const int64_t len = std::min(piece, n - begin);
    char* const p = data + begin * element;
    const int64_t half0 = len / 2 / kSplitAlign * kSplitAlign;
    const int64_t mine_begin = rank_ == 0 ? 0 : half0, mine_numel = rank_ == 0 ? half0 : len - half0;
    const int64_t other_begin = rank_ == 0 ? half0 : 0, other_numel = len - mine_numel;
    const uint64_t g = ++generation_;
    auto trace = [&](const char* what) {
      if (trace_)
        std::fprintf(stderr, "[pair trace] rank %d piece %llu: %s\n", rank_, static_cast<unsigned long long>(g), what);
    };
    // 1. my values of the other's half into its A (a copy engine over NVLink, or the SMs' stores).
    trace("copy A");
    copy(a_other, p + other_begin * element, other_numel * element, s, by_kernel_[0]);
    window_.signal(stream, kArrivedA, g);
    // 2-3. the other's values of my half, arrived in my A, added into it; the sum also written into
    // the other's B, by the same kernel's stores over NVLink, or by a copy engine.
    window_.await(stream, kArrivedA, g);
    trace("add");
    cuda_detail::pair_reduce(p + mine_begin * element, a_mine, by_kernel_[1] ? b_other : nullptr, mine_numel,
                             tensor.dtype(), /*average=*/false, s, blocks_);
    if (!by_kernel_[1]) copy(b_other, p + mine_begin * element, mine_numel * element, s, /*by_kernel=*/false);
    window_.signal(stream, kArrivedB, g);
    // 4. its summed half, arrived in my B, into my other half.
    window_.await(stream, kArrivedB, g);
    trace("copy B");
    copy(p + other_begin * element, b_mine, other_numel * element, s, by_kernel_[2]);
    trace("enqueued");
  }
}

}  // namespace colossal::comm
