// Running a BatchStage on a batch that stays on the CPU. See Note [Batch stages].
#include "colossal/data/batch_stage.h"

#include "colossal/core/error.h"

namespace colossal::data {

// Note [Batch stages]
// The tutorial's image path (CIFAR-10 resized to 224, normalised, mixed) made each worker build
// 600 KB of f32 per image, collate 150 MB per batch of 256 and copy it to the GPU: the loader,
// about 1,600 images/s per rank, paced a GPU that needed 3,600 (issue 18). Everything after the
// last uint8 operation is the same arithmetic for every image and needs no per-image decision
// beyond one draw per batch (mixup's lambda), so it moves to a BatchStage:
// - the dataset returns what the last per-sample step leaves (uint8 32 x 32 after AutoAugment, 3 KB;
//   for synthetic images only the Philox key of the pixels);
// - the worker collates those, and the stage's prepare() takes its draws from the batch's
//   generator (the one a BatchTransform would use) and makes the soft targets;
// - the DataLoader runs run() where the batch is consumed: on a GPU after the side-stream copy, on
//   the side stream, into an output allocated on the consumer's stream (Note [Device prefetch]);
//   for CPU batches on the worker, into host memory.
// A stage's CPU kernel is the per-sample reference applied image by image, so the staged CPU
// pipeline equals the per-sample one bit for bit (tests/data_loading/batch_stage_test.cpp); its
// CUDA kernel rounds as the CPU one does (-fmad=false, the same order of operations) and is tested
// against it (tests/data_loading/batch_stage_gpu_test.cpp).

void run_batch_stage_on_host(const BatchStage& stage, Batch& batch, const HostAllocator& allocate) {
  COLOSSAL_CHECK(batch.input.defined(), "{}: the batch has no input", stage.name());
  Tensor out = allocate(stage.output_shape(batch.input.shape()), stage.output_dtype());
  stage.run(batch, out);
  batch.input = out;
}

}  // namespace colossal::data
