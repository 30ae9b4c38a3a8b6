// modelexport::linear_q4.out / swiglu_q4.out / linear_q8.out / swiglu_q8.out: y = x W^T (+ bias) with W stored
// per block of 32 input channels, for the ExecuTorch CPU runtime.
//   x float [..., K] (rows contiguous), K a multiple of 32;
//   4-bit weight uint8 [N, K/2]: row o, block b (32 input channels) is 16 bytes; byte j holds
//     u[32b + j] in its low nibble and u[32b + 16 + j] in its high one (u in 0..15: the layout of
//     a GGUF Q4_0/Q4_1 block's qs);
//   scales d [N, K/32] bfloat16, float16 or float32, and optional mins m [N, K/32] of the same
//     type: W[o, 32b + i] = d * u + m (GGUF Q4_1; Q4_K with float32 d = super-scale x sub-scale,
//     which float16 cannot hold exactly), or d * (u - 8) without mins (Q4_0, and our own
//     symmetric 4-bit from float weights);
//   8-bit weight int8 [N, K] (linear_q8): W = d * q (GGUF Q8_0, Q5_0 as q - 16), or d * q + m
//     with mins (Q5_1, Q5_K), the values of each pair of blocks stored in the order the
//     activations are (`value_index`);
//   bias float [N] or none; out float [..., N];
//   optionally an RMSNorm first (norm_weight float [K], eps: x <- x * rsqrt(mean(x^2) + eps) * g,
//   as the layer's norm would do before the projection) and a residual added after (float
//   [..., N]): a Llama block is then norm+qkv, attention, o+residual, norm+gate|up, down+residual.
// The activations are quantized on the fly to int8 per block of 32 (symmetric, scale max|x|/127,
// as llama.cpp's Q8_0/Q8_1), so a block's dot product is exact in int32 and then scaled once; the
// min term is m * (the block's quantized sum), as llama.cpp's Q4_1 x Q8_1 dot product does.
// Why our own: XNNPACK's AVX2 kernel for block-wise 4-bit weights (qd8-f32-qb4w 1x8c8) widens
// every weight to 16 bits and was ~70% of a SmolLM2 decode step, and it has no per-block min nor
// per-block 8-bit weights. With one token the work is reading the weights: here two blocks (64
// weights) cost one load, two byte-wise multiply-adds (maddubs) and a few more instructions, the
// next rows are prefetched, and the step is memory-bound (bench/experiments/cpu_kernels.py --option linear).
#include "kernel_common.h"

namespace modelexport_native {

constexpr int64_t kBlock = 32;

static inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

static inline float f16_to_float(uint16_t h) {   // IEEE half, subnormals included
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(man), -24);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    bits |= sign;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }
  const uint32_t bits = sign | (exp == 31 ? (0xFFu << 23) | (man << 13) : ((exp + 112) << 23) | (man << 13));
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// How a weight block's values become weights: where the min comes from.
enum class Layout { kQ4Sym, kQ4Min, kQ8, kQ8Min };     // d*(u-8) | d*u + m | d*q | d*q + m
enum class ScaleType { kBF16, kF16, kF32 };

static inline bool is_q8(Layout l) { return l == Layout::kQ8 || l == Layout::kQ8Min; }
static inline bool has_mins(Layout l) { return l == Layout::kQ4Min || l == Layout::kQ8Min; }

