// The host step of Adam, AdamW and LAMB: see host_optimizer.h.
#include "colossal/optim/host_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <utility>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"
#include "colossal/core/half.h"          // half / bf16 bit conversions
#include "colossal/core/parallel_for.h"  // parallel_for
#include "colossal/optim/adam.h"         // AdamOptions
#include "colossal/optim/lamb.h"         // LambOptions

namespace colossal::optim {

// Note [Host optimizer step]
// ZeRO's offload keeps fp32 masters and moments on the host, so the update is a pass over host
// memory: Adam reads the gradient (4 bytes, or 2 from a 16-bit buffer) and reads and writes the
// parameter and both moments (24 bytes), and writes the parameter in the model's dtype for the copy
// back (2-4 bytes): ~30 bytes an element, memory-bound on any CPU. So:
//  - one pass: the gradient scale (clipping's factor), weight decay, both moments, the bias-corrected
//    step and the conversion to the model's dtype happen while an element is in registers (the
//    reference loop in adam.cpp makes ~8 passes, one per op);
//  - threads: the parameters are cut into chunks of kChunk elements whatever the thread count, and
//    OpenMP's threads take contiguous runs of chunks (core::parallel_for), so a large tensor and many
//    small ones both spread over the cores; LAMB's per-tensor sums are summed per chunk and then over
//    a tensor's chunks in order, so the result does not depend on the thread count;
//  - vectors: the elementwise body is compiled three times (x86-64-v4: AVX-512; v3: AVX2 and FMA;
//    the baseline) through GCC's target_clones, and the loader picks the widest the CPU runs
//    (a runtime CPU check, no flag to set). Elsewhere it is compiled once for the build's target.
// The arithmetic is the reference's, op for op, in f32 with the same constants (each a double
// rounded to f32 as the ops round their scalars): the results equal optim::Adam's and optim::Lamb's
// up to FMA contraction and vector reassociation of LAMB's norms, a few f32 roundings (the tests
// bound the difference; tests/optim/host_optimizer_test.cpp).
// Measured (bench/host_optimizer_bench, 64M elements, the 64-core Xeon host of an H200 machine, 32
// threads): AdamW 104 GB/s of state (30 bytes an element: 18 ms per 64M parameters), a triad 109 GB/s
// (12 bytes an element counted, 16 moved), LAMB 60 GB/s (42 bytes counted), the reference step 57 GB/s
// at 4M elements.
// LAMB needs ||p|| and ||update|| before it may move p: a first pass updates the moments and sums
// p^2 and update^2 (in f64), a second recomputes the update from the stored moments (the same f32
// operations, so the same values) and applies it scaled by the trust ratio.

namespace {

constexpr int64_t kChunk = int64_t{1} << 14;  // elements a thread takes at a time
constexpr int64_t kBlock = 512;               // elements converted to f32 at a time (on the stack)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define COLOSSAL_HOST_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define COLOSSAL_HOST_CLONES
#endif

struct AdamConstants {
  float scale = 1, weight_decay = 0, decay = 1, beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
  float sqrt_bias_correction2 = 1, eps = 0, step_size = 0;
  bool l2 = false, decoupled = false, amsgrad = false;
};

struct LambConstants {
  float scale = 1, weight_decay = 0, beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
  float bias_correction1 = 1, sqrt_bias_correction2 = 1, eps = 0;
  float neg_lr = 0;
};

// ---- the elementwise bodies (one instantiation per flag combination, inlined into the clones)

template <bool kL2, bool kDecoupled, bool kAmsgrad>
inline __attribute__((always_inline)) void adam_body(float* __restrict p, float* __restrict m, float* __restrict v,
                                                     float* __restrict v_max, const float* __restrict g, int64_t n,
                                                     const AdamConstants& c) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    // Times 1 when unscaled, which is exact.
    float grad = g[j] * c.scale;
    float param = p[j];
    if constexpr (kL2) grad = grad + c.weight_decay * param;
    if constexpr (kDecoupled) param = param * c.decay;
    const float exp_avg = m[j] * c.beta1 + c.one_minus_beta1 * grad;
    const float exp_avg_sq = v[j] * c.beta2 + c.one_minus_beta2 * (grad * grad);
    m[j] = exp_avg;
    v[j] = exp_avg_sq;
    float second = exp_avg_sq;
    if constexpr (kAmsgrad) {
      second = std::max(v_max[j], exp_avg_sq);
      v_max[j] = second;
    }
    const float denom = std::sqrt(second) / c.sqrt_bias_correction2 + c.eps;
    p[j] = param + c.step_size * (exp_avg / denom);
  }
}

