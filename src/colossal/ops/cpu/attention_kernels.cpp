// CPU scaled dot-product attention, forward and backward, one (batch, head) matrix at a time:
// scores and products through OpenBLAS, the masked softmax in between by hand. The forward keeps
// only each row's logsumexp; the backward recomputes the probabilities from it.
//
// All parallelism comes from OpenBLAS's threads inside the GEMMs: the row loops between them stay
// on the calling thread, because handing the cores back and forth between OpenBLAS's pool and the
// OpenMP pool several times per head made the forward 30x slower (see Note [OpenBLAS and our
// threads] in cpu_blas.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "colossal/ops/cpu/cpu_blas.h"  // gemm, batch_offsets, pack_matrix, BlasCompute
#include "colossal/ops/nn_kernels.h"

namespace colossal::ops {
namespace {

/// Sizes of one attention problem and where each of its batch matrices starts.
struct AttentionGeometry {
  int64_t tq, tk, head_dim, value_dim;
  std::vector<int64_t> q_offsets, k_offsets, v_offsets;
  int64_t count() const { return static_cast<int64_t>(q_offsets.size()); }
  /// Keys query row i may attend to: [0, visible(i)).
  int64_t visible(int64_t i, bool causal) const { return causal ? std::clamp<int64_t>(i + (tk - tq) + 1, 0, tk) : tk; }
};

AttentionGeometry geometry_of(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t batch_rank = q.dim() - 2;
  return AttentionGeometry{q.size(-2),
                           k.size(-2),
                           q.size(-1),
                           v.size(-1),
                           cpu::batch_offsets(q, batch_rank),
                           cpu::batch_offsets(k, batch_rank),
                           cpu::batch_offsets(v, batch_rank)};
}

/// The batch-b matrices of q, k and v, packed row-major in the compute type.
template <class T, class C>
struct PackedHead {
  std::vector<C> q, k, v;
  explicit PackedHead(const AttentionGeometry& g) : q(g.tq * g.head_dim), k(g.tk * g.head_dim), v(g.tk * g.value_dim) {}
  void load(const AttentionGeometry& g, int64_t b, const Tensor& qt, const Tensor& kt, const Tensor& vt) {
    cpu::pack_matrix(qt.data<T>() + g.q_offsets[b], g.tq, g.head_dim, qt.stride(-2), qt.stride(-1), q.data());
    cpu::pack_matrix(kt.data<T>() + g.k_offsets[b], g.tk, g.head_dim, kt.stride(-2), kt.stride(-1), k.data());
    cpu::pack_matrix(vt.data<T>() + g.v_offsets[b], g.tk, g.value_dim, vt.stride(-2), vt.stride(-1), v.data());
  }
};

/// p[i, j] <- exp(s[i, j] * scale - lse[i]) on visible keys, 0 on masked ones (a row with
/// lse = -inf sees no key).
template <class C>
void probabilities_from_lse(const AttentionGeometry& g, bool causal, C scale, const C* lse, C* p) {
  for (int64_t i = 0; i < g.tq; ++i) {
    C* row = p + i * g.tk;
    const int64_t visible = g.visible(i, causal);
    for (int64_t j = 0; j < visible; ++j) row[j] = std::exp(row[j] * scale - lse[i]);
    for (int64_t j = visible; j < g.tk; ++j) row[j] = C(0);
  }
}

/// Where a GEMM writes a contiguous [rows, cols] block of T storage: the storage itself when T is
/// the compute type, else a buffer that store() converts afterwards.
template <class T, class C>
class GemmTarget {
 public:
  explicit GemmTarget(int64_t size) : buffer_(std::is_same_v<T, C> ? 0 : size) {}
  C* at(T* dst) {
    if constexpr (std::is_same_v<T, C>) {
      return dst;
    } else {
      return buffer_.data();
    }
  }
  void store(T* dst) {
    if constexpr (!std::is_same_v<T, C>) {
      for (size_t i = 0; i < buffer_.size(); ++i) dst[i] = static_cast<T>(buffer_[i]);
    }
  }

