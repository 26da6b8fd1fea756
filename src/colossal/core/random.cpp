// The default generator, random factories and their CPU kernel.
#include "colossal/core/random.h"

#include <cmath>

#include "colossal/core/parallel_for.h"
#include "colossal/core/philox.h"
#include "colossal/core/view.h"

namespace colossal::core {

constinit DispatchStub<RandomFillKernel> random_fill_stub("random_fill");

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}
void manual_seed(uint64_t seed) {
  default_generator().manual_seed(seed);
}

namespace {

constexpr int kUniform = 0;
constexpr int kNormal = 1;

Tensor& random_fill(Tensor& t, int kind, double a, double b, Generator* gen, const char* op) {
  COLOSSAL_CHECK(is_floating(t.dtype()), "{}: needs a floating tensor, got {}", op, t.dtype());
  Generator& g = gen ? *gen : default_generator();
  const uint64_t offset = g.next_offset();
  if (t.numel() == 0) return t;
  Tensor target = t.is_contiguous() ? t : empty(t.shape(), TensorOptions(t.dtype(), t.device()));
  random_fill_stub(t.device(), target, g.seed(), offset, kind, a, b);
  if (!target.is_same(t)) t.copy_(target);
  return t;
}

// Element i of a draw: a uniform from word i%4 of block i/4 (f32-like) or from a 64-bit pair
// (f64). A normal pairs elements 2j and 2j+1 through Box-Muller on the same two uniforms.
template <class T>
void random_fill_cpu_typed(T* out, int64_t n, uint64_t seed, uint64_t offset, int kind, double a, double b) {
  constexpr bool kDouble = std::is_same_v<T, double>;
  parallel_for(0, (n + 3) / 4, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const PhiloxBlock r = philox_block(seed, offset, static_cast<uint64_t>(block));
      const PhiloxBlock r2 = kDouble ? philox_block(seed, offset ^ (1ull << 63), static_cast<uint64_t>(block)) : r;
      double u[4];
      for (int w = 0; w < 4; ++w) {
        u[w] = kDouble ? uniform_double(r.x[w], r2.x[w]) : static_cast<double>(uniform_float(r.x[w]));
      }
      double v[4];
      if (kind == kUniform) {
        for (int w = 0; w < 4; ++w) v[w] = a + (b - a) * u[w];
      } else {
        for (int w = 0; w < 4; w += 2) {
          // 1 - u lies in (0, 1], so the log is finite.
          const double radius = std::sqrt(-2.0 * std::log(1.0 - u[w]));
          const double angle = 2.0 * 3.14159265358979323846 * u[w + 1];
          v[w] = a + b * radius * std::cos(angle);
          v[w + 1] = a + b * radius * std::sin(angle);
        }
      }
      for (int w = 0; w < 4; ++w) {
        const int64_t i = block * 4 + w;
        if (i < n) out[i] = kind == kUniform ? store_uniform<T>(v[w], b) : static_cast<T>(static_cast<acc_t<T>>(v[w]));
      }
    }
  });
}

void random_fill_cpu(const Tensor& t, uint64_t seed, uint64_t offset, int kind, double a, double b) {
  dispatch_floating(t.dtype(), "random",
                    [&]<class T>() { random_fill_cpu_typed<T>(t.data<T>(), t.numel(), seed, offset, kind, a, b); });
}
COLOSSAL_REGISTER_KERNEL(random_fill_stub, DeviceType::cpu, random_fill_cpu);

}  // namespace

Tensor& uniform_(Tensor& t, double low, double high, Generator* gen) {
  COLOSSAL_CHECK(low <= high, "uniform_: low {} must not exceed high {}", low, high);
  return random_fill(t, kUniform, low, high, gen, "uniform_");
}
Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  COLOSSAL_CHECK(std >= 0.0, "normal_: std must be >= 0, got {}", std);
  return random_fill(t, kNormal, mean, std, gen, "normal_");
}

Tensor rand(const Shape& shape, TensorOptions options, Generator* gen) {
  Tensor t = empty(shape, options.with_requires_grad(false));
  uniform_(t, 0.0, 1.0, gen);
  if (options.requires_grad) t.set_requires_grad(true);
  return t;
}
Tensor randn(const Shape& shape, TensorOptions options, Generator* gen) {
  Tensor t = empty(shape, options.with_requires_grad(false));
  normal_(t, 0.0, 1.0, gen);
  if (options.requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options, Generator* gen) {
  COLOSSAL_CHECK(low < high, "randint: empty range [{}, {})", low, high);
  Tensor u = empty(shape, TensorOptions(DType::f64));
  uniform_(u, 0.0, 1.0, gen);
  Tensor ints = empty(shape, DType::i64);
  const double* src = u.data<double>();
  int64_t* dst = ints.data<int64_t>();
  const double span = static_cast<double>(high - low);
  for (int64_t i = 0; i < u.numel(); ++i) dst[i] = std::min(high - 1, low + static_cast<int64_t>(src[i] * span));
  return options.dtype == DType::i64 && options.device.is_cpu()
             ? ints
             : to_device_raw(cast_raw(ints, options.dtype), options.device);
}

}  // namespace colossal::core