static inline float scale_at(const void* p, int64_t i, ScaleType t) {
  switch (t) {
    case ScaleType::kF32: return static_cast<const float*>(p)[i];
    case ScaleType::kF16: return f16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
}

struct BlockScales {
  const void* d;            // [rows, blocks] of `type`
  const void* m;            // [rows, blocks] mins (kQ4Min, kQ8Min) or null
  ScaleType type;
  Layout layout;

  float scale(int64_t i) const { return scale_at(d, i, type); }
  float min(int64_t i) const {
    switch (layout) {
      case Layout::kQ4Min:
      case Layout::kQ8Min: return scale_at(m, i, type);
      case Layout::kQ4Sym: return -8.f * scale(i);
      default: return 0.f;
    }
  }
  BlockScales rows_from(int64_t r, int64_t blocks) const {
    const int64_t at = r * blocks * (type == ScaleType::kF32 ? 4 : 2);
    return {static_cast<const char*>(d) + at, m ? static_cast<const char*>(m) + at : nullptr, type, layout};
  }
};

// One token's activations, quantized per block of 32: int8 values (in the order the AVX2 loop
// reads them: per pair of blocks, the first 16 values of each, then the last 16 of each), each
// block's scale, and its quantized sum (scale x the sum of its values: what a block's min
// multiplies).
struct QuantRow {
  const int8_t* q;
  const float* scale;
  const float* sum;
};

static inline int64_t value_index(int64_t b, int i) {   // where value i of block b is stored
  const int64_t pair = b / 2, second = b % 2;
  return pair * 64 + (i < 16 ? 0 : 32) + second * 16 + (i % 16);
}

static void quantize_row(const float* x, int64_t k, int8_t* q, float* scale, float* sum_out) {
  const int64_t blocks = k / kBlock;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kBlock;
#if defined(__AVX2__) && defined(__FMA__)
    // the same arithmetic on 8 lanes (cvtps rounds to nearest even, as nearbyint does), the
    // block's two halves stored where value_index puts them
    __m256 v[4];
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i] = _mm256_loadu_ps(xb + 8 * i)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    const float d = amax / 127.f;
    const __m256 inv = _mm256_set1_ps(d > 0.f ? 1.f / d : 0.f);
    __m256i qi[4];
    for (int i = 0; i < 4; ++i) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
    const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1));
    const __m256i q16a = _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[0], qi[1]), 0xD8);   // values 0..15
    const __m256i q16b = _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[2], qi[3]), 0xD8);   // 16..31
    const __m256i q8 = _mm256_permute4x64_epi64(_mm256_packs_epi16(q16a, q16b), 0xD8);       // 0..31 in order
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + value_index(b, 0)), _mm256_castsi256_si128(q8));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + value_index(b, 16)), _mm256_extracti128_si256(q8, 1));
    scale[b] = d;
    sum_out[b] = d * static_cast<float>(_mm_cvtsi128_si32(s4));
#else
    float amax = 0.f;
    for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.f;
    const float inv = d > 0.f ? 1.f / d : 0.f;
    int32_t sum = 0;
    for (int i = 0; i < kBlock; ++i) {
      const int v = static_cast<int>(std::nearbyint(xb[i] * inv));
      q[value_index(b, i)] = static_cast<int8_t>(v);
      sum += v;
    }
    scale[b] = d;
    sum_out[b] = d * static_cast<float>(sum);
#endif
  }
}

// x * rsqrt(mean(x^2) + eps) * g over one row (the RMSNorm a projection took in)
static void rms_norm_row(const float* x, int64_t k, const float* g, float eps, float* out) {
  int64_t i = 0;
  float ss = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= k; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  ss = hsum(acc);
#endif
  for (; i < k; ++i) ss += x[i] * x[i];
  const float r = 1.f / std::sqrt(ss / static_cast<float>(k) + eps);
  i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= k; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(r)), _mm256_loadu_ps(g + i)));
#endif
  for (; i < k; ++i) out[i] = x[i] * r * g[i];
}

// dot(W row, x) for `rows` consecutive rows; portable version (any layout, any number of blocks).
static void rows_generic(const uint8_t* w, const BlockScales& s, int64_t k, const QuantRow& a, int64_t rows,
                         float* out) {
  const int64_t blocks = k / kBlock;
  const bool q8 = is_q8(s.layout);
  const int64_t pairs_end = blocks / 2 * 2;    // a q8 row's odd last block is stored in order
  for (int64_t r = 0; r < rows; ++r) {
    float acc = 0.f;
    for (int64_t b = 0; b < blocks; ++b) {
      int32_t dot = 0;
      if (q8) {
        const auto* wr = reinterpret_cast<const int8_t*>(w) + r * k;
        for (int i = 0; i < kBlock; ++i) {
          const int64_t wi = b < pairs_end ? value_index(b, i) : b * kBlock + i;
          dot += wr[wi] * a.q[value_index(b, i)];
        }
      } else {
        const uint8_t* wb = w + r * (k / 2) + b * 16;
        for (int j = 0; j < 16; ++j)
          dot += (wb[j] & 15) * a.q[value_index(b, j)] + (wb[j] >> 4) * a.q[value_index(b, 16 + j)];
      }
      const int64_t i = r * blocks + b;
      acc += static_cast<float>(dot) * (s.scale(i) * a.scale[b]) + s.min(i) * a.sum[b];
    }
    out[r] = acc;
  }
}