template <bool kL2, bool kDecoupled>
inline __attribute__((always_inline)) void adam_amsgrad(float* p, float* m, float* v, float* v_max, const float* g,
                                                        int64_t n, const AdamConstants& c) {
  if (c.amsgrad) {
    adam_body<kL2, kDecoupled, true>(p, m, v, v_max, g, n, c);
  } else {
    adam_body<kL2, kDecoupled, false>(p, m, v, v_max, g, n, c);
  }
}

COLOSSAL_HOST_CLONES void adam_block(float* p, float* m, float* v, float* v_max, const float* g, int64_t n,
                                     const AdamConstants& c) {
  if (c.l2) {
    adam_amsgrad<true, false>(p, m, v, v_max, g, n, c);
  } else if (c.decoupled) {
    adam_amsgrad<false, true>(p, m, v, v_max, g, n, c);
  } else {
    adam_amsgrad<false, false>(p, m, v, v_max, g, n, c);
  }
}

/// LAMB's update direction at one element, from the moments already updated: m_hat / (sqrt(v_hat) +
/// eps) + weight_decay * p, in the reference's order of operations.
inline __attribute__((always_inline)) float lamb_direction(float exp_avg, float exp_avg_sq, float param,
                                                           const LambConstants& c) {
  const float denom = std::sqrt(exp_avg_sq) / c.sqrt_bias_correction2 + c.eps;
  return exp_avg / c.bias_correction1 / denom + c.weight_decay * param;
}

/// First pass: the moments, and sum p^2, sum update^2 of the block added to sums[0], sums[1].
COLOSSAL_HOST_CLONES void lamb_moments_block(const float* p, float* m, float* v, const float* g, int64_t n,
                                             const LambConstants& c, double* sums) {
  double weight = 0, update = 0;
#pragma omp simd reduction(+ : weight, update)
  for (int64_t j = 0; j < n; ++j) {
    const float grad = g[j] * c.scale;  // times 1 when unscaled: exact
    const float exp_avg = m[j] * c.beta1 + c.one_minus_beta1 * grad;
    const float exp_avg_sq = v[j] * c.beta2 + c.one_minus_beta2 * (grad * grad);
    m[j] = exp_avg;
    v[j] = exp_avg_sq;
    const float direction = lamb_direction(exp_avg, exp_avg_sq, p[j], c);
    weight += static_cast<double>(p[j]) * p[j];
    update += static_cast<double>(direction) * direction;
  }
  sums[0] += weight;
  sums[1] += update;
}

/// Second pass: p <- p - lr * trust * update.
COLOSSAL_HOST_CLONES void lamb_apply_block(float* p, const float* m, const float* v, int64_t n, const LambConstants& c,
                                           float trust) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float direction = lamb_direction(m[j], v[j], p[j], c);
    p[j] = p[j] + c.neg_lr * (direction * trust);
  }
}

// ---- conversions between the model's dtype and f32

COLOSSAL_HOST_CLONES void bf16_to_f32(const uint16_t* in, float* out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = core::detail::bf16_bits_to_float(in[j]);
}

COLOSSAL_HOST_CLONES void f16_to_f32(const uint16_t* in, float* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = core::detail::half_bits_to_float(in[j]);
}

COLOSSAL_HOST_CLONES void f32_to_bf16(const float* in, uint16_t* out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = core::detail::float_to_bf16_bits(in[j]);
}

COLOSSAL_HOST_CLONES void f32_to_f16(const float* in, uint16_t* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = core::detail::float_to_half_bits(in[j]);
}

/// One parameter's pointers for the passes.
struct Job {
  float* param = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* max_exp_avg_sq = nullptr;
  const void* grad = nullptr;
  DType grad_dtype = DType::f32;
  void* out = nullptr;
  DType out_dtype = DType::f32;
  int64_t numel = 0;
  AdamConstants adam;
  LambConstants lamb;
  float trust = 1;
};

/// The gradient of elements [begin, begin + n) as f32: the gradient itself, or `buffer` filled.
const float* gradient_f32(const Job& job, int64_t begin, int64_t n, float* buffer) {
  switch (job.grad_dtype) {
    case DType::f32:
      return static_cast<const float*>(job.grad) + begin;
    case DType::bf16:
      bf16_to_f32(static_cast<const uint16_t*>(job.grad) + begin, buffer, n);
      return buffer;
    default:
      f16_to_f32(static_cast<const uint16_t*>(job.grad) + begin, buffer, n);
      return buffer;
  }
}

void write_out(const Job& job, int64_t begin, int64_t n) {
  if (job.out == nullptr) return;
  const float* p = job.param + begin;
  switch (job.out_dtype) {
    case DType::f32:
      std::copy(p, p + n, static_cast<float*>(job.out) + begin);
      break;
    case DType::bf16:
      f32_to_bf16(p, static_cast<uint16_t*>(job.out) + begin, n);
      break;
    default:
      f32_to_f16(p, static_cast<uint16_t*>(job.out) + begin, n);
      break;
  }
}

