// modelexport::linear_q4.out: y = x W^T (+ bias) with W in 4 bits, for the ExecuTorch CPU runtime.
//   x float [..., K] (rows contiguous), K a multiple of 32;
//   weight uint8 [N, K/2]: row o, block b (32 input channels) is 16 bytes; byte j holds
//     q[32b + j] + 8 in its low nibble and q[32b + 16 + j] + 8 in its high one (q in -8..7);
//   scales bfloat16 [N, K/32]: W[o, 32b + i] = q * scale[o, b];
//   bias float [N] or none; out float [..., N];
//   optionally an RMSNorm first (norm_weight float [K], eps: x <- x * rsqrt(mean(x^2) + eps) * g,
//   as the layer's norm would do before the projection) and a residual added after (float
//   [..., N]): a Llama block is then norm+qkv, attention, o+residual, norm+gate|up, down+residual.
// The activations are quantized on the fly to int8 per block of 32 (symmetric, scale max|x|/127,
// as llama.cpp's Q8_0), so a block's dot product is exact in int32 and then scaled once.
// Why our own: XNNPACK's AVX2 kernel for block-wise 4-bit weights (qd8-f32-qb4w 1x8c8) widens
// every weight to 16 bits and was ~70% of a SmolLM2 decode step. With one token the work is
// reading the weights: here two blocks (64 weights) cost one load, two byte-wise multiply-adds
// (maddubs) and a few more instructions, the next rows are prefetched, and the step is memory-
// bound (bench/cpu_kernels.py --option linear).
#include "kernel_common.h"

namespace modelexport_native {

constexpr int64_t kBlock = 32;

static inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// One token's activations, quantized per block of 32: int8 values (in the order the AVX2 loop
// reads them: per pair of blocks, the first 16 values of each, then the last 16 of each), each
// block's scale, and 8 x the sum of its values as a float (the weights are stored with +8, so
// that much times the block's scale comes off the row's sum).
struct QuantRow {
  const int8_t* q;
  const float* scale;
  const float* offset;
};

static inline int64_t value_index(int64_t b, int i) {   // where value i of block b is stored
  const int64_t pair = b / 2, second = b % 2;
  return pair * 64 + (i < 16 ? 0 : 32) + second * 16 + (i % 16);
}

static void quantize_row(const float* x, int64_t k, int8_t* q, float* scale, float* offset) {
  const int64_t blocks = k / kBlock;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kBlock;
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
    offset[b] = 8.f * static_cast<float>(sum);
  }
}

// dot(W row, x) for `rows` consecutive rows; portable version.
static void rows_generic(const uint8_t* w, const uint16_t* s, int64_t k, const QuantRow& a, int64_t rows,
                         float* out) {
  const int64_t blocks = k / kBlock;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* wr = w + r * (k / 2);
    const uint16_t* sr = s + r * blocks;
    float acc = 0.f;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* wb = wr + b * 16;
      int32_t dot = 0;
      for (int j = 0; j < 16; ++j) {
        const int8_t lo = a.q[value_index(b, j)];
        const int8_t hi = a.q[value_index(b, 16 + j)];
        dot += (wb[j] & 15) * lo + (wb[j] >> 4) * hi;
      }
      acc += (static_cast<float>(dot) - a.offset[b]) * (bf16_to_float(sr[b]) * a.scale[b]);
    }
    out[r] = acc;
  }
}

#if defined(__AVX2__) && defined(__FMA__)
constexpr int64_t kMaxBlocks = 512;   // K up to 16384 on the AVX2 path
constexpr int64_t kPrefetchRows = 4;

// R rows (1..4) at once, two blocks per step: 32 bytes of nibbles hold the low and the high
// halves of both blocks, so one AND and one shift unpack 64 weights, two maddubs multiply them
// with the matching activation bytes, and one madd leaves 4 int32 sums per block; each block's
// combined scale (weight scale x activation scale) is computed once per row up front.
template <int R>
static void rows_avx2_r(const uint8_t* w, const uint16_t* s, int64_t blocks, const QuantRow& a, float* out) {
  const int64_t stride = blocks * 16;
  alignas(32) float cs[R][kMaxBlocks];
  float corr[R];
  for (int r = 0; r < R; ++r) {
    __m256 c = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= blocks; b += 8) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + r * blocks + b));
      const __m256 sw = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
      const __m256 v = _mm256_mul_ps(sw, _mm256_loadu_ps(a.scale + b));
      _mm256_store_ps(cs[r] + b, v);
      c = _mm256_fmadd_ps(v, _mm256_loadu_ps(a.offset + b), c);
    }
    float cc = hsum(c);
    for (; b < blocks; ++b) {
      cs[r][b] = bf16_to_float(s[r * blocks + b]) * a.scale[b];
      cc += cs[r][b] * a.offset[b];
    }
    corr[r] = cc;
  }
  const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256i pick = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t p = 0; p < blocks / 2; ++p) {
    const __m256i alo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + 64 * p));
    const __m256i ahi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + 64 * p + 32));
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w + (r + kPrefetchRows) * stride + 32 * p), _MM_HINT_T0);
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * stride + 32 * p));
      const __m256i lo = _mm256_and_si256(x, mask), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), mask);
      const __m256i d16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi));
      const __m256 scale = _mm256_permutevar8x32_ps(
          _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(cs[r] + 2 * p))), pick);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(d16, ones)), scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]) - corr[r];
}

static void rows_avx2(const uint8_t* w, const uint16_t* s, int64_t k, const QuantRow& a, int64_t rows,
                      float* out) {
  const int64_t blocks = k / kBlock, stride = k / 2;
  if (blocks % 2 || blocks > kMaxBlocks) return rows_generic(w, s, k, a, rows, out);
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) rows_avx2_r<4>(w + r * stride, s + r * blocks, blocks, a, out + r);
  for (; r < rows; ++r) rows_avx2_r<1>(w + r * stride, s + r * blocks, blocks, a, out + r);
}
#endif