#if defined(__AVX2__) && defined(__FMA__)
constexpr int64_t kPrefetchRows = 4;

static inline int scale_bytes(ScaleType t) { return t == ScaleType::kF32 ? 4 : 2; }

static inline __m256 load8_scales(const void* base, int64_t i, ScaleType t) {
  if (t == ScaleType::kF32) return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  const uint16_t* p = static_cast<const uint16_t*>(base) + i;
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
#if defined(__F16C__)
  if (t == ScaleType::kF16) return _mm256_cvtph_ps(raw);
#else
  if (t == ScaleType::kF16) {
    alignas(32) float f[8];
    for (int i = 0; i < 8; ++i) f[i] = f16_to_float(p[i]);
    return _mm256_load_ps(f);
  }
#endif
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// n (even, <= 8) scales of one row from i on, the other lanes 0: a row's last blocks are read
// with a masked load (a full one could run past the tensor; masked-out lanes never fault).
static inline __m256 load_scales(const void* base, int64_t i, ScaleType t, int64_t n) {
  if (n == 8) return load8_scales(base, i, t);
  alignas(32) static const int32_t kMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  if (t == ScaleType::kF32)
    return _mm256_maskload_ps(static_cast<const float*>(base) + i, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMask + 8 - n)));
  // 16-bit scales: n / 2 32-bit words
  const __m128i raw = _mm_maskload_epi32(reinterpret_cast<const int*>(static_cast<const uint16_t*>(base) + i),
                                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMask + 8 - n / 2)));
  alignas(16) uint16_t tmp[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(tmp), raw);
  return load8_scales(tmp, 0, t);
}

// One pair of blocks of one weight row times the activations: 8 int32 lanes, the first 4 summing
// block 2p and the last 4 block 2p+1.
struct PairQ4 {          // 32 bytes of nibbles: the low and high halves of both blocks
  static constexpr int64_t kBytes = 32;
  static inline __m256i dot(const uint8_t* wp, __m256i alo, __m256i ahi) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp));
    const __m256i lo = _mm256_and_si256(x, mask), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), mask);
    // u <= 15, |a| <= 127: each int16 below is at most 4 x 15 x 127 (no overflow)
    const __m256i d16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi));
    return _mm256_madd_epi16(d16, _mm256_set1_epi16(1));
  }
};

struct PairQ8 {          // 64 bytes: int8 x int8 through maddubs(|w|, sign(a, w)) (<= 2 x 128 x 127)
  static constexpr int64_t kBytes = 64;
  static inline __m256i dot(const uint8_t* wp, __m256i alo, __m256i ahi) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 32));
    const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w0), _mm256_sign_epi8(alo, w0)), ones);
    const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w1), _mm256_sign_epi8(ahi, w1)), ones);
    return _mm256_add_epi32(p0, p1);
  }
};