struct Chunk {
  size_t job = 0;
  int64_t begin = 0, end = 0;
};

/// Runs body(chunk) for every chunk, the chunks spread over OpenMP's threads.
template <class Body>
void for_each_chunk(const std::vector<Chunk>& chunks, Body&& body) {
  core::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) body(static_cast<size_t>(c));
  });
}

void check_host_tensor(const Optimizer& optimizer, const ParamGroup& group, size_t index, const Tensor& t,
                       const char* what, int64_t numel) {
  COLOSSAL_CHECK(t.device().is_cpu() && t.is_contiguous() && t.numel() == numel &&
                     (t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16),
                 "{} host step: the {} of parameter {} must be a contiguous f32, bf16 or f16 CPU tensor of {} "
                 "elements, got {} {} on {}",
                 optimizer.name(), what, group.param_label(index), numel, t.dtype(), t.shape(), t.device());
}

/// The state buffer `name` of `state`, created as f32 CPU zeros shaped like `param` when missing.
float* state_buffer(ParamState& state, const std::string& name, const Tensor& param) {
  Tensor& buffer = state.buffers[name];
  if (!buffer.defined()) buffer = core::zeros(param.shape(), TensorOptions(DType::f32, param.device()));
  return buffer.data<float>();
}

}  // namespace

bool host_step_supports(const Optimizer& optimizer) {
  return optimizer.name() == "Adam" || optimizer.name() == "AdamW" || optimizer.name() == "LAMB";
}

