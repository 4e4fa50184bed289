#include "thread_count.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <omp.h>

#include <atomic>

#include "../kernels/vector_math.h"

namespace torchneuron {
namespace {
std::atomic<int> host_count{0};  // 0: not reported yet; threads keep their own
} // namespace

void set_host_thread_count(int n) {
  TORCH_CHECK(n > 0, "the host's intra-op thread count must be positive, got ", n);
  host_count.store(n, std::memory_order_relaxed);
}

void follow_host_thread_count() {
  thread_local int applied = 0;
  const int n = host_count.load(std::memory_order_relaxed);
  if (n == applied || n == 0) return;
  // ATen's first-use setup of this thread would otherwise override the count later.
  at::internal::lazy_init_num_threads();
  // What at::set_num_threads does for its calling thread, without its global
  // effects (the process-wide count, oneDNN's primitive cache).
  omp_set_num_threads(n);
  vector_math::set_mkl_threads_of_this_thread(n);
  applied = n;
}

} // namespace torchneuron
