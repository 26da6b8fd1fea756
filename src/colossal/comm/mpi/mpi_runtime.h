// MPI as colossal uses it: start-up and shutdown (MPI_Init_thread on first use, MPI_Finalize at exit
// only if we started it), return-code checks, and the MPI datatype and reduction op for each DType
// (f16 and bf16 through datatypes and ops of our own).
#pragma once

// The MPI-2 C++ bindings are deprecated and noisy under -Wextra; colossal uses the C API.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <mutex>
#include <string>

#include "colossal/comm/process_group.h"  // ReduceOp
#include "colossal/core/dtype.h"
#include "colossal/core/error.h"

namespace colossal::comm::mpi {

/// Initialises MPI (asking for MPI_THREAD_MULTIPLE) unless it already is, and registers MPI_Finalize
/// at exit when this call was the one that initialised it. Throws if MPI was already finalized.
void ensure_initialized();
/// True when colossal called MPI_Init_thread (and will call MPI_Finalize at exit).
bool initialized_by_colossal();

/// Permission for a thread other than the caller's to call MPI now (the watchdog polling requests,
/// comm/watchdog.h): granted when colossal started MPI with MPI_THREAD_MULTIPLE, so it also knows
/// when MPI ends, and MPI is not being finalized. While one is held and granted, colossal's
/// MPI_Finalize at exit waits; it never waits itself (a busy finalize just says no).
class BackgroundCall {
 public:
  BackgroundCall();
  explicit operator bool() const { return granted_; }

 private:
  std::unique_lock<std::mutex> lock_;
  bool granted_ = false;
};

/// Whether BackgroundCall can ever be granted in this process (colossal started MPI with
/// MPI_THREAD_MULTIPLE); the MPI backend hands its requests to the watchdog only then.
bool background_calls_possible();

/// The text of an MPI error code.
std::string error_text(int code);

/// The datatype of one element of `dtype` (bool travels as unsigned bytes).
MPI_Datatype datatype(DType dtype);
/// The op reducing `dtype` with `op`; avg reduces with sum and the caller divides by the group size.
MPI_Op reduction(ReduceOp op, DType dtype);

}  // namespace colossal::comm::mpi

/// COLOSSAL_MPI_CHECK(MPI_Foo(...), "context {}", args...): throws colossal::Error naming the call, the
/// MPI error and the context when the call does not return MPI_SUCCESS. colossal's communicators
/// return errors (MPI_ERRORS_RETURN) rather than abort.
#define COLOSSAL_MPI_CHECK(expr, ...)                                                                         \
  do {                                                                                                        \
    const int colossal_mpi_rc_ = (expr);                                                                      \
    if (colossal_mpi_rc_ != MPI_SUCCESS) [[unlikely]] {                                                       \
      COLOSSAL_FAIL("MPI error from {}: {} [{}]", #expr, ::colossal::comm::mpi::error_text(colossal_mpi_rc_), \
                    ::fmt::format(__VA_ARGS__));                                                              \
    }                                                                                                         \
  } while (0)