 private:
  std::vector<C> buffer_;
};

void attention_forward_cpu(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                           const AttentionParams& params) {
  const AttentionGeometry g = geometry_of(q, k, v);
  core::dispatch_floating(q.dtype(), "scaled_dot_product_attention", [&]<class T>() {
    using C = cpu::BlasCompute<T>;  // also lse's dtype
    const C scale = static_cast<C>(params.scale);
    PackedHead<T, C> head(g);
    std::vector<C> scores(g.tq * g.tk);
    GemmTarget<T, C> out_target(g.tq * g.value_dim);
    for (int64_t b = 0; b < g.count(); ++b) {
      head.load(g, b, q, k, v);
      // scores = q k^T, unscaled: the scale is applied inside the exponentials.
      cpu::gemm<C>(false, true, g.tq, g.tk, g.head_dim, head.q.data(), g.head_dim, head.k.data(), g.head_dim, C(0),
                   scores.data(), g.tk);
      C* row_lse = lse.data<C>() + b * g.tq;
      for (int64_t i = 0; i < g.tq; ++i) {
        const C* row = scores.data() + i * g.tk;
        const int64_t visible = g.visible(i, params.causal);
        C max_score = -std::numeric_limits<C>::infinity();
        for (int64_t j = 0; j < visible; ++j) max_score = std::max(max_score, row[j] * scale);
        C sum = 0;
        for (int64_t j = 0; j < visible; ++j) sum += std::exp(row[j] * scale - max_score);
        row_lse[i] = visible == 0 ? -std::numeric_limits<C>::infinity() : max_score + std::log(sum);
      }
      probabilities_from_lse(g, params.causal, scale, row_lse, scores.data());
      T* out_ptr = out.data<T>() + b * g.tq * g.value_dim;
      cpu::gemm<C>(false, false, g.tq, g.value_dim, g.tk, scores.data(), g.tk, head.v.data(), g.value_dim, C(0),
                   out_target.at(out_ptr), g.value_dim);
      out_target.store(out_ptr);
    }
  });
}

void attention_backward_cpu(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v, const Tensor& grad_out,
                            const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& /*out*/, const Tensor& lse,
                            const AttentionParams& params) {
  const AttentionGeometry g = geometry_of(q, k, v);
  core::dispatch_floating(q.dtype(), "scaled_dot_product_attention backward", [&]<class T>() {
    using C = cpu::BlasCompute<T>;
    const C scale = static_cast<C>(params.scale);
    PackedHead<T, C> head(g);
    std::vector<C> dout(g.tq * g.value_dim), probs(g.tq * g.tk), dscores(g.tq * g.tk);
    GemmTarget<T, C> dq_target(g.tq * g.head_dim), dk_target(g.tk * g.head_dim), dv_target(g.tk * g.value_dim);
    for (int64_t b = 0; b < g.count(); ++b) {
      head.load(g, b, q, k, v);
      cpu::pack_matrix(grad_out.data<T>() + b * g.tq * g.value_dim, g.tq, g.value_dim, g.value_dim, 1, dout.data());
      cpu::gemm<C>(false, true, g.tq, g.tk, g.head_dim, head.q.data(), g.head_dim, head.k.data(), g.head_dim, C(0),
                   probs.data(), g.tk);
      probabilities_from_lse(g, params.causal, scale, lse.data<C>() + b * g.tq, probs.data());

      // dv = p^T dout
      T* dv_ptr = grad_v.data<T>() + b * g.tk * g.value_dim;
      cpu::gemm<C>(true, false, g.tk, g.value_dim, g.tq, probs.data(), g.tk, dout.data(), g.value_dim, C(0),
                   dv_target.at(dv_ptr), g.value_dim);
      dv_target.store(dv_ptr);

      // dp = dout v^T, then the softmax backward with the scale folded in:
      // dscores = scale * p * (dp - rowsum(p * dp)). Masked keys have p = 0 and get nothing.
      cpu::gemm<C>(false, true, g.tq, g.tk, g.value_dim, dout.data(), g.value_dim, head.v.data(), g.value_dim, C(0),
                   dscores.data(), g.tk);
      for (int64_t i = 0; i < g.tq; ++i) {
        const C* p = probs.data() + i * g.tk;
        C* ds = dscores.data() + i * g.tk;
        C dot = 0;
        for (int64_t j = 0; j < g.tk; ++j) dot += p[j] * ds[j];
        for (int64_t j = 0; j < g.tk; ++j) ds[j] = scale * p[j] * (ds[j] - dot);
      }

      // dq = dscores k, dk = dscores^T q
      T* dq_ptr = grad_q.data<T>() + b * g.tq * g.head_dim;
      cpu::gemm<C>(false, false, g.tq, g.head_dim, g.tk, dscores.data(), g.tk, head.k.data(), g.head_dim, C(0),
                   dq_target.at(dq_ptr), g.head_dim);
      dq_target.store(dq_ptr);
      T* dk_ptr = grad_k.data<T>() + b * g.tk * g.head_dim;
      cpu::gemm<C>(true, false, g.tk, g.head_dim, g.tq, dscores.data(), g.tk, head.q.data(), g.head_dim, C(0),
                   dk_target.at(dk_ptr), g.head_dim);
      dk_target.store(dk_ptr);
    }
  });
}

COLOSSAL_REGISTER_KERNEL(attention_forward_stub, core::DeviceType::cpu, attention_forward_cpu);
COLOSSAL_REGISTER_KERNEL(attention_backward_stub, core::DeviceType::cpu, attention_backward_cpu);

}  // namespace
}  // namespace colossal::ops
