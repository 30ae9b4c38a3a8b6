// One decode step's weight reads through modelexport::linear_q4 / linear_q8's row functions,
// outside any program: SmolLM2-135M's Q4_1 projections (30 layers) and its Q8_0 head, random
// blocks, one token, from DRAM (96 MB, more than the L3). Built by bench/experiments/linear_kernel_stream.py
// against one revision of linear_q4.cpp (KERNEL_SOURCE).
#include KERNEL_SOURCE
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

using namespace modelexport_native;

struct Matrix {
  int64_t n, k;
  bool q8;
  std::vector<uint8_t> w;
  std::vector<uint16_t> d, m;   // float16 scales and mins (Q4_1's)
};

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  const int part = argc > 2 ? std::atoi(argv[2]) : 0;      // 0 all, 1 layers, 2 head, 3 the roof:
                                                           // the same bytes read without computing
  const int threaded = argc > 3 ? std::atoi(argv[3]) : 0;  // 0 one thread, 1 ExecuTorch's pool
  std::mt19937 g(1);
  std::vector<Matrix> mats;
  auto add = [&](int64_t n, int64_t k, bool q8) {
    Matrix m{n, k, q8, {}, {}, {}};
    m.w.resize(static_cast<size_t>(n * (q8 ? k : k / 2)));
    for (auto& x : m.w) x = static_cast<uint8_t>(g() & (q8 ? 0x7f : 0xff));
    m.d.resize(static_cast<size_t>(n * k / 32));
    m.m.resize(m.d.size());
    for (auto& x : m.d) x = static_cast<uint16_t>(0x2000 + (g() & 0x3ff));   // small positive halves
    for (auto& x : m.m) x = static_cast<uint16_t>(0xa000 + (g() & 0x3ff));   // small negative halves
    mats.push_back(std::move(m));
  };
  if (part != 2)
    for (int l = 0; l < 30; ++l) {
      add(960, 576, false);    // q|k|v
      add(576, 576, false);    // o
      add(3072, 576, false);   // gate|up
      add(576, 1536, false);   // down
    }
  if (part != 1) add(49152, 576, true);   // the tied Q8_0 head
  std::vector<float> x(1536), out(16);
  for (auto& v : x) v = static_cast<float>(g() % 2000) / 1000.f - 1.f;
  std::vector<int8_t> q(1536);
  std::vector<float> qs(56, 0.f), qsum(56, 0.f);
  double bytes = 0;
  for (auto& m : mats) bytes += static_cast<double>(m.w.size() + (m.q8 ? 2 : 4) * m.d.size());
  const RowsFn rows = pick_rows();
  double best = 1e9;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& m : mats) {
      quantize_row(x.data(), m.k, q.data(), qs.data(), qsum.data());
      const BlockScales s{m.d.data(), m.q8 ? nullptr : m.m.data(), ScaleType::kF16, m.q8 ? Layout::kQ8 : Layout::kQ4Min};
      const QuantRow a{q.data(), qs.data(), qsum.data()};
      const int64_t ws = m.q8 ? m.k : m.k / 2;
      auto run = [&](int64_t b, int64_t e) {
        float tmp[16];
        for (int64_t t = b; t < e; ++t) rows(m.w.data() + t * 16 * ws, s.rows_from(t * 16, m.k / 32), m.k, a, 16, tmp);
      };
      auto read = [&](int64_t b, int64_t e) {   // the roof: every byte of these rows loaded, nothing done
        __m256i acc = _mm256_setzero_si256();
        const uint8_t* p = m.w.data() + b * 16 * ws;
        for (int64_t i = 0; i + 32 <= (e - b) * 16 * ws; i += 32)
          acc = _mm256_xor_si256(acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
        const uint16_t* sp = m.d.data() + b * 16 * m.k / 32;
        for (int64_t i = 0; i + 16 <= (e - b) * 16 * m.k / 32; i += 16)
          acc = _mm256_xor_si256(acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp + i)));
        out[0] += static_cast<float>(_mm256_extract_epi32(acc, 0));
      };
      const executorch::runtime::FunctionRef<void(int64_t, int64_t)> fn =
          part == 3 ? executorch::runtime::FunctionRef<void(int64_t, int64_t)>(read)
                    : executorch::runtime::FunctionRef<void(int64_t, int64_t)>(run);
      if (threaded) executorch::extension::parallel_for(0, m.n / 16, 1, fn);
      else fn(0, m.n / 16);
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("{\"best_ms\": %.3f, \"megabytes\": %.2f, \"gb_per_s\": %.2f}\n", best * 1e3, bytes / 1e6, bytes / best / 1e9);
}
