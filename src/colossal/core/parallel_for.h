// parallel_for: splits [begin, end) into one contiguous chunk per OpenMP thread when the range is
// worth it. The split depends only on the range and the thread count, so results that combine
// per-chunk partials are reproducible run to run on the same machine.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace colossal::core {

/// Work below this many elements runs on the calling thread: thread start-up costs more than it saves.
inline constexpr int64_t kParallelGrain = 32768;

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& f) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  if (n <= grain || omp_in_parallel() || omp_get_max_threads() == 1) {
    f(begin, end);
    return;
  }
  const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(grain, 1));
  const int threads = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), max_chunks));
#pragma omp parallel num_threads(threads)
  {
    const int64_t nt = omp_get_num_threads();
    const int64_t tid = omp_get_thread_num();
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t b = begin + tid * chunk;
    const int64_t e = std::min(end, b + chunk);
    if (b < e) f(b, e);
  }
}

}  // namespace colossal::core
