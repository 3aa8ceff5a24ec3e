// Parallel loops for CPU kernels. Backed by OpenMP so every kernel shares one set of worker
// threads; the thread count is set once (`set_num_threads`, or OMP_NUM_THREADS/TACHYON_THREADS).
#pragma once

#include <cstdint>
#include <functional>

namespace tachyon {

int num_threads();
void set_num_threads(int n);

// Splits [0, n) into contiguous chunks of at least `grain` items and runs
// fn(begin, end) on the worker threads. Runs inline when n <= grain or one thread.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace tachyon
