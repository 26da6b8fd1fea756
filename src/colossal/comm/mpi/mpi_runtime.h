// MPI as colossal uses it: start-up and shutdown (MPI_Init_thread on first use, MPI_Finalize at exit
// only if we started it), return-code checks, and the MPI datatype and reduction op for each DType
// (f16 and bf16 through datatypes and ops of our own).
#pragma once

// The MPI-2 C++ bindings are deprecated and noisy under -Wextra; colossal uses the C API.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

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
