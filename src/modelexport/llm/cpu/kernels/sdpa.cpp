// modelexport::sdpa.out: causal attention of the new tokens over an LLM's KV cache, for the
// ExecuTorch CPU runtime (fp32). Same contract as ExecuTorch's llama::custom_sdpa with
// is_causal=True and no mask:
//   query [1, n, >=H, D] (its first H heads are the queries: a fused q|k|v projection can be
//   passed as is), key/value cache [1, S, Hkv, D] (H a multiple of Hkv), start_pos p:
//   query token i (position p+i) attends to cache positions 0..p+i, scale 1/sqrt(D);
//   out [1, n, H, D].
// Why our own: llama::custom_sdpa calls a BLAS gemv per head and a scalar exp per score; on an
// AVX2 host without Intel's BLAS paths a SmolLM2 decode step spent ~15% of its time there at
// 60 positions and half of it at 400 (bench/experiments/cpu_kernels.py --option attention). Here the q heads
// that share a KV head are done one after the other on cached rows, the head size is a
// compile-time constant (q and the output accumulator stay in AVX2 registers), and exp is a
// polynomial on 8 lanes.
#include "kernel_common.h"

namespace modelexport_native {

// exp(x) for x <= 0 (scores minus their max): 2^k * p(r), r in [-ln2/2, ln2/2], degree-6
// polynomial (relative error < 2e-7, below float32 rounding of the softmax sums); `exp8` below
// is the same on 8 lanes.
static inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float k = std::nearbyint(x * 1.44269504088896341f);
  const float r = x - k * 0.693359375f + k * 2.12194440e-4f;
  float p = 1.3888949e-3f;
  p = p * r + 8.3333333e-3f;
  p = p * r + 4.1666667e-2f;
  p = p * r + 1.6666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

struct Shapes {
  int64_t n, heads, kv_heads, reps, dim;
  int64_t q_tok, q_head, k_pos, k_head, v_pos, v_head, o_tok, o_head;  // strides (elements)
};

// One (query token, KV head) pair: the `reps` q heads of that KV head over positions 0..len-1.
// Portable version, any head size; the AVX2 one below is used where it applies.
static void attend_generic(const Shapes& s, const float* q, const float* k, const float* v, float* out,
                           int64_t tok, int64_t g, int64_t len, float scale, std::vector<float>& scores) {
  const int64_t reps = s.reps, d = s.dim;
  scores.resize(static_cast<size_t>(reps * len));
  for (int64_t r = 0; r < reps; ++r) {
    const float* qr = q + tok * s.q_tok + (g * reps + r) * s.q_head;
    float* sr = scores.data() + r * len;
    for (int64_t j = 0; j < len; ++j) {
      const float* kj = k + j * s.k_pos + g * s.k_head;
      float acc = 0.f;
      for (int64_t e = 0; e < d; ++e) acc += qr[e] * kj[e];
      sr[j] = acc * scale;
    }
    float m = sr[0];
    for (int64_t j = 1; j < len; ++j) m = std::max(m, sr[j]);
    float sum = 0.f;
    for (int64_t j = 0; j < len; ++j) sum += (sr[j] = exp_nonpositive(sr[j] - m));
    float* o = out + tok * s.o_tok + (g * reps + r) * s.o_head;
    for (int64_t e = 0; e < d; ++e) o[e] = 0.f;
    for (int64_t j = 0; j < len; ++j) {
      const float* vj = v + j * s.v_pos + g * s.v_head;
      for (int64_t e = 0; e < d; ++e) o[e] += sr[j] * vj[e];
    }
    for (int64_t e = 0; e < d; ++e) o[e] /= sum;
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// exp_nonpositive on 8 lanes (same polynomial)
static inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.3888949e-3f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3333333e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1666667e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666667e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// D (head size) known at compile time: q and the output accumulator live in registers.
template <int D>
static void attend_avx2(const Shapes& s, const float* q, const float* k, const float* v, float* out,
                        int64_t tok, int64_t g, int64_t len, float scale, std::vector<float>& scores) {
  constexpr int V = D / 8;
  const int64_t reps = s.reps;
  scores.resize(static_cast<size_t>(reps * len + 8));
  for (int64_t r = 0; r < reps; ++r) {
    const float* qr = q + tok * s.q_tok + (g * reps + r) * s.q_head;
    __m256 qv[V];
    for (int i = 0; i < V; ++i) qv[i] = _mm256_mul_ps(_mm256_loadu_ps(qr + 8 * i), _mm256_set1_ps(scale));
    float* sr = scores.data() + r * len;
    // q . k_j, two accumulators per position (short dependency chains)
    int64_t j = 0;
    for (; j < len; ++j) {
      const float* kj = k + j * s.k_pos + g * s.k_head;
      __m256 a0 = _mm256_mul_ps(qv[0], _mm256_loadu_ps(kj));
      __m256 a1 = V > 1 ? _mm256_mul_ps(qv[1], _mm256_loadu_ps(kj + 8)) : _mm256_setzero_ps();
      for (int i = 2; i < V; i += 2) {
        a0 = _mm256_fmadd_ps(qv[i], _mm256_loadu_ps(kj + 8 * i), a0);
        if (i + 1 < V) a1 = _mm256_fmadd_ps(qv[i + 1], _mm256_loadu_ps(kj + 8 * i + 8), a1);
      }
      sr[j] = hsum(_mm256_add_ps(a0, a1));
    }
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (j = 0; j + 8 <= len; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(sr + j));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    float m = sr[0];
    for (float x : lanes) m = std::max(m, x);
    for (; j < len; ++j) m = std::max(m, sr[j]);
    // p_j = exp(s_j - max), sum
    const __m256 mv = _mm256_set1_ps(m);
    __m256 vsum = _mm256_setzero_ps();
    for (j = 0; j + 8 <= len; j += 8) {
      const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(sr + j), mv));
      _mm256_storeu_ps(sr + j, p);
      vsum = _mm256_add_ps(vsum, p);
    }
    float sum = hsum(vsum);
    for (; j < len; ++j) sum += (sr[j] = exp_nonpositive(sr[j] - m));
    // out = sum_j p_j v_j / sum
    __m256 acc[V];
    for (int i = 0; i < V; ++i) acc[i] = _mm256_setzero_ps();
    for (j = 0; j < len; ++j) {
      const float* vj = v + j * s.v_pos + g * s.v_head;
      const __m256 p = _mm256_set1_ps(sr[j]);
      for (int i = 0; i < V; ++i) acc[i] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 8 * i), acc[i]);
    }
    const __m256 inv = _mm256_set1_ps(1.f / sum);
    float* o = out + tok * s.o_tok + (g * reps + r) * s.o_head;
    for (int i = 0; i < V; ++i) _mm256_storeu_ps(o + 8 * i, _mm256_mul_ps(acc[i], inv));
  }
}
#endif

