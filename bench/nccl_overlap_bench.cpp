// What an all-reduce costs beside compute, by how NCCL gets its buffers: plain cudaMalloc memory,
// the same registered with the communicator (ncclCommRegister: NCCL reads and writes the user
// buffers of its peers directly instead of staging through its own), and NCCL's symmetric windows
// (ncclMemAlloc memory registered with ncclCommWindowRegister and NCCL_WIN_COLL_SYMMETRIC, which the
// symmetric kernels of NCCL 2.27+ run on). One process drives every visible GPU (ncclCommInitAll
// style, one communicator per GPU in one group), so no launcher is needed.
//
// Per buffer mode and size it times, on every GPU at once:
//   - the all-reduce alone (bf16 sum, in place, back to back);
//   - a stream of bf16 GEMMs alone (cuBLAS, M = N = K = --gemm);
//   - both together, the all-reduces on a stream of their own issued for as long as the GEMMs run:
//     the GEMMs' slowdown and the all-reduce's time per call beside them.
// GPU 0's CUDA events give the times. The question it answers (issues 17 and 19): which buffers let
// an all-reduce take the least from the kernels it overlaps, and run fastest alone.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

/// Ends the program naming the failed call `expr` at file:line and the library's `why`.
void fail_unless(bool ok, const char* file, int line, const char* expr, const char* why) {
  if (ok) return;
  std::fprintf(stderr, "%s:%d: %s: %s\n", file, line, expr, why);
  std::exit(1);
}

#define CHECK_CUDA(expr)                                                                         \
  do {                                                                                           \
    const cudaError_t status_ = (expr);                                                          \
    fail_unless(status_ == cudaSuccess, __FILE__, __LINE__, #expr, cudaGetErrorString(status_)); \
  } while (0)
#define CHECK_NCCL(expr)                                                                         \
  do {                                                                                           \
    const ncclResult_t status_ = (expr);                                                         \
    fail_unless(status_ == ncclSuccess, __FILE__, __LINE__, #expr, ncclGetErrorString(status_)); \
  } while (0)
#define CHECK_CUBLAS(expr)                                                                                    \
  do {                                                                                                        \
    const cublasStatus_t status_ = (expr);                                                                    \
    fail_unless(status_ == CUBLAS_STATUS_SUCCESS, __FILE__, __LINE__, #expr, cublasGetStatusString(status_)); \
  } while (0)

enum class Mode { plain, registered, symmetric };

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::plain:
      return "plain";
    case Mode::registered:
      return "registered";
    case Mode::symmetric:
      return "symmetric";
  }
  return "?";
}

struct Device {
  int index = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t compute = nullptr;
  cudaStream_t comm_stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* a = nullptr;  // GEMM operands, bf16 [gemm, gemm]
  void* b = nullptr;
  void* c = nullptr;
};

struct Buffer {
  void* ptr = nullptr;
  void* handle = nullptr;         // ncclCommRegister's
  ncclWindow_t window = nullptr;  // ncclCommWindowRegister's
};

std::vector<int64_t> parse_list(const char* value) {
  std::vector<int64_t> out;
  std::string s(value);
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    out.push_back(std::stoll(s.substr(start, end - start)));
    start = end + 1;
  }
  return out;
}

