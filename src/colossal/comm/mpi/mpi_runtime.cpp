// MPI start-up/shutdown, error texts, and the datatypes and reduction ops of each DType
// (comm/mpi/mpi_runtime.h).
#include "colossal/comm/mpi/mpi_runtime.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "colossal/core/half.h"

namespace colossal::comm::mpi {

namespace {

std::mutex init_mutex;
bool we_initialized = false;
std::atomic<bool> thread_multiple{false};
// Held by BackgroundCall while another thread is inside MPI, and by finalize_at_exit, which sets
// finalizing: MPI_Finalize must not run beside another thread's MPI call.
std::mutex background_mutex;
bool finalizing = false;
bool types_ready = false;
// f16 and bf16 are 2-byte types MPI does not know; separate handles let the reduction functions
// tell them apart.
MPI_Datatype f16_type = MPI_DATATYPE_NULL;
MPI_Datatype bf16_type = MPI_DATATYPE_NULL;
MPI_Op half_sum = MPI_OP_NULL, half_max = MPI_OP_NULL, half_min = MPI_OP_NULL;

void finalize_at_exit() {
  std::lock_guard lock(background_mutex);
  finalizing = true;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// Reductions of 16-bit floats: each pairwise step computes in float and rounds back, as NCCL does.
template <class Half16, class F>
void reduce_16bit(void* in, void* inout, int length, F combine) {
  const auto* a = static_cast<const Half16*>(in);
  auto* b = static_cast<Half16*>(inout);
  for (int i = 0; i < length; ++i) b[i] = Half16(combine(static_cast<float>(a[i]), static_cast<float>(b[i])));
}

template <class F>
void reduce_half_or_bfloat(void* in, void* inout, const int* length, const MPI_Datatype* type, F combine) {
  if (*type == f16_type) {
    reduce_16bit<core::Half>(in, inout, *length, combine);
  } else {
    reduce_16bit<core::BFloat16>(in, inout, *length, combine);
  }
}

void sum_16bit(void* in, void* inout, int* length, MPI_Datatype* type) {
  reduce_half_or_bfloat(in, inout, length, type, [](float a, float b) { return a + b; });
}
// NaN propagates, as in torch.maximum: a comparison with NaN is false, so test it first.
void max_16bit(void* in, void* inout, int* length, MPI_Datatype* type) {
  reduce_half_or_bfloat(in, inout, length, type, [](float a, float b) { return (a != a || a > b) ? a : b; });
}
void min_16bit(void* in, void* inout, int* length, MPI_Datatype* type) {
  reduce_half_or_bfloat(in, inout, length, type, [](float a, float b) { return (a != a || a < b) ? a : b; });
}

void create_types() {
  COLOSSAL_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &f16_type), "making the f16 datatype");
  COLOSSAL_MPI_CHECK(MPI_Type_commit(&f16_type), "making the f16 datatype");
  COLOSSAL_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &bf16_type), "making the bf16 datatype");
  COLOSSAL_MPI_CHECK(MPI_Type_commit(&bf16_type), "making the bf16 datatype");
  COLOSSAL_MPI_CHECK(MPI_Op_create(&sum_16bit, /*commute=*/1, &half_sum), "making the f16/bf16 sum");
  COLOSSAL_MPI_CHECK(MPI_Op_create(&max_16bit, /*commute=*/1, &half_max), "making the f16/bf16 max");
  COLOSSAL_MPI_CHECK(MPI_Op_create(&min_16bit, /*commute=*/1, &half_min), "making the f16/bf16 min");
}

}  // namespace

void ensure_initialized() {
  std::lock_guard lock(init_mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  COLOSSAL_CHECK(!finalized, "MPI was already finalized; create MPI process groups before MPI_Finalize");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    // Async Work may be waited on from a thread other than the one that issued it.
    COLOSSAL_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "starting MPI");
    we_initialized = true;
    thread_multiple = provided == MPI_THREAD_MULTIPLE;
    std::atexit(finalize_at_exit);
  }
  if (!types_ready) {
    create_types();
    types_ready = true;
  }
}

bool initialized_by_colossal() {
  std::lock_guard lock(init_mutex);
  return we_initialized;
}

bool background_calls_possible() {
  return thread_multiple.load();
}

BackgroundCall::BackgroundCall() : lock_(background_mutex, std::try_to_lock) {
  granted_ = lock_.owns_lock() && !finalizing && thread_multiple.load();
  if (granted_) {
    // A program may finalize MPI itself rather than leave it to us at exit.
    int finalized = 0;
    MPI_Finalized(&finalized);
    granted_ = finalized == 0;
  }
}

std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return fmt::format("MPI error code {}", code);
  return std::string(text, static_cast<size_t>(length));
}

MPI_Datatype datatype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::f16:
      return f16_type;
    case DType::bf16:
      return bf16_type;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
      return MPI_UINT8_T;
    case DType::boolean:
      return MPI_UINT8_T;  // 0/1 bytes: max is or, min is and
  }
  COLOSSAL_FAIL("no MPI datatype for dtype {}", static_cast<int>(dtype));
}

MPI_Op reduction(ReduceOp op, DType dtype) {
  if (core::is_reduced_float(dtype)) {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        return half_sum;
      case ReduceOp::max:
        return half_max;
      case ReduceOp::min:
        return half_min;
    }
  }
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  COLOSSAL_FAIL("no MPI op for ReduceOp {}", static_cast<int>(op));
}

}  // namespace colossal::comm::mpi