using AttendFn = void (*)(const Shapes&, const float*, const float*, const float*, float*, int64_t, int64_t,
                          int64_t, float, std::vector<float>&);

static AttendFn pick_attend(int64_t dim) {
#if defined(__AVX2__) && defined(__FMA__)
  switch (dim) {
    case 32: return attend_avx2<32>;
    case 64: return attend_avx2<64>;
    case 128: return attend_avx2<128>;
    default: break;
  }
#endif
  return attend_generic;
}

Tensor& sdpa_out(KernelRuntimeContext& ctx, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                 int64_t start_pos, int64_t q_heads, Tensor& out) {
  ET_KERNEL_CHECK_MSG(ctx, q.scalar_type() == ScalarType::Float && k_cache.scalar_type() == ScalarType::Float &&
                               v_cache.scalar_type() == ScalarType::Float,
                      InvalidArgument, out, "modelexport::sdpa: float32 tensors only");
  ET_KERNEL_CHECK_MSG(ctx, q.dim() == 4 && k_cache.dim() == 4 && v_cache.dim() == 4 && q.size(0) == 1,
                      InvalidArgument, out, "modelexport::sdpa: query [1,n,H,D] and caches [1,S,Hkv,D] expected");
  const int64_t n = q.size(1), heads = q_heads, dim = q.size(3);
  ET_KERNEL_CHECK_MSG(ctx, heads > 0 && heads <= q.size(2), InvalidArgument, out,
                      "modelexport::sdpa: q_heads must be in 1..query.size(2)");
  const int64_t kv_heads = k_cache.size(2), max_len = k_cache.size(1);
  ET_KERNEL_CHECK_MSG(ctx, kv_heads > 0 && heads % kv_heads == 0 && k_cache.size(3) == dim && v_cache.size(3) == dim &&
                               v_cache.size(2) == kv_heads && v_cache.size(1) == max_len,
                      InvalidArgument, out, "modelexport::sdpa: unsupported head layout");
  ET_KERNEL_CHECK_MSG(ctx, start_pos >= 0 && start_pos + n <= max_len, InvalidArgument, out,
                      "modelexport::sdpa: start_pos + n is beyond the KV cache");
  ET_KERNEL_CHECK_MSG(ctx, q.strides()[3] == 1 && k_cache.strides()[3] == 1 && v_cache.strides()[3] == 1, InvalidArgument,
                      out, "modelexport::sdpa: head_dim must be contiguous");
  const executorch::aten::SizesType out_sizes[4] = {1, static_cast<executorch::aten::SizesType>(n),
                                                    static_cast<executorch::aten::SizesType>(heads),
                                                    static_cast<executorch::aten::SizesType>(dim)};
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {out_sizes, 4}) == Error::Ok, InvalidArgument, out);

  Shapes s{n, heads, kv_heads, heads / kv_heads, dim,
           q.strides()[1], q.strides()[2], k_cache.strides()[1], k_cache.strides()[2],
           v_cache.strides()[1], v_cache.strides()[2], out.strides()[1], out.strides()[2]};
  const float* qd = q.const_data_ptr<float>();
  const float* kd = k_cache.const_data_ptr<float>();
  const float* vd = v_cache.const_data_ptr<float>();
  float* od = out.mutable_data_ptr<float>();
  const float scale = 1.f / std::sqrt(static_cast<float>(dim));

  const int64_t tasks = n * kv_heads;
  const AttendFn attend = pick_attend(dim);
  auto run = [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t tok = t / kv_heads, g = t % kv_heads;
      attend(s, qd, kd, vd, od, tok, g, start_pos + tok + 1, scale, scores);
    }
  };
  // Waking the thread pool costs more than a short decode step's attention: only long work is split.
  const int64_t work = n * heads * (start_pos + n);
  if (work < 8192) {
    run(0, tasks);
  } else {
    executorch::extension::parallel_for(0, tasks, 1, run);
  }
  return out;
}

}  // namespace modelexport_native

EXECUTORCH_LIBRARY(modelexport, "sdpa.out", modelexport_native::sdpa_out);