// R rows (1..4) at once (kRowsAtOnce), 8 blocks at a time: the 8 weight scales of each row times the 8
// activation scales stay in a register (each pair of blocks takes its two by one permute), and
// the min terms (m x the block's quantized sum) go into the same accumulator 8 blocks at a time.
// The scales are read beside the weights, not in a pass before them, so their cache misses
// overlap the weights' (a separate pass over them was a third of a decode step), and the next
// rows' scales are prefetched with their weights.
template <class Pair, int R, Layout L>
static void rows_avx2_t(const uint8_t* w, const BlockScales& s, int64_t blocks, const QuantRow& a, float* out) {
  const int64_t stride = blocks / 2 * Pair::kBytes;
  const int sb = scale_bytes(s.type);
  for (int r = 0; r < R; ++r) {
    const int64_t at = (kPrefetchRows + r) * blocks * sb;
    _mm_prefetch(static_cast<const char*>(s.d) + at, _MM_HINT_T0);
    _mm_prefetch(static_cast<const char*>(s.d) + at + blocks * sb - 1, _MM_HINT_T0);
    if (s.m) {
      _mm_prefetch(static_cast<const char*>(s.m) + at, _MM_HINT_T0);
      _mm_prefetch(static_cast<const char*>(s.m) + at + blocks * sb - 1, _MM_HINT_T0);
    }
  }
  const __m256i pick = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  constexpr bool mins = L == Layout::kQ4Min || L == Layout::kQ8Min, sym = L == Layout::kQ4Sym;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b0 = 0; b0 < blocks; b0 += 8) {
    const int64_t n = std::min<int64_t>(8, blocks - b0);
    const __m256 as = _mm256_loadu_ps(a.scale + b0);      // padded with zeros to 8 blocks
    const __m256 asum = _mm256_loadu_ps(a.sum + b0);
    __m256 cs[R];
    for (int r = 0; r < R; ++r) {
      const __m256 d = load_scales(s.d, r * blocks + b0, s.type, n);
      cs[r] = _mm256_mul_ps(d, as);
      if constexpr (mins) acc[r] = _mm256_fmadd_ps(load_scales(s.m, r * blocks + b0, s.type, n), asum, acc[r]);
      if constexpr (sym) acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(-8.f)), asum, acc[r]);
    }
    for (int64_t q = 0; q < n / 2; ++q) {
      const int64_t p = b0 / 2 + q;
      const __m256i alo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + 64 * p));
      const __m256i ahi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + 64 * p + 32));
      const __m256i idx = _mm256_add_epi32(pick, _mm256_set1_epi32(static_cast<int>(2 * q)));
      for (int r = 0; r < R; ++r) {
        const uint8_t* wp = w + r * stride + Pair::kBytes * p;
        for (int64_t c = 0; c < Pair::kBytes; c += 64)
          _mm_prefetch(reinterpret_cast<const char*>(wp + kPrefetchRows * stride + c), _MM_HINT_T0);
        const __m256i dot = Pair::dot(wp, alo, ahi);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_permutevar8x32_ps(cs[r], idx), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

// Rows one after the other: the weights are then read as one sequential stream. Four rows at once
// (four streams a row apart) made the same work slower in a decode step, by perf's samples in one
// process (bench/experiments/llm_cpu_profile.py; load-independent, the parts compared with each other): the
// Q8_0 head's share fell from 0.68x the Q4_1 layers' to 0.35x (llama.cpp's: 0.32x), and the
// layers' own time by ~14% against attention's.
constexpr int kRowsAtOnce = 1;

template <class Pair, Layout L>
static void rows_avx2_layout(const uint8_t* w, const BlockScales& s, int64_t blocks, const QuantRow& a, int64_t rows,
                             float* out) {
  const int64_t stride = blocks / 2 * Pair::kBytes;
  int64_t r = 0;
  for (; r + kRowsAtOnce <= rows; r += kRowsAtOnce)
    rows_avx2_t<Pair, kRowsAtOnce, L>(w + r * stride, s.rows_from(r, blocks), blocks, a, out + r);
  for (; r < rows; ++r) rows_avx2_t<Pair, 1, L>(w + r * stride, s.rows_from(r, blocks), blocks, a, out + r);
}

static void rows_avx2(const uint8_t* w, const BlockScales& s, int64_t k, const QuantRow& a, int64_t rows,
                      float* out) {
  const int64_t blocks = k / kBlock;
  if (blocks % 2) return rows_generic(w, s, k, a, rows, out);
  switch (s.layout) {     // the layout a template parameter: no branch on it in the inner loop
    case Layout::kQ4Sym: return rows_avx2_layout<PairQ4, Layout::kQ4Sym>(w, s, blocks, a, rows, out);
    case Layout::kQ4Min: return rows_avx2_layout<PairQ4, Layout::kQ4Min>(w, s, blocks, a, rows, out);
    case Layout::kQ8: return rows_avx2_layout<PairQ8, Layout::kQ8>(w, s, blocks, a, rows, out);
    case Layout::kQ8Min: return rows_avx2_layout<PairQ8, Layout::kQ8Min>(w, s, blocks, a, rows, out);
  }
}
#endif

using RowsFn = void (*)(const uint8_t*, const BlockScales&, int64_t, const QuantRow&, int64_t, float*);

static RowsFn pick_rows() {
#if defined(__AVX2__) && defined(__FMA__)
  return rows_avx2;
#else
  return rows_generic;
#endif
}

// Output rows per thread-pool task. modelexport::swiglu_q4's weight interleaves gate and up rows
// in groups of this many (linear_q4_op.SWIGLU_GROUP), so a task holds matching pairs.
constexpr int64_t kRowsPerTask = 16;

enum class Epilogue { kBias, kSwiGLU };

// Shared by both ops: checks, then out[t, :] = epilogue(W x_t) for every token t. `n_out` is the
// output width: the weight's rows for kBias, half of them for kSwiGLU.
struct Extras {                 // the optional parts of a call (null: not there)
  const float* bias = nullptr;
  const float* residual = nullptr;
  const float* norm_weight = nullptr;
  float eps = 0.f;
};

static Tensor& run_q4(KernelRuntimeContext& ctx, const char* op, const Tensor& x, const Tensor& weight,
                      const Tensor& scales, const executorch::aten::optional<Tensor>& mins, bool q8,
                      const Extras& extras, Epilogue epilogue, Tensor& out) {
  ET_KERNEL_CHECK_MSG(ctx, x.scalar_type() == ScalarType::Float && out.scalar_type() == ScalarType::Float,
                      InvalidArgument, out, "%s: float32 input and output only", op);
  const ScalarType st = scales.scalar_type();
  const ScaleType type = st == ScalarType::Float ? ScaleType::kF32
                         : st == ScalarType::Half ? ScaleType::kF16 : ScaleType::kBF16;
  ET_KERNEL_CHECK_MSG(ctx, weight.scalar_type() == (q8 ? ScalarType::Char : ScalarType::Byte) &&
                               (type != ScaleType::kBF16 || st == ScalarType::BFloat16) && weight.dim() == 2 &&
                               scales.dim() == 2,
                      InvalidArgument, out, "%s: weight %s, scales bfloat16, float16 or float32 [N, K/32]", op,
                      q8 ? "int8 [N, K]" : "uint8 [N, K/2]");
  const int64_t k = x.size(x.dim() - 1), w_rows = weight.size(0);
  ET_KERNEL_CHECK_MSG(ctx, k % kBlock == 0 && weight.size(1) * (q8 ? 1 : 2) == k && scales.size(0) == w_rows &&
                               scales.size(1) * kBlock == k,
                      InvalidArgument, out, "%s: weight shape does not fit the input", op);
  ET_KERNEL_CHECK_MSG(ctx, !mins.has_value() || (mins->scalar_type() == st && mins->numel() == scales.numel() &&
                                                 executorch::runtime::tensor_is_contiguous(*mins)),
                      InvalidArgument, out, "%s: mins must be contiguous, of the scales' type and shape", op);
  ET_KERNEL_CHECK_MSG(ctx, epilogue != Epilogue::kSwiGLU || w_rows % (2 * kRowsPerTask) == 0, InvalidArgument, out,
                      "%s: the weight must hold gate and up rows in groups of %d", op, static_cast<int>(kRowsPerTask));
  ET_KERNEL_CHECK_MSG(ctx, executorch::runtime::tensor_is_contiguous(x) && executorch::runtime::tensor_is_contiguous(weight) &&
                               executorch::runtime::tensor_is_contiguous(scales),
                      InvalidArgument, out, "%s: contiguous tensors only", op);
  const int64_t n_out = epilogue == Epilogue::kSwiGLU ? w_rows / 2 : w_rows;
  executorch::aten::SizesType sizes[executorch::runtime::kTensorDimensionLimit];
  for (int64_t d = 0; d + 1 < x.dim(); ++d) sizes[d] = x.size(d);
  sizes[x.dim() - 1] = static_cast<executorch::aten::SizesType>(n_out);
  ET_KERNEL_CHECK(ctx, executorch::runtime::resize_tensor(out, {sizes, static_cast<size_t>(x.dim())}) == Error::Ok,
                  InvalidArgument, out);

  const int64_t tokens = x.numel() / k, blocks = k / kBlock;
  // quantize every token once, up front (kept between calls: no allocation per step)
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> qs;
  thread_local std::vector<float> qsum;
  // a token's values take whole pairs of blocks (an odd last block leaves its partner unused)
  const int64_t q_stride = (blocks + 1) / 2 * 2 * kBlock;
  // scales and sums padded with zeros to whole groups of 8 blocks (the AVX2 loop reads 8 at a time)
  const int64_t s_stride = (blocks + 7) / 8 * 8;
  q.resize(static_cast<size_t>(tokens * q_stride));
  qs.assign(static_cast<size_t>(tokens * s_stride), 0.f);
  qsum.assign(static_cast<size_t>(tokens * s_stride), 0.f);
  const float* xd = x.const_data_ptr<float>();
  thread_local std::vector<float> normed;
  if (extras.norm_weight) normed.resize(static_cast<size_t>(k));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = xd + t * k;
    if (extras.norm_weight) {
      rms_norm_row(row, k, extras.norm_weight, extras.eps, normed.data());
      row = normed.data();
    }
    quantize_row(row, k, q.data() + t * q_stride, qs.data() + t * s_stride, qsum.data() + t * s_stride);
  }

  const auto* w = static_cast<const uint8_t*>(weight.const_data_ptr());
  const Layout layout = q8 ? (mins.has_value() ? Layout::kQ8Min : Layout::kQ8)
                           : (mins.has_value() ? Layout::kQ4Min : Layout::kQ4Sym);
  const BlockScales all{scales.const_data_ptr(), mins.has_value() ? mins->const_data_ptr() : nullptr, type, layout};
  const int64_t w_stride = q8 ? k : k / 2;
  float* od = out.mutable_data_ptr<float>();
  const RowsFn rows_fn = pick_rows();
  const int8_t* qd = q.data();
  const float* qsd = qs.data();
  const float* qsumd = qsum.data();
  // a task is a group of weight rows run for every token, so its weights are read from memory
  // once and reused from cache for the other tokens
  const int64_t task_rows = epilogue == Epilogue::kSwiGLU ? 2 * kRowsPerTask : kRowsPerTask;
  const int64_t tasks = (w_rows + task_rows - 1) / task_rows;
  auto run = [&](int64_t begin, int64_t end) {
    float tmp[2 * kRowsPerTask];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t o = task * task_rows, rows = std::min(task_rows, w_rows - o);
      const BlockScales so = all.rows_from(o, blocks);
      for (int64_t t = 0; t < tokens; ++t) {
        const QuantRow a{qd + t * q_stride, qsd + t * s_stride, qsumd + t * s_stride};
        rows_fn(w + o * w_stride, so, k, a, rows, tmp);
        if (epilogue == Epilogue::kSwiGLU) {     // tmp: kRowsPerTask gate rows, then their up rows
          float* orow = od + t * n_out + task * kRowsPerTask;
          for (int64_t r = 0; r < kRowsPerTask; ++r) {
            const float g = tmp[r];
            orow[r] = g / (1.f + std::exp(-g)) * tmp[kRowsPerTask + r];
          }
        } else {
          float* orow = od + t * n_out + o;
          const float* res = extras.residual ? extras.residual + t * n_out + o : nullptr;
          for (int64_t r = 0; r < rows; ++r)
            orow[r] = tmp[r] + (extras.bias ? extras.bias[o + r] : 0.f) + (res ? res[r] : 0.f);
        }
      }
    }
  };
  // small products are not worth waking the thread pool for
  if (w_rows * k * tokens < (1 << 16)) {
    run(0, tasks);
  } else {
    parallel_chunks(tasks, run);
  }
  return out;
}

