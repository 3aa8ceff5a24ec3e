#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace tachyon {

namespace {
int initial_threads() {
  if (const char* env = std::getenv("TACHYON_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
int& thread_count() {
  static int n = initial_threads();
  return n;
}
}  // namespace

int num_threads() { return thread_count(); }

void set_num_threads(int n) { thread_count() = std::max(1, n); }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), max_chunks));
  if (threads <= 1) {
    fn(0, n);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num();
    const int64_t nt = omp_get_num_threads();
    const int64_t begin = n * t / nt;
    const int64_t end = n * (t + 1) / nt;
    if (begin < end) fn(begin, end);
  }
#else
  fn(0, n);
#endif
}

}  // namespace tachyon
