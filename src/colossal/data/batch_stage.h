// BatchStage: the part of a data pipeline that works on whole batches where the batch is consumed
// (on the GPU for a GPU run, on the loader's worker for a CPU run), so that workers hand over small
// batches (uint8 32 x 32 images, synthetic pixel keys) instead of full-size float images. See
// Note [Batch stages] in batch_stage.cpp.
#pragma once

#include <string>

#include "colossal/core/random.h"  // Generator
#include "colossal/data/batch.h"

namespace colossal::data {

/// A stage has two halves. prepare() runs on the worker that collated the batch, on the CPU: it
/// takes the stage's random draws from the batch's generator (derive_generator(seed,
/// RandomStream::batch_transform, epoch, batch index), after any BatchTransform's), keeps them in
/// batch.draws, and does the small host work (targets). run() turns the prepared batch's input into
/// the final one wherever the batch lives; it must not draw, so that the CPU and the GPU give the
/// same batch from the same draws.
class BatchStage {
 public:
  virtual ~BatchStage() = default;
  virtual void prepare(Batch& batch, core::Generator& generator, const HostAllocator& allocate) const = 0;
  /// Shape and dtype of run()'s output for a prepared input of shape `input` (what to allocate).
  virtual Shape output_shape(const Shape& input) const = 0;
  virtual DType output_dtype() const { return DType::f32; }
  /// Writes the final input of `batch` into `out` (contiguous, output_shape/output_dtype, on
  /// batch.input's device). On a GPU it runs on the current stream and does not wait for the host.
  virtual void run(const Batch& batch, const Tensor& out) const = 0;
  /// For logs and error messages.
  virtual std::string name() const = 0;
};

/// Allocates the output with `allocate` (CPU batches) and runs `stage` on the batch: what a loader
/// does for a batch that stays on the CPU. Throws naming the stage when it fails.
void run_batch_stage_on_host(const BatchStage& stage, Batch& batch, const HostAllocator& allocate);

}  // namespace colossal::data
