// What every kernel of ours includes: ExecuTorch's kernel API and thread pool, the types we use
// from it, and the AVX2 helpers the kernels share.
#pragma once

#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace modelexport_native {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::KernelRuntimeContext;

#if defined(__AVX2__) && defined(__FMA__)
// the sum of 8 float lanes
static inline float hsum(__m256 x) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
#endif

// fn(begin, end) over 0..tasks on every thread of ExecuTorch's pool, each thread claiming the
// next few tasks as it gets free. ExecuTorch's parallel_for cuts the range into one fixed part
// per thread, so a step waits for its slowest thread (a worker woken late, a core shared with
// another process); claimed chunks let the others take over its share.
template <class Fn>
static void parallel_chunks(int64_t tasks, const Fn& fn) {
  const int64_t threads = std::max<int64_t>(1, executorch::extension::get_thread_count());
  if (threads == 1 || tasks < 2) return fn(0, tasks);
  const int64_t chunk = std::max<int64_t>(1, tasks / (threads * 8));
  std::atomic<int64_t> next{0};
  executorch::extension::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t b = next.fetch_add(chunk, std::memory_order_relaxed); b < tasks;
         b = next.fetch_add(chunk, std::memory_order_relaxed))
      fn(b, std::min(tasks, b + chunk));
  });
}

}  // namespace modelexport_native