using RowsFn = void (*)(const uint8_t*, const uint16_t*, int64_t, const QuantRow&, int64_t, float*);

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
                      const Tensor& scales, const Extras& extras, Epilogue epilogue, Tensor& out) {
  ET_KERNEL_CHECK_MSG(ctx, x.scalar_type() == ScalarType::Float && out.scalar_type() == ScalarType::Float,
                      InvalidArgument, out, "%s: float32 input and output only", op);
  ET_KERNEL_CHECK_MSG(ctx, weight.scalar_type() == ScalarType::Byte && scales.scalar_type() == ScalarType::BFloat16 &&
                               weight.dim() == 2 && scales.dim() == 2,
                      InvalidArgument, out, "%s: weight uint8 [N, K/2], scales bfloat16 [N, K/32]", op);
  const int64_t k = x.size(x.dim() - 1), w_rows = weight.size(0);
  ET_KERNEL_CHECK_MSG(ctx, k % kBlock == 0 && weight.size(1) * 2 == k && scales.size(0) == w_rows &&
                               scales.size(1) * kBlock == k,
                      InvalidArgument, out, "%s: weight shape does not fit the input", op);
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
  thread_local std::vector<float> qo;
  // a token's values take whole pairs of blocks (an odd last block leaves its partner unused)
  const int64_t q_stride = (blocks + 1) / 2 * 2 * kBlock;
  q.resize(static_cast<size_t>(tokens * q_stride));
  qs.resize(static_cast<size_t>(tokens * blocks));
  qo.resize(static_cast<size_t>(tokens * blocks));
  const float* xd = x.const_data_ptr<float>();
  thread_local std::vector<float> normed;
  if (extras.norm_weight) normed.resize(static_cast<size_t>(k));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = xd + t * k;
    if (extras.norm_weight) {
      float ss = 0.f;
      for (int64_t i = 0; i < k; ++i) ss += row[i] * row[i];
      const float r = 1.f / std::sqrt(ss / static_cast<float>(k) + extras.eps);
      for (int64_t i = 0; i < k; ++i) normed[i] = row[i] * r * extras.norm_weight[i];
      row = normed.data();
    }
    quantize_row(row, k, q.data() + t * q_stride, qs.data() + t * blocks, qo.data() + t * blocks);
  }

  const auto* w = static_cast<const uint8_t*>(weight.const_data_ptr());
  const auto* s = static_cast<const uint16_t*>(scales.const_data_ptr());
  float* od = out.mutable_data_ptr<float>();
  const RowsFn rows_fn = pick_rows();
  const int8_t* qd = q.data();
  const float* qsd = qs.data();
  const float* qod = qo.data();
  // a task is a group of weight rows run for every token, so its weights are read from memory
  // once and reused from cache for the other tokens
  const int64_t task_rows = epilogue == Epilogue::kSwiGLU ? 2 * kRowsPerTask : kRowsPerTask;
  const int64_t tasks = (w_rows + task_rows - 1) / task_rows;
  auto run = [&](int64_t begin, int64_t end) {
    float tmp[2 * kRowsPerTask];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t o = task * task_rows, rows = std::min(task_rows, w_rows - o);
      for (int64_t t = 0; t < tokens; ++t) {
        const QuantRow a{qd + t * q_stride, qsd + t * blocks, qod + t * blocks};
        rows_fn(w + o * (k / 2), s + o * blocks, k, a, rows, tmp);
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
    executorch::extension::parallel_for(0, tasks, 1, run);
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

Tensor& linear_q4_out(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& scales,
                      const executorch::aten::optional<Tensor>& bias, const executorch::aten::optional<Tensor>& residual,
                      const executorch::aten::optional<Tensor>& norm_weight, double eps, Tensor& out) {
  bool ok = true;
  const int64_t k = x.size(x.dim() - 1), n_out = weight.size(0);
  Extras extras{optional_floats(bias, n_out, ok), optional_floats(residual, x.numel() / k * n_out, ok),
                optional_floats(norm_weight, k, ok), static_cast<float>(eps)};
  ET_KERNEL_CHECK_MSG(ctx, ok, InvalidArgument, out,
                      "modelexport::linear_q4: bias [N], residual [..., N] and norm_weight [K] must be float32");
  return run_q4(ctx, "modelexport::linear_q4", x, weight, scales, extras, Epilogue::kBias, out);
}

// silu(x G^T) * (x U^T) with G and U interleaved in groups of kRowsPerTask rows: one weight
// read and one pass over the thread pool for a SwiGLU MLP's gate and up projections.
Tensor& swiglu_q4_out(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& scales,
                      const executorch::aten::optional<Tensor>& norm_weight, double eps, Tensor& out) {
  bool ok = true;
  Extras extras{nullptr, nullptr, optional_floats(norm_weight, x.size(x.dim() - 1), ok), static_cast<float>(eps)};
  ET_KERNEL_CHECK_MSG(ctx, ok, InvalidArgument, out, "modelexport::swiglu_q4: norm_weight must be float32 [K]");
  return run_q4(ctx, "modelexport::swiglu_q4", x, weight, scales, extras, Epilogue::kSwiGLU, out);
}

}  // namespace modelexport_native

EXECUTORCH_LIBRARY(modelexport, "linear_q4.out", modelexport_native::linear_q4_out);
EXECUTORCH_LIBRARY(modelexport, "swiglu_q4.out", modelexport_native::swiglu_q4_out);