// The optional float tensors of a call, checked: null when absent or not of `numel` elements
// (`ok` then false).
static const float* optional_floats(const executorch::aten::optional<Tensor>& t, int64_t numel, bool& ok) {
  if (!t.has_value()) return nullptr;
  ok = ok && t->scalar_type() == ScalarType::Float && t->numel() == numel &&
       executorch::runtime::tensor_is_contiguous(*t);
  return t->const_data_ptr<float>();
}

static Tensor& linear_any(KernelRuntimeContext& ctx, const char* op, bool q8, const Tensor& x, const Tensor& weight,
                          const Tensor& scales, const executorch::aten::optional<Tensor>& mins,
                          const executorch::aten::optional<Tensor>& bias, const executorch::aten::optional<Tensor>& residual,
                          const executorch::aten::optional<Tensor>& norm_weight, double eps, Tensor& out) {
  bool ok = true;
  const int64_t k = x.size(x.dim() - 1), n_out = weight.size(0);
  Extras extras{optional_floats(bias, n_out, ok), optional_floats(residual, x.numel() / k * n_out, ok),
                optional_floats(norm_weight, k, ok), static_cast<float>(eps)};
  ET_KERNEL_CHECK_MSG(ctx, ok, InvalidArgument, out, "%s: bias [N], residual [..., N] and norm_weight [K] must be float32",
                      op);
  return run_q4(ctx, op, x, weight, scales, mins, q8, extras, Epilogue::kBias, out);
}