void sync_all(std::vector<Device>& devices) {
  for (auto& dev : devices) {
    CHECK_CUDA(cudaSetDevice(dev.index));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
}

/// Allocates (and registers, per mode) one `bytes` buffer per device; registration is collective.
std::vector<Buffer> make_buffers(std::vector<Device>& devices, Mode mode, size_t bytes) {
  std::vector<Buffer> buffers(devices.size());
  for (size_t d = 0; d < devices.size(); ++d) {
    CHECK_CUDA(cudaSetDevice(devices[d].index));
    if (mode == Mode::symmetric) {
      CHECK_NCCL(ncclMemAlloc(&buffers[d].ptr, bytes));
    } else {
      CHECK_CUDA(cudaMalloc(&buffers[d].ptr, bytes));
    }
    CHECK_CUDA(cudaMemset(buffers[d].ptr, 0, bytes));
  }
  if (mode == Mode::plain) return buffers;
  CHECK_NCCL(ncclGroupStart());
  for (size_t d = 0; d < devices.size(); ++d) {
    CHECK_CUDA(cudaSetDevice(devices[d].index));
    if (mode == Mode::registered) {
      CHECK_NCCL(ncclCommRegister(devices[d].comm, buffers[d].ptr, bytes, &buffers[d].handle));
    } else {
      CHECK_NCCL(
          ncclCommWindowRegister(devices[d].comm, buffers[d].ptr, bytes, &buffers[d].window, NCCL_WIN_COLL_SYMMETRIC));
    }
  }
  CHECK_NCCL(ncclGroupEnd());
  return buffers;
}

void free_buffers(std::vector<Device>& devices, Mode mode, std::vector<Buffer>& buffers) {
  sync_all(devices);
  if (mode != Mode::plain) {
    CHECK_NCCL(ncclGroupStart());
    for (size_t d = 0; d < devices.size(); ++d) {
      CHECK_CUDA(cudaSetDevice(devices[d].index));
      if (mode == Mode::registered) CHECK_NCCL(ncclCommDeregister(devices[d].comm, buffers[d].handle));
      if (mode == Mode::symmetric) CHECK_NCCL(ncclCommWindowDeregister(devices[d].comm, buffers[d].window));
    }
    CHECK_NCCL(ncclGroupEnd());
  }
  for (size_t d = 0; d < devices.size(); ++d) {
    CHECK_CUDA(cudaSetDevice(devices[d].index));
    if (mode == Mode::symmetric) {
      CHECK_NCCL(ncclMemFree(buffers[d].ptr));
    } else {
      CHECK_CUDA(cudaFree(buffers[d].ptr));
    }
  }
}

/// `count` all-reduces (bf16 sum, in place) on every device's communication stream.
void all_reduces(std::vector<Device>& devices, std::vector<Buffer>& buffers, size_t elements, int count) {
  for (int i = 0; i < count; ++i) {
    CHECK_NCCL(ncclGroupStart());
    for (size_t d = 0; d < devices.size(); ++d) {
      CHECK_CUDA(cudaSetDevice(devices[d].index));
      CHECK_NCCL(ncclAllReduce(buffers[d].ptr, buffers[d].ptr, elements, ncclBfloat16, ncclSum, devices[d].comm,
                               devices[d].comm_stream));
    }
    CHECK_NCCL(ncclGroupEnd());
  }
}

/// `count` bf16 GEMMs of [n, n] x [n, n] on every device's compute stream.
void gemms(std::vector<Device>& devices, int n, int count) {
  const float alpha = 1.0f, beta = 0.0f;
  for (int i = 0; i < count; ++i) {
    for (auto& dev : devices) {
      CHECK_CUDA(cudaSetDevice(dev.index));
      CHECK_CUBLAS(cublasGemmEx(dev.blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, dev.a, CUDA_R_16BF, n, dev.b,
                                CUDA_R_16BF, n, &beta, dev.c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
}

/// Milliseconds between two events recorded on `stream` (GPU 0's) around `work`.
template <class Work>
float timed(Device& dev, cudaStream_t stream, Work&& work) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaSetDevice(dev.index));
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start, stream));
  work();
  CHECK_CUDA(cudaSetDevice(dev.index));
  CHECK_CUDA(cudaEventRecord(stop, stream));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes_mib{32, 77};
  int gemm_n = 4096, gemm_count = 100, iters = 30;
  std::vector<Mode> modes{Mode::plain, Mode::registered, Mode::symmetric};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "nccl_overlap_bench: %s needs a value\n", flag.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (flag == "--sizes-mib") {
      sizes_mib = parse_list(value());
    } else if (flag == "--gemm") {
      gemm_n = std::atoi(value());
    } else if (flag == "--gemms") {
      gemm_count = std::atoi(value());
    } else if (flag == "--iters") {
      iters = std::atoi(value());
    } else if (flag == "--modes") {
      const std::string list = value();
      modes.clear();
      if (list.find("plain") != std::string::npos) modes.push_back(Mode::plain);
      if (list.find("registered") != std::string::npos) modes.push_back(Mode::registered);
      if (list.find("symmetric") != std::string::npos) modes.push_back(Mode::symmetric);
    } else {
      std::fprintf(stderr,
                   "usage: nccl_overlap_bench [--sizes-mib 32,77] [--gemm 4096] [--gemms 100] [--iters 30]\n"
                   "                          [--modes plain,registered,symmetric]\n");
      return 2;
    }
  }
  int count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&count));
  if (count < 2) {
    std::fprintf(stderr, "nccl_overlap_bench: needs two or more GPUs, found %d\n", count);
    return 2;
  }
  int version = 0;
  ncclGetVersion(&version);
  std::printf("nccl_overlap_bench: %d GPUs, NCCL %d, GEMM %d^3 bf16 x %d, %d all-reduces per timing\n", count, version,
              gemm_n, gemm_count, iters);

  std::vector<Device> devices(count);
  std::vector<int> indices(count);
  for (int d = 0; d < count; ++d) devices[d].index = indices[d] = d;
  std::vector<ncclComm_t> comms(count);
  CHECK_NCCL(ncclCommInitAll(comms.data(), count, indices.data()));
  const size_t gemm_bytes = static_cast<size_t>(gemm_n) * gemm_n * 2;
  for (int d = 0; d < count; ++d) {
    Device& dev = devices[d];
    dev.comm = comms[d];
    CHECK_CUDA(cudaSetDevice(d));
    CHECK_CUDA(cudaStreamCreateWithFlags(&dev.compute, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamCreateWithFlags(&dev.comm_stream, cudaStreamNonBlocking));
    CHECK_CUBLAS(cublasCreate(&dev.blas));
    CHECK_CUBLAS(cublasSetStream(dev.blas, dev.compute));
    for (void** p : {&dev.a, &dev.b, &dev.c}) {
      CHECK_CUDA(cudaMalloc(p, gemm_bytes));
      CHECK_CUDA(cudaMemset(*p, 0, gemm_bytes));
    }
  }
  const double gemm_flops = 2.0 * gemm_n * gemm_n * static_cast<double>(gemm_n) * gemm_count;

  // GEMMs alone, once (they do not depend on the buffers).
  gemms(devices, gemm_n, 10);
  sync_all(devices);
  const float gemm_alone = timed(devices[0], devices[0].compute, [&] { gemms(devices, gemm_n, gemm_count); });
  sync_all(devices);
  std::printf("GEMMs alone: %.3f ms (%.0f TFLOP/s)\n", gemm_alone, gemm_flops / (gemm_alone * 1e-3) / 1e12);
  std::printf("%-11s %8s %14s %14s %14s %12s %14s\n", "buffers", "MiB", "AR alone us", "busbw GB/s", "AR beside us",
              "GEMM ms", "GEMM slowdown");
  for (const int64_t mib : sizes_mib) {
    const size_t bytes = static_cast<size_t>(mib) << 20;
    const size_t elements = bytes / 2;
    for (const Mode mode : modes) {
      std::vector<Buffer> buffers = make_buffers(devices, mode, bytes);
      all_reduces(devices, buffers, elements, 5);
      sync_all(devices);
      const float alone =
          timed(devices[0], devices[0].comm_stream, [&] { all_reduces(devices, buffers, elements, iters); });
      sync_all(devices);
      // Together: enough all-reduces to outlast the GEMMs (from the alone timings), then the GEMMs.
      const int beside_count = std::max(iters, static_cast<int>(gemm_alone / (alone / iters)) + 2);
      cudaEvent_t ar_start, ar_stop;
      CHECK_CUDA(cudaSetDevice(0));
      CHECK_CUDA(cudaEventCreate(&ar_start));
      CHECK_CUDA(cudaEventCreate(&ar_stop));
      CHECK_CUDA(cudaEventRecord(ar_start, devices[0].comm_stream));
      all_reduces(devices, buffers, elements, beside_count);
      CHECK_CUDA(cudaSetDevice(0));
      CHECK_CUDA(cudaEventRecord(ar_stop, devices[0].comm_stream));
      const float gemm_beside = timed(devices[0], devices[0].compute, [&] { gemms(devices, gemm_n, gemm_count); });
      CHECK_CUDA(cudaEventSynchronize(ar_stop));
      float ar_span = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ar_span, ar_start, ar_stop));
      sync_all(devices);
      const double per_call = alone / iters * 1e3;
      const double busbw = static_cast<double>(bytes) / (per_call * 1e-6) * 2.0 * (count - 1) / count / 1e9;
      std::printf("%-11s %8lld %14.1f %14.1f %14.1f %12.3f %13.1f%%\n", mode_name(mode), static_cast<long long>(mib),
                  per_call, busbw, ar_span / beside_count * 1e3, gemm_beside, 100.0 * (gemm_beside / gemm_alone - 1.0));
      std::fflush(stdout);
      free_buffers(devices, mode, buffers);
    }
  }
  for (auto& dev : devices) {
    CHECK_CUDA(cudaSetDevice(dev.index));
    ncclCommDestroy(dev.comm);
  }
  return 0;
}
