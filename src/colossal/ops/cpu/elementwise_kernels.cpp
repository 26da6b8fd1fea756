// CPU kernels of the elementwise ops. Each functor computes in acc_t<T> (f32 for f16/bf16); the
// loop has a contiguous fast path the compiler vectorises and a strided fallback.
#include <cmath>
#include <type_traits>

#include "colossal/core/strided_loop.h"
#include "colossal/ops/elementwise_kernels.h"

namespace colossal::ops {
namespace {

using core::acc_t;

template <size_t N, class Out, class F>
void run_loop(const core::StridedOperands<N>& operands, F f) {
  core::for_each_strided(operands, [&f](std::array<char*, N> p, std::array<int64_t, N> s, int64_t n) {
    bool contiguous = s[0] == static_cast<int64_t>(sizeof(Out));
    for (size_t k = 1; k < N; ++k) contiguous = contiguous && s[k] == static_cast<int64_t>(sizeof(Out));
    if (contiguous) {
      f.template contiguous<N>(p, n);
    } else {
      f.template strided<N>(p, s, n);
    }
  });
}

/// Adapts a per-element functor `op(acc...) -> acc` over In operands into the loop protocol.
template <class Out, class In, class Op>
struct ElementLoop {
  Op op;
  template <size_t N>
  void contiguous(std::array<char*, N> p, int64_t n) const {
    Out* out = reinterpret_cast<Out*>(p[0]);
    if constexpr (N == 2) {
      const In* x = reinterpret_cast<const In*>(p[1]);
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Out>(op(static_cast<acc_t<In>>(x[i])));
    } else if constexpr (N == 3) {
      const In* x = reinterpret_cast<const In*>(p[1]);
      const In* y = reinterpret_cast<const In*>(p[2]);
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Out>(op(static_cast<acc_t<In>>(x[i]), static_cast<acc_t<In>>(y[i])));
    } else {
      const In* x = reinterpret_cast<const In*>(p[1]);
      const In* y = reinterpret_cast<const In*>(p[2]);
      const In* z = reinterpret_cast<const In*>(p[3]);
      for (int64_t i = 0; i < n; ++i) {
        out[i] = static_cast<Out>(op(static_cast<acc_t<In>>(x[i]), static_cast<acc_t<In>>(y[i]), static_cast<acc_t<In>>(z[i])));
      }
    }
  }
  template <size_t N>
  void strided(std::array<char*, N> p, std::array<int64_t, N> s, int64_t n) const {
    auto at = [&](size_t k, int64_t i) { return static_cast<acc_t<In>>(*reinterpret_cast<const In*>(p[k] + i * s[k])); };
    for (int64_t i = 0; i < n; ++i) {
      Out& out = *reinterpret_cast<Out*>(p[0] + i * s[0]);
      if constexpr (N == 2) {
        out = static_cast<Out>(op(at(1, i)));
      } else if constexpr (N == 3) {
        out = static_cast<Out>(op(at(1, i), at(2, i)));
      } else {
        out = static_cast<Out>(op(at(1, i), at(2, i), at(3, i)));
      }
    }
  }
};

template <class Out, class In, size_t N, class Op>
void apply(const core::StridedOperands<N>& operands, Op op) {
  // Comparisons read In but write Out; the contiguous test in run_loop assumes equal sizes.
  if constexpr (sizeof(Out) == sizeof(In)) {
    run_loop<N, Out>(operands, ElementLoop<Out, In, Op>{op});
  } else {
    core::for_each_strided(operands, [&op](std::array<char*, N> p, std::array<int64_t, N> s, int64_t n) {
      ElementLoop<Out, In, Op>{op}.template strided<N>(p, s, n);
    });
  }
}

// Floating conversions to Half/BFloat16 go through float; everything else is a static_cast.
template <class T, class A>
T to(A v) {
  if constexpr (std::is_same_v<T, core::Half> || std::is_same_v<T, core::BFloat16>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

void binary_cpu(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, double alpha) {
  auto operands = core::make_strided_operands<3>(out.shape(), {&out, &a, &b});
  core::dispatch_all(a.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    if constexpr (std::is_same_v<T, bool>) {
      auto cmp = [&]<class F>(F f) { apply<bool, bool, 3>(operands, f); };
      switch (op) {
        case BinaryOp::eq: return cmp([](bool x, bool y) { return x == y; });
        case BinaryOp::ne: return cmp([](bool x, bool y) { return x != y; });
        case BinaryOp::lt: return cmp([](bool x, bool y) { return x < y; });
        case BinaryOp::le: return cmp([](bool x, bool y) { return x <= y; });
        case BinaryOp::gt: return cmp([](bool x, bool y) { return x > y; });
        case BinaryOp::ge: return cmp([](bool x, bool y) { return x >= y; });
        default: COLOSSAL_FAIL("elementwise op {} is not defined for bool", static_cast<int>(op));
      }
    } else {
      const A alpha_a = static_cast<A>(alpha);
      auto arith = [&]<class F>(F f) {
        apply<T, T, 3>(operands, [f](A x, A y) { return to<T>(f(x, y)); });
      };
      auto cmp = [&]<class F>(F f) { apply<bool, T, 3>(operands, f); };
      switch (op) {
        case BinaryOp::add:
          if (alpha == 1.0) return arith([](A x, A y) { return x + y; });
          return arith([alpha_a](A x, A y) { return x + alpha_a * y; });
        case BinaryOp::sub:
          if (alpha == 1.0) return arith([](A x, A y) { return x - y; });
          return arith([alpha_a](A x, A y) { return x - alpha_a * y; });
        case BinaryOp::mul: return arith([](A x, A y) { return x * y; });
        case BinaryOp::div:
          if constexpr (std::is_integral_v<A>) {
            return arith([](A x, A y) { return y == 0 ? A(0) : static_cast<A>(x / y); });
          } else {
            return arith([](A x, A y) { return x / y; });
          }
        case BinaryOp::pow: return arith([](A x, A y) { return static_cast<A>(std::pow(x, y)); });
        case BinaryOp::maximum: return arith([](A x, A y) { return std::isnan(static_cast<double>(x)) || x > y ? x : y; });
        case BinaryOp::minimum: return arith([](A x, A y) { return std::isnan(static_cast<double>(x)) || x < y ? x : y; });
        case BinaryOp::eq: return cmp([](A x, A y) { return x == y; });
        case BinaryOp::ne: return cmp([](A x, A y) { return x != y; });
        case BinaryOp::lt: return cmp([](A x, A y) { return x < y; });
        case BinaryOp::le: return cmp([](A x, A y) { return x <= y; });
        case BinaryOp::gt: return cmp([](A x, A y) { return x > y; });
        case BinaryOp::ge: return cmp([](A x, A y) { return x >= y; });
      }
    }
  });
}

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kInvSqrt2 = 0.70710678118654752440;     // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1 / sqrt(2 pi)
constexpr double kGeluTanhCubic = 0.044715;

void unary_cpu(UnaryOp op, const Tensor& out, const Tensor& x, double p0, double p1) {
  auto operands = core::make_strided_operands<2>(out.shape(), {&out, &x});
  core::dispatch_arithmetic(x.dtype(), "unary", [&]<class T>() {
    using A = acc_t<T>;
    auto run = [&]<class F>(F f) {
      apply<T, T, 2>(operands, [f](A v) { return to<T>(f(v)); });
    };
    const A a0 = static_cast<A>(p0);
    const A a1 = static_cast<A>(p1);
    switch (op) {
      case UnaryOp::neg: return run([](A v) { return static_cast<A>(-v); });
      case UnaryOp::abs: return run([](A v) { return v < A(0) ? static_cast<A>(-v) : v; });
      case UnaryOp::relu: return run([](A v) { return v > A(0) ? v : A(0); });
      case UnaryOp::clamp: return run([a0, a1](A v) { return v < a0 ? a0 : (v > a1 ? a1 : v); });
      case UnaryOp::affine:
        if (p1 == 0.0) return run([a0](A v) { return static_cast<A>(v * a0); });
        if (p0 == 1.0) return run([a1](A v) { return static_cast<A>(v + a1); });
        return run([a0, a1](A v) { return static_cast<A>(v * a0 + a1); });
      default: break;
    }
    if constexpr (std::is_floating_point_v<A>) {
      switch (op) {
        case UnaryOp::exp: return run([](A v) { return std::exp(v); });
        case UnaryOp::log: return run([](A v) { return std::log(v); });
        case UnaryOp::tanh: return run([](A v) { return std::tanh(v); });
        case UnaryOp::sqrt: return run([](A v) { return std::sqrt(v); });
        case UnaryOp::rsqrt: return run([](A v) { return A(1) / std::sqrt(v); });
        case UnaryOp::sigmoid: return run([](A v) { return A(1) / (A(1) + std::exp(-v)); });
        case UnaryOp::silu: return run([](A v) { return v / (A(1) + std::exp(-v)); });
        case UnaryOp::gelu: return run([](A v) { return A(0.5) * v * (A(1) + std::erf(v * A(kInvSqrt2))); });
        case UnaryOp::gelu_tanh:
          return run([](A v) {
            return A(0.5) * v * (A(1) + std::tanh(A(kSqrt2OverPi) * (v + A(kGeluTanhCubic) * v * v * v)));
          });
        case UnaryOp::pow_scalar:
          if (p0 == 2.0) return run([](A v) { return v * v; });
          return run([a0](A v) { return std::pow(v, a0); });
        default: break;
      }
    }
    COLOSSAL_FAIL("elementwise op {} is not defined for {}", static_cast<int>(op), x.dtype());
  });
}

void unary_backward_cpu(UnaryOp op, const Tensor& grad_x, const Tensor& grad_y, const Tensor& x, const Tensor& y, double p0,
                        double p1) {
  auto operands = core::make_strided_operands<4>(grad_x.shape(), {&grad_x, &grad_y, &x, &y});
  core::dispatch_floating(x.dtype(), "unary backward", [&]<class T>() {
    using A = acc_t<T>;
    const A a0 = static_cast<A>(p0);
    const A a1 = static_cast<A>(p1);
    // f(g, x, y) -> dL/dx
    auto run = [&]<class F>(F f) {
      apply<T, T, 4>(operands, [f](A g, A xv, A yv) { return to<T>(f(g, xv, yv)); });
    };
    switch (op) {
      case UnaryOp::neg: return run([](A g, A, A) { return -g; });
      case UnaryOp::affine: return run([a0](A g, A, A) { return g * a0; });
      case UnaryOp::exp: return run([](A g, A, A yv) { return g * yv; });
      case UnaryOp::log: return run([](A g, A xv, A) { return g / xv; });
      case UnaryOp::tanh: return run([](A g, A, A yv) { return g * (A(1) - yv * yv); });
      case UnaryOp::sqrt: return run([](A g, A, A yv) { return g * A(0.5) / yv; });
      case UnaryOp::rsqrt: return run([](A g, A, A yv) { return g * A(-0.5) * yv * yv * yv; });
      case UnaryOp::abs: return run([](A g, A xv, A) { return xv > A(0) ? g : (xv < A(0) ? -g : A(0)); });
      case UnaryOp::relu: return run([](A g, A xv, A) { return xv > A(0) ? g : A(0); });
      case UnaryOp::clamp: return run([a0, a1](A g, A xv, A) { return xv >= a0 && xv <= a1 ? g : A(0); });
      case UnaryOp::sigmoid: return run([](A g, A, A yv) { return g * yv * (A(1) - yv); });
      case UnaryOp::silu:
        return run([](A g, A xv, A) {
          const A s = A(1) / (A(1) + std::exp(-xv));
          return g * s * (A(1) + xv * (A(1) - s));
        });
      case UnaryOp::gelu:
        return run([](A g, A xv, A) {
          const A cdf = A(0.5) * (A(1) + std::erf(xv * A(kInvSqrt2)));
          const A pdf = A(kInvSqrt2Pi) * std::exp(A(-0.5) * xv * xv);
          return g * (cdf + xv * pdf);
        });
      case UnaryOp::gelu_tanh:
        return run([](A g, A xv, A) {
          const A inner = A(kSqrt2OverPi) * (xv + A(kGeluTanhCubic) * xv * xv * xv);
          const A t = std::tanh(inner);
          const A dinner = A(kSqrt2OverPi) * (A(1) + A(3 * kGeluTanhCubic) * xv * xv);
          return g * (A(0.5) * (A(1) + t) + A(0.5) * xv * (A(1) - t * t) * dinner);
        });
      case UnaryOp::pow_scalar:
        if (p0 == 2.0) return run([](A g, A xv, A) { return g * A(2) * xv; });
        return run([a0](A g, A xv, A) { return a0 == A(0) ? A(0) : g * a0 * std::pow(xv, a0 - A(1)); });
    }
  });
}

void ternary_cpu(TernaryOp op, const Tensor& out, const Tensor& b, const Tensor& c, double value) {
  auto operands = core::make_strided_operands<4>(out.shape(), {&out, &out, &b, &c});
  core::dispatch_floating(out.dtype(), "ternary", [&]<class T>() {
    using A = acc_t<T>;
    const A v = static_cast<A>(value);
    if (op == TernaryOp::addcmul) {
      apply<T, T, 4>(operands, [v](A a, A bv, A cv) { return to<T>(a + v * bv * cv); });
    } else {
      apply<T, T, 4>(operands, [v](A a, A bv, A cv) { return to<T>(a + v * bv / cv); });
    }
  });
}

COLOSSAL_REGISTER_KERNEL(binary_stub, core::DeviceType::cpu, binary_cpu);
COLOSSAL_REGISTER_KERNEL(unary_stub, core::DeviceType::cpu, unary_cpu);
COLOSSAL_REGISTER_KERNEL(unary_backward_stub, core::DeviceType::cpu, unary_backward_cpu);
COLOSSAL_REGISTER_KERNEL(ternary_stub, core::DeviceType::cpu, ternary_cpu);

}  // namespace
}  // namespace colossal::ops