Tensor& linear_q4_out(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& scales,
                      const executorch::aten::optional<Tensor>& bias, const executorch::aten::optional<Tensor>& residual,
                      const executorch::aten::optional<Tensor>& norm_weight, double eps,
                      const executorch::aten::optional<Tensor>& mins, Tensor& out) {
  return linear_any(ctx, "modelexport::linear_q4", false, x, weight, scales, mins, bias, residual, norm_weight, eps, out);
}

Tensor& linear_q8_out(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& scales,
                      const executorch::aten::optional<Tensor>& bias, const executorch::aten::optional<Tensor>& residual,
                      const executorch::aten::optional<Tensor>& norm_weight, double eps,
                      const executorch::aten::optional<Tensor>& mins, Tensor& out) {
  return linear_any(ctx, "modelexport::linear_q8", true, x, weight, scales, mins, bias, residual, norm_weight, eps, out);
}

// silu(x G^T) * (x U^T) with G and U interleaved in groups of kRowsPerTask rows: one weight
// read and one pass over the thread pool for a SwiGLU MLP's gate and up projections; 4-bit or
// 8-bit weights (a GGUF's Q5_0 / Q5_K / Q8_0 MLP).
static Tensor& swiglu_out(KernelRuntimeContext& ctx, const char* name, bool eight_bit, const Tensor& x,
                          const Tensor& weight, const Tensor& scales,
                          const executorch::aten::optional<Tensor>& norm_weight, double eps,
                          const executorch::aten::optional<Tensor>& mins, Tensor& out) {
  bool ok = true;
  Extras extras{nullptr, nullptr, optional_floats(norm_weight, x.size(x.dim() - 1), ok), static_cast<float>(eps)};
  ET_KERNEL_CHECK_MSG(ctx, ok, InvalidArgument, out, "%s: norm_weight must be float32 [K]", name);
  return run_q4(ctx, name, x, weight, scales, mins, eight_bit, extras, Epilogue::kSwiGLU, out);
}

Tensor& swiglu_q4_out(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& scales,
                      const executorch::aten::optional<Tensor>& norm_weight, double eps,
                      const executorch::aten::optional<Tensor>& mins, Tensor& out) {
  return swiglu_out(ctx, "modelexport::swiglu_q4", false, x, weight, scales, norm_weight, eps, mins, out);
}

Tensor& swiglu_q8_out(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& scales,
                      const executorch::aten::optional<Tensor>& norm_weight, double eps,
                      const executorch::aten::optional<Tensor>& mins, Tensor& out) {
  return swiglu_out(ctx, "modelexport::swiglu_q8", true, x, weight, scales, norm_weight, eps, mins, out);
}

}  // namespace modelexport_native

EXECUTORCH_LIBRARY(modelexport, "linear_q4.out", modelexport_native::linear_q4_out);
EXECUTORCH_LIBRARY(modelexport, "linear_q8.out", modelexport_native::linear_q8_out);
EXECUTORCH_LIBRARY(modelexport, "swiglu_q4.out", modelexport_native::swiglu_q4_out);
EXECUTORCH_LIBRARY(modelexport, "swiglu_q8.out", modelexport_native::swiglu_q8_out);
