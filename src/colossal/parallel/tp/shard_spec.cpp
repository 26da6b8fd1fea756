// Shard specs: see shard_spec.h.
#include "colossal/parallel/tp/shard_spec.h"

#include <numeric>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"
#include "colossal/ops/indexing.h"          // index_select
#include "colossal/parallel/tp/mappings.h"  // gather_from_region

namespace colossal::parallel::tp {
namespace {

Tensor index_tensor(const std::vector<int64_t>& order, Device device) {
  return core::from_vector<int64_t>(order, {static_cast<int64_t>(order.size())}).to(device);
}

}  // namespace

std::map<std::string, ShardSpec> collect_shard_specs(nn::Module& model) {
  std::map<std::string, ShardSpec> specs;
  for (const auto& [name, parameter] : model.named_parameters()) specs.emplace(name, ShardSpec::replicate());
  for (const auto& [prefix, module] : model.named_modules()) {
    const auto* sharded = dynamic_cast<const Sharded*>(module);
    if (sharded == nullptr) continue;
    for (const auto& [name, spec] : sharded->shard_specs()) {
      const std::string full = prefix.empty() ? name : prefix + "." + name;
      auto it = specs.find(full);
      COLOSSAL_CHECK(it != specs.end(),
                     "collect_shard_specs: module '{}' names a parameter '{}' the model does not have", prefix, name);
      it->second = spec;
    }
  }
  return specs;
}

Tensor shard_of(const Tensor& serial, const ShardSpec& spec, int rank, int size) {
  autograd::NoGradGuard no_grad;
  if (spec.replicated()) return serial.detach().contiguous().clone();
  Tensor ordered = serial.detach();
  if (!spec.order.empty()) ordered = ops::index_select(ordered, spec.dim, index_tensor(spec.order, serial.device()));
  if (spec.size > 0) {
    COLOSSAL_CHECK(spec.order.empty(), "shard_of: a padded spec takes no order");
    COLOSSAL_CHECK(ordered.size(spec.dim) == spec.size, "shard_of: dim {} of shape {} is not the spec's {}", spec.dim,
                   serial.shape(), spec.size);
    const int64_t padded = ShardSpec::padded_size(spec.size, size);
    if (padded != spec.size) {
      Shape shape = ordered.shape();
      shape[static_cast<size_t>(spec.dim)] = padded;
      const Tensor out = core::zeros(shape, TensorOptions(ordered.dtype(), ordered.device()));
      out.narrow(spec.dim, 0, spec.size).copy_(ordered);
      ordered = out;
    }
  }
  const int64_t n = ordered.size(spec.dim);
  COLOSSAL_CHECK(n % size == 0, "shard_of: dim {} of shape {} does not split over {} ranks", spec.dim, serial.shape(),
                 size);
  return ordered.narrow(spec.dim, rank * (n / size), n / size).contiguous().clone();
}

Tensor gather_shard(const Tensor& local, const ShardSpec& spec, comm::ProcessGroup& group) {
  autograd::NoGradGuard no_grad;  // gather_from_region records nothing then
  if (spec.replicated()) return local.detach();
  const Tensor ordered = gather_from_region(local.detach(), spec.dim, group);
  if (spec.size > 0) return ordered.narrow(spec.dim, 0, spec.size).contiguous();  // padding off
  if (spec.order.empty()) return ordered;
  // Undo the order: serial index order[i] holds ordered's i-th slice.
  std::vector<int64_t> inverse(spec.order.size());
  for (size_t i = 0; i < spec.order.size(); ++i) inverse[static_cast<size_t>(spec.order[i])] = static_cast<int64_t>(i);
  return ops::index_select(ordered, spec.dim, index_tensor(inverse, local.device()));
}

}  // namespace colossal::parallel::tp