void host_step(Optimizer& optimizer, const std::vector<HostStepItem>& items, double grad_scale) {
  autograd::NoGradGuard no_grad;
  COLOSSAL_CHECK(host_step_supports(optimizer),
                 "the host optimizer step (zero.offload_optimizer) runs Adam, AdamW and LAMB; optimizer {} has none; "
                 "use optimizer.name = \"adamw\", \"adam\" or \"lamb\", or set zero.offload_optimizer = false",
                 optimizer.name());
  COLOSSAL_CHECK(std::isfinite(grad_scale), "{} host step: the gradient scale must be finite, got {}", optimizer.name(),
                 grad_scale);
  const bool lamb = optimizer.name() == "LAMB";
  const float scale = static_cast<float>(grad_scale);
  // Everything checked before anything changes.
  std::set<std::pair<size_t, size_t>> seen;
  for (const HostStepItem& item : items) {
    COLOSSAL_CHECK(
        item.group < optimizer.param_groups().size() && item.index < optimizer.param_groups()[item.group].params.size(),
        "{} host step: there is no parameter {} in param group {}", optimizer.name(), item.index, item.group);
    const ParamGroup& group = optimizer.param_groups()[item.group];
    COLOSSAL_CHECK(seen.emplace(item.group, item.index).second, "{} host step: parameter {} is named twice",
                   optimizer.name(), group.param_label(item.index));
    const Tensor& param = group.params[item.index];
    COLOSSAL_CHECK(param.device().is_cpu() && param.is_contiguous() && param.dtype() == DType::f32,
                   "{} host step: parameter {} must be contiguous f32 on the CPU, got {} on {}", optimizer.name(),
                   group.param_label(item.index), param.dtype(), param.device());
    check_host_tensor(optimizer, group, item.index, item.grad, "gradient", param.numel());
    if (item.out.defined()) check_host_tensor(optimizer, group, item.index, item.out, "output", param.numel());
  }
  std::vector<Job> jobs;
  jobs.reserve(items.size());
  for (const HostStepItem& item : items) {
    const ParamGroup& group = optimizer.param_groups()[item.group];
    const Tensor& param = group.params[item.index];
    ParamState& state = optimizer.state(item.group, item.index);
    state.step += 1;
    const auto step = static_cast<double>(state.step);
    Job job;
    job.param = param.data<float>();
    job.grad = item.grad.raw_data();
    job.grad_dtype = item.grad.dtype();
    job.out = item.out.defined() ? item.out.raw_data() : nullptr;
    job.out_dtype = item.out.defined() ? item.out.dtype() : DType::f32;
    job.numel = param.numel();
    job.exp_avg = state_buffer(state, "exp_avg", param);
    job.exp_avg_sq = state_buffer(state, "exp_avg_sq", param);
    if (lamb) {
      const LambOptions o = LambOptions::from_group(group);
      LambConstants& c = job.lamb;
      c.scale = scale;
      c.weight_decay = static_cast<float>(o.weight_decay);
      c.beta1 = static_cast<float>(o.beta1);
      c.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
      c.beta2 = static_cast<float>(o.beta2);
      c.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
      c.bias_correction1 = static_cast<float>(o.bias_correction ? 1.0 - std::pow(o.beta1, step) : 1.0);
      c.sqrt_bias_correction2 = static_cast<float>(std::sqrt(o.bias_correction ? 1.0 - std::pow(o.beta2, step) : 1.0));
      c.eps = static_cast<float>(o.eps);
      c.neg_lr = static_cast<float>(-o.lr);
    } else {
      const AdamOptions o = AdamOptions::from_group(group);
      AdamConstants& c = job.adam;
      c.scale = scale;
      c.l2 = optimizer.name() == "Adam" && o.weight_decay != 0.0;
      c.decoupled = optimizer.name() == "AdamW" && o.weight_decay != 0.0;
      c.weight_decay = static_cast<float>(o.weight_decay);
      c.decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
      c.beta1 = static_cast<float>(o.beta1);
      c.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
      c.beta2 = static_cast<float>(o.beta2);
      c.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
      c.sqrt_bias_correction2 = static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, step)));
      c.eps = static_cast<float>(o.eps);
      c.step_size = static_cast<float>(-o.lr / (1.0 - std::pow(o.beta1, step)));
      c.amsgrad = o.amsgrad;
      if (c.amsgrad) job.max_exp_avg_sq = state_buffer(state, "max_exp_avg_sq", param);
    }
    jobs.push_back(job);
  }

  std::vector<Chunk> chunks;
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (int64_t begin = 0; begin < jobs[j].numel; begin += kChunk) {
      chunks.push_back(Chunk{j, begin, std::min(jobs[j].numel, begin + kChunk)});
    }
  }

  if (!lamb) {
    for_each_chunk(chunks, [&](size_t c) {
      const Job& job = jobs[chunks[c].job];
      float buffer[kBlock];
      for (int64_t begin = chunks[c].begin; begin < chunks[c].end; begin += kBlock) {
        const int64_t n = std::min(kBlock, chunks[c].end - begin);
        adam_block(job.param + begin, job.exp_avg + begin, job.exp_avg_sq + begin,
                   job.max_exp_avg_sq != nullptr ? job.max_exp_avg_sq + begin : nullptr,
                   gradient_f32(job, begin, n, buffer), n, job.adam);
        write_out(job, begin, n);
      }
    });
    return;
  }

  // LAMB: the moments and each chunk's sums, then each tensor's trust ratio, then the update.
  std::vector<std::pair<double, double>> sums(chunks.size(), {0.0, 0.0});
  for_each_chunk(chunks, [&](size_t c) {
    const Job& job = jobs[chunks[c].job];
    float buffer[kBlock];
    double chunk_sums[2] = {0.0, 0.0};
    for (int64_t begin = chunks[c].begin; begin < chunks[c].end; begin += kBlock) {
      const int64_t n = std::min(kBlock, chunks[c].end - begin);
      lamb_moments_block(job.param + begin, job.exp_avg + begin, job.exp_avg_sq + begin,
                         gradient_f32(job, begin, n, buffer), n, job.lamb, chunk_sums);
    }
    sums[c] = {chunk_sums[0], chunk_sums[1]};
  });
  std::vector<std::pair<double, double>> norms(jobs.size(), {0.0, 0.0});
  for (size_t c = 0; c < chunks.size(); ++c) {  // in order: independent of the threads
    norms[chunks[c].job].first += sums[c].first;
    norms[chunks[c].job].second += sums[c].second;
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    const LambOptions o = LambOptions::from_group(optimizer.param_groups()[items[j].group]);
    if (!o.use_trust_ratio) continue;
    // As the reference: the norms in f32 (vector_norm of an f32 tensor), their guarded ratio in f32.
    const auto weight_norm = static_cast<float>(std::sqrt(norms[j].first));
    const auto update_norm = static_cast<float>(std::sqrt(norms[j].second));
    float trust = weight_norm > 0.0f && update_norm > 0.0f ? weight_norm / update_norm : 1.0f;
    if (std::isfinite(o.trust_clip)) trust = std::clamp(trust, 0.0f, static_cast<float>(o.trust_clip));
    jobs[j].trust = trust;
  }
  for_each_chunk(chunks, [&](size_t c) {
    const Job& job = jobs[chunks[c].job];
    for (int64_t begin = chunks[c].begin; begin < chunks[c].end; begin += kBlock) {
      const int64_t n = std::min(kBlock, chunks[c].end - begin);
      lamb_apply_block(job.param + begin, job.exp_avg + begin, job.exp_avg_sq + begin, n, job.lamb, job.trust);
      write_out(job, begin, n);
    }
  });
}

}  // namespace colossal::optim
