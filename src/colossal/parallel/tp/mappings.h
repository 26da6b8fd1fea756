// Megatron-LM's tensor-parallel communication as autograd pairs: each function communicates over the
// tensor-parallel group in forward and records the adjoint communication for backward. The
// tensor-parallel layers (column/row-parallel linear, vocab-parallel embedding, sequence parallelism)
// are built from these six; nothing else in a layer communicates.
//
// Note [Replicated and per-rank tensors]: the backward of each pair is the adjoint of its forward
// under Megatron's convention for what a tensor on the group means. A *replicated* tensor holds the
// same value on every rank and stands for one logical tensor: a loss computed from it is counted once,
// and its gradient (the same on every rank) is that one tensor's gradient. A *per-rank* tensor (a
// shard, a partial sum, or a replicated value that each rank feeds into different computations) is
// one logical tensor per rank, and the loss is the sum of what each rank computes from its own.
// copy_to_region, scatter_to_region: replicated in, per-rank out. reduce_from_region,
// gather_from_region: per-rank in, replicated out. The sequence-parallel pair is per-rank on both
// sides. With the wrong kind on either side the gradients are off by a factor or a sum over ranks.
//
// Every function: x on group.device() (the CPU for MPI, the group's GPU for NCCL), any strides, any
// dtype the group's collectives take (f32, f64, f16, bf16 for those that reduce); every rank of the
// group calls it in the same order with tensors of the same shape, and with x requiring grad on all
// of them or none (backward communicates, so it must run on every rank or on none). The group must
// outlive the backward of the graph the call records (the recorded node refers to it). With a group
// of one rank every function is the identity: no communication, and the output is still recorded,
// so the graph has the same shape at every tensor-parallel size.
#pragma once

#include <cstdint>

#include "colossal/comm/process_group.h"  // ProcessGroup
#include "colossal/core/tensor.h"
#include "colossal/ops/linalg.h"  // InputGradHook

namespace colossal::parallel::tp {

/// Megatron's copy_to_tensor_model_parallel_region (_CopyToModelParallelRegion, "f" in the paper):
/// forward the identity (the output shares x's storage); backward the all-reduce (sum) of the
/// gradient. Adjoint: y_r = x for every rank r and the loss sums each rank's use of y_r, so
/// dL/dx = sum_r dL/dy_r.
Tensor copy_to_region(const Tensor& x, comm::ProcessGroup& group);

/// Megatron's reduce_from_tensor_model_parallel_region (_ReduceFromModelParallelRegion, "g"):
/// forward the all-reduce (sum) of x into a new tensor; backward the identity. Adjoint: y = sum_r x_r
/// is replicated, so the loss sees it once and dL/dx_r = dL/dy, the same gradient on every rank.
/// consume_input: the caller gives x up (a GEMM's fresh output that nothing else reads, as the
/// row-parallel layer's partial product): the sum is taken in x's own buffer, which y then shares,
/// saving a copy of the activations per call.
Tensor reduce_from_region(const Tensor& x, comm::ProcessGroup& group, bool consume_input = false);

/// reduce_from_region with its all-reduce left running: `y` holds the sum once `done` has been waited
/// for (on a GPU the waiting stream then follows the communicator's, the host does not block; on MPI
/// the host waits), so other work can run under the communication (Note [Overlapped tensor-parallel
/// blocks] in gpt2_1d.cpp). The caller waits before anything reads y. Recorded as reduce_from_region.
struct PendingSum {
  Tensor y;
  comm::Work done;
};
PendingSum reduce_from_region_async(const Tensor& x, comm::ProcessGroup& group, bool consume_input = false);

/// copy_to_region folded into the linear layer that consumes its output (Megatron's column-parallel
/// layer with its asynchronous gradient all-reduce): the hook ops::linear / ops::linear_gelu call in
/// backward with the input's gradient, which it all-reduces (sum) over the group in place and
/// asynchronously while the weight's and bias's gradient GEMMs run, then waits for (on a GPU, the
/// compute stream waits for the communicator's; the host does not). `group` must outlive the backward.
ops::InputGradHook all_reduce_input_grad(comm::ProcessGroup& group);

/// Megatron's scatter_to_tensor_model_parallel_region (_ScatterToModelParallelRegion), along any
/// dimension (Megatron's splits the last): forward this rank's chunk of x along dim (x.size(dim)
/// divisible by the group size; a view of x where the chunk is contiguous, else a contiguous copy);
/// backward the all-gather of the gradient chunks along dim. Adjoint: y_r = chunk_r(x) of a
/// replicated x, so dL/dx is every rank's dL/dy_r put back at its chunk: the concatenation.
Tensor scatter_to_region(const Tensor& x, int64_t dim, comm::ProcessGroup& group);

/// Megatron's gather_from_tensor_model_parallel_region (_GatherFromModelParallelRegion), along any
/// dimension: forward the concatenation of every rank's x along dim, in rank order (every rank's x has
/// the same shape); backward this rank's chunk of the gradient. Adjoint: y = cat_r(x_r) is
/// replicated, so dL/dx_r is the chunk of the one dL/dy where x_r went.
Tensor gather_from_region(const Tensor& x, int64_t dim, comm::ProcessGroup& group);

/// Megatron's gather_from_sequence_parallel_region (_GatherFromSequenceParallelRegion, with its
/// gradient reduce-scattered as the sequence-parallel layers need): forward the all-gather along dim
/// (the sequence dimension); backward the reduce-scatter (sum) of the gradient along dim. Adjoint:
/// every rank uses the gathered y = cat_p(x_p) in its own way, so dL/dx_p is chunk p of
/// sum_r dL/dy_r.
Tensor gather_from_sequence_region(const Tensor& x, int64_t dim, comm::ProcessGroup& group);

/// Megatron's reduce_scatter_to_sequence_parallel_region (_ReduceScatterToSequenceParallelRegion):
/// forward the reduce-scatter (sum) along dim (x.size(dim) divisible by the group size): rank r gets
/// chunk r of sum_p x_p; backward the all-gather of the gradient along dim. Adjoint:
/// y_r = chunk_r(sum_p x_p), so dL/dx_p = cat_r(dL/dy_r) for every p.
Tensor reduce_scatter_to_sequence_region(const Tensor& x, int64_t dim, comm::ProcessGroup& group);

}  // namespace colossal::parallel::tp
