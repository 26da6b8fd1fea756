// The process group of a run that is one process: rank 0 of 1, on any device. Every collective is
// the identity (a reduction over one rank is its input; a gather or scatter of one chunk is a copy),
// so code written against a ProcessGroup runs unchanged without MPI or NCCL, and a serial run is
// the layout dp = pp = tp = 1 of the same ParallelContext as a parallel one (parallel/).
#pragma once

#include <memory>

#include "colossal/comm/process_group.h"
#include "colossal/core/device.h"

namespace colossal::comm {

/// A group of this process alone whose tensors live on `device`. Point-to-point calls are errors (the
/// only peer would be the rank itself, which ProcessGroup refuses); split() gives another such group,
/// or null for kNoColor.
std::shared_ptr<ProcessGroup> single_process_group(Device device);

}  // namespace colossal::comm
