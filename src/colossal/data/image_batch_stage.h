// ImageBatchStage: the tail of an image pipeline run on whole batches where they are consumed —
// uint8 to float (ToTensor), bilinear resize, per-channel normalisation and mixup — in one pass
// (one CUDA kernel on a GPU). Its values are those of the per-sample transforms (to_float_image,
// resize_bilinear, normalize) followed by Mixup with the same draw, bit for bit on the CPU, which is
// also its CPU implementation.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "colossal/core/dispatch.h"
#include "colossal/data/batch_stage.h"
#include "colossal/data/mixup.h"

namespace colossal::data {

struct ImageBatchStageOptions {
  /// Output side [height, width] of a bilinear resize (align_corners=False); 0 keeps the input's.
  int64_t height = 0, width = 0;
  bool antialias = true;  ///< as Resize's (matters only when shrinking)
  /// Per-channel normalisation (1 or C values each); empty: none.
  std::vector<double> mean, std;
  /// Mixup of each batch (lambda drawn in prepare()); unset: none.
  std::optional<MixupOptions> mixup;
};

/// The per-batch constants of one input geometry: the resize taps along each axis and the
/// normalisation per channel, as flat arrays a kernel reads (built once per input shape).
struct ImageStagePlan {
  int64_t channels = 0, in_height = 0, in_width = 0, out_height = 0, out_width = 0;
  bool resize = false;    ///< false: the taps are the identity
  bool antialias = true;  ///< resize_bilinear's flag the taps were made with
  int64_t taps_x = 0, taps_y = 0;
  std::vector<int32_t> first_x, count_x, first_y, count_y;
  std::vector<float> weights_x, weights_y;  ///< [out_width, taps_x], [out_height, taps_y]
  std::vector<float> mean, std;             ///< [channels]; empty: no normalisation

  /// The arrays above as 32-bit words, in the order first_x, count_x, first_y, count_y, weights_x,
  /// weights_y, mean, std.
  std::vector<uint32_t> packed_words() const;
  /// packed_words() in `device` memory, copied there on its first use (which waits for the copy
  /// once) and kept. Its memory is the driver's, not the stream-ordered pool's, so that no stream's
  /// order binds it (the plan outlives the loaders' side streams). CUDA builds only.
  const void* packed(Device device) const;

 private:
  mutable std::mutex mutex_;
  mutable std::map<int, std::shared_ptr<void>> packed_;
};

/// The stage's kernel for one device: `input` [B, C, H, W] u8 or f32 (contiguous, on the device),
/// `out` [B, C, OH, OW] f32; `lambda` is mixup's weight when `mix`.
using ImageStageKernel = void(const Tensor& input, const Tensor& out, const ImageStagePlan& plan, bool mix,
                              double lambda);
extern core::DispatchStub<ImageStageKernel> image_stage_stub;

class ImageBatchStage final : public BatchStage {
 public:
  /// Throws naming the option when a size is negative, mean/std are not both set or both empty, a
  /// std is 0, or mixup's alpha or num_classes is invalid.
  explicit ImageBatchStage(ImageBatchStageOptions options);

  /// With mixup: draws lambda (draw_mixup_lambda) into batch.draws and turns the class indices
  /// into mixed soft targets [B, C] on the host.
  void prepare(Batch& batch, core::Generator& generator, const HostAllocator& allocate) const override;
  Shape output_shape(const Shape& input) const override;
  void run(const Batch& batch, const Tensor& out) const override;
  std::string name() const override;

  const ImageBatchStageOptions& options() const { return options_; }
  /// The plan for inputs of [C, H, W] (cached per geometry).
  std::shared_ptr<const ImageStagePlan> plan(int64_t channels, int64_t height, int64_t width) const;

 private:
  ImageBatchStageOptions options_;
  mutable std::mutex mutex_;
  mutable std::map<std::tuple<int64_t, int64_t, int64_t>, std::shared_ptr<const ImageStagePlan>> plans_;
};

}  // namespace colossal::data
