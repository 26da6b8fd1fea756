// CPU kernels core needs for itself: strided copy with dtype conversion, fill, and in-place
// accumulation for gradients.
#include <cstring>

#include "colossal/core/strided_loop.h"
#include "colossal/core/view.h"

namespace colossal::core {
namespace {

template <class To, class From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    // Compare in the source type: a double such as 1e-300 is nonzero but 0 as a float.
    if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
      return static_cast<float>(v) != 0.0f;
    } else {
      return v != From(0);
    }
  } else if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
    return static_cast<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

void copy_cpu(const Tensor& dst, const Tensor& src) {
  auto ops = make_strided_operands<2>(dst.shape(), {&dst, &src});
  dispatch_all(dst.dtype(), [&]<class To>() {
    dispatch_all(src.dtype(), [&]<class From>() {
      for_each_strided(ops, [](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
        if constexpr (std::is_same_v<To, From>) {
          if (s[0] == static_cast<int64_t>(sizeof(To)) && s[1] == static_cast<int64_t>(sizeof(From))) {
            std::memcpy(p[0], p[1], static_cast<size_t>(n) * sizeof(To));
            return;
          }
        }
        for (int64_t i = 0; i < n; ++i) {
          *reinterpret_cast<To*>(p[0] + i * s[0]) = convert<To>(*reinterpret_cast<const From*>(p[1] + i * s[1]));
        }
      });
    });
  });
}

void fill_cpu(const Tensor& dst, double value) {
  auto ops = make_strided_operands<1>(dst.shape(), {&dst});
  dispatch_all(dst.dtype(), [&]<class T>() {
    const T v = convert<T>(value);
    for_each_strided(ops, [v](std::array<char*, 1> p, std::array<int64_t, 1> s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
    });
  });
}

void accumulate_cpu(const Tensor& dst, const Tensor& src) {
  auto ops = make_strided_operands<2>(dst.shape(), {&dst, &src});
  dispatch_arithmetic(dst.dtype(), "accumulate", [&]<class T>() {
    for_each_strided(ops, [](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        T& d = *reinterpret_cast<T*>(p[0] + i * s[0]);
        d = static_cast<T>(static_cast<acc_t<T>>(d) + static_cast<acc_t<T>>(*reinterpret_cast<const T*>(p[1] + i * s[1])));
      }
    });
  });
}

COLOSSAL_REGISTER_KERNEL(copy_stub, DeviceType::cpu, copy_cpu);
COLOSSAL_REGISTER_KERNEL(fill_stub, DeviceType::cpu, fill_cpu);
COLOSSAL_REGISTER_KERNEL(accumulate_stub, DeviceType::cpu, accumulate_cpu);

}  // namespace
}  // namespace colossal::core
