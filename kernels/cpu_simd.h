// What nsl's CPU kernels share: the build host's float vectors (GCC vector extensions), the
// register-blocked product micro-kernel (with an optional paced prefetch of a streamed operand), a
// vector exp and the softmax row loops built on it, and a task pool over the host's cores. Included by flash_cpu.cc, head_cpu.cc and
// decode_cpu.cc, which `nsl.kernels.cpu_build` compiles into one library.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include <sched.h>

namespace nsl_cpu {

// One float vector of the build host: 16 lanes with AVX-512 (32 registers: 6 rows × 4 vectors
// of accumulators), else 8 (AVX2, 16 registers: 6 rows × 2 vectors).
#ifdef __AVX512F__
constexpr int W = 16, NV_MAX = 4;
#define NV_MAX_IS_4 1
#else
constexpr int W = 8, NV_MAX = 2;
#define NV_MAX_IS_4 0
#endif
typedef float vf __attribute__((vector_size(4 * W)));
typedef float vfu __attribute__((vector_size(4 * W), aligned(4)));
typedef int32_t vi __attribute__((vector_size(4 * W)));
typedef int32_t viu __attribute__((vector_size(4 * W), aligned(4)));

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline vf load(const float* p) { return *reinterpret_cast<const vfu*>(p); }
inline vi loadi(const int32_t* p) { return *reinterpret_cast<const viu*>(p); }
inline void store(float* p, vf x) { *reinterpret_cast<vfu*>(p) = x; }
inline vf splat(float x) { return x - (vf){}; }

// A software prefetch stream down the rows of a matrix operand: `seg` bytes of each row from `row`,
// rows `stride` bytes apart, stopping at `end`. `micro` issues P lines of it per step of its k loop,
// so the next block of a streamed operand is in flight while the current one is multiplied (a
// burst of prefetches between blocks stalls the core once its fill buffers are full).
struct RowPrefetch {
  const char *row = nullptr, *end = nullptr;
  int64_t col = 0, seg = 0, stride = 0;
  inline void next() {
    if (row >= end) return;
    __builtin_prefetch(row + col, 0, 2);
    if ((col += 64) >= seg) {
      col = 0;
      row += stride;
    }
  }
};

// C[MR, 16·NV] (+)= Σ_k A(r, k) · B[k, :], with A(r, k) = A[r·rsa + k·csa] (any strides, so
// Aᵀ is free) and B row-major with row stride ldb; P lines of `pf` prefetched per k.
template <int MR, int NV, int P = 0>
inline void micro(int64_t K, const float* A, int64_t rsa, int64_t csa, const float* B, int64_t ldb,
                  float* C, int64_t ldc, bool acc, RowPrefetch* pf = nullptr) {
  vf c[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int n = 0; n < NV; ++n) c[r][n] = acc ? load(C + r * ldc + W * n) : (vf){};
  for (int64_t k = 0; k < K; ++k) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) pf->next();
    const float* b = B + k * ldb;
    vf bv[NV];
#pragma GCC unroll 4
    for (int n = 0; n < NV; ++n) bv[n] = load(b + W * n);
    const float* a = A + k * csa;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const float ar = a[r * rsa];
#pragma GCC unroll 4
      for (int n = 0; n < NV; ++n) c[r][n] += ar * bv[n];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int n = 0; n < NV; ++n) store(C + r * ldc + W * n, c[r][n]);
}

// C[M, 16·NV] (+)= A(M×K) · B: `micro` over 6-row groups and the tail.
template <int NV>
void gemm_panel(int64_t M, int64_t K, const float* A, int64_t rsa, int64_t csa, const float* B,
                int64_t ldb, float* C, int64_t ldc, bool acc) {
  int64_t m = 0;
  for (; m + 6 <= M; m += 6) micro<6, NV>(K, A + m * rsa, rsa, csa, B, ldb, C + m * ldc, ldc, acc);
  const float* a = A + m * rsa;
  float* c = C + m * ldc;
  switch (M - m) {
    case 5: micro<5, NV>(K, a, rsa, csa, B, ldb, c, ldc, acc); break;
    case 4: micro<4, NV>(K, a, rsa, csa, B, ldb, c, ldc, acc); break;
    case 3: micro<3, NV>(K, a, rsa, csa, B, ldb, c, ldc, acc); break;
    case 2: micro<2, NV>(K, a, rsa, csa, B, ldb, c, ldc, acc); break;
    case 1: micro<1, NV>(K, a, rsa, csa, B, ldb, c, ldc, acc); break;
    default: break;
  }
}

// gemm_panel on a full panel (NV_MAX vectors) while `pf` streams at the pace B is consumed: one
// line of pf per line of B row the panel's k loop reads, spread over its 6-row groups (a group
// issues its share each k, so the prefetches are spread through the arithmetic).
template <int MR>
inline void micro_pf(int p, int64_t K, const float* A, int64_t rsa, int64_t csa, const float* B, int64_t ldb,
                     float* C, int64_t ldc, bool acc, RowPrefetch& pf) {
  switch (p) {
    case 0: micro<MR, NV_MAX, 0>(K, A, rsa, csa, B, ldb, C, ldc, acc, &pf); break;
    case 1: micro<MR, NV_MAX, 1>(K, A, rsa, csa, B, ldb, C, ldc, acc, &pf); break;
    case 2: micro<MR, NV_MAX, 2>(K, A, rsa, csa, B, ldb, C, ldc, acc, &pf); break;
    default: micro<MR, NV_MAX, 4>(K, A, rsa, csa, B, ldb, C, ldc, acc, &pf); break;
  }
}
inline void gemm_panel_pf(int64_t M, int64_t K, const float* A, int64_t rsa, int64_t csa, const float* B,
                          int64_t ldb, float* C, int64_t ldc, bool acc, RowPrefetch& pf) {
  constexpr int kLines = NV_MAX * W * 4 / 64;  // lines of a panel row: 4 with AVX-512, 1 with AVX2
  const int64_t groups = (M + 5) / 6;
  for (int64_t g = 0, m = 0; g < groups; ++g, m += 6) {
    // kLines over the groups, the remainder to the last ones: 4 → (4), (2, 2), (1, 1, 2), (1, 1, 1, 1), …
    const int p = int(kLines / groups + (g >= groups - kLines % groups ? 1 : 0));
    const float* a = A + m * rsa;
    float* c = C + m * ldc;
    switch (std::min<int64_t>(6, M - m)) {
      case 6: micro_pf<6>(p, K, a, rsa, csa, B, ldb, c, ldc, acc, pf); break;
      case 5: micro_pf<5>(p, K, a, rsa, csa, B, ldb, c, ldc, acc, pf); break;
      case 4: micro_pf<4>(p, K, a, rsa, csa, B, ldb, c, ldc, acc, pf); break;
      case 3: micro_pf<3>(p, K, a, rsa, csa, B, ldb, c, ldc, acc, pf); break;
      case 2: micro_pf<2>(p, K, a, rsa, csa, B, ldb, c, ldc, acc, pf); break;
      default: micro_pf<1>(p, K, a, rsa, csa, B, ldb, c, ldc, acc, pf); break;
    }
  }
}

// exp(x) for softmax arguments (x ≤ ~88): Cephes' expf polynomial (≈1 ulp), exactly 0 below
// −87 (so masked −inf scores give p = 0, as the XLA paths do).
inline vf vexp(vf x) {
  const vi tiny = x < splat(-87.0f);
  x = tiny ? splat(-87.0f) : x;
  x = x > splat(88.0f) ? splat(88.0f) : x;
  const vf t = x * 1.44269504088896341f + 12582912.0f;  // 1.5·2²³: round-to-nearest n in t's bits
  const vf n = t - 12582912.0f;
  vf r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const vi pow2 = ((reinterpret_cast<const vi&>(t) - 0x4B400000) + 127) << 23;
  const vf e = p * reinterpret_cast<const vf&>(pow2);
  return tiny ? splat(0.0f) : e;
}

// The largest of x[0, n) (n a multiple of W): lane-wise maxima, then across the lanes; −inf if n = 0.
inline float row_max(const float* x, int64_t n) {
  vf vm = splat(kNegInf);
  for (int64_t c = 0; c < n; c += W) {
    const vf v = load(x + c);
    vm = v > vm ? v : vm;
  }
  float m = kNegInf;
  for (int e = 0; e < W; ++e) m = std::max(m, vm[e]);
  return m;
}

// x[0, n) ← exp(x − m) in place (n a multiple of W), the softmax numerators; returns total plus
// their sum, summed per lane over x and then lane by lane onto total (the order the kernels' bits
// depend on: docs/guide/determinism.md).
inline float exp_sum(float* x, int64_t n, float m, float total = 0.0f) {
  vf vs = {};
  for (int64_t c = 0; c < n; c += W) {
    const vf e = vexp(load(x + c) - m);
    store(x + c, e);
    vs += e;
  }
  for (int e = 0; e < W; ++e) total += vs[e];
  return total;
}

// Workers for `tasks` tasks: the cores this thread may run on, or $NSL_CPU_THREADS when it is set
// (a positive integer; `nsl.kernels.cpu_build` rejects anything else), at most one per task. Read
// per call: a call lasts 0.1 ms or more, getenv well under a microsecond.
inline int num_workers(int64_t tasks) {
  int n = 0;
  if (const char* env = std::getenv("NSL_CPU_THREADS")) n = std::atoi(env);
  if (n <= 0) {
    cpu_set_t set;
    n = 1;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
  }
  return (int)std::max<int64_t>(1, std::min<int64_t>(n, tasks));
}

// Runs fn(task, worker) for every task in [0, tasks) on the host's cores (tasks taken in order as
// workers free up; worker in [0, workers), workers = num_workers(tasks)). Which worker runs a task
// changes from call to call, so no kernel may let it change a result (docs/guide/determinism.md):
// a task writes only its own outputs, or its own partial of a sum that is merged in task order.
template <typename Fn>
void parallel_for(int64_t tasks, int workers, Fn fn) {
  std::atomic<int64_t> next{0};
  auto worker = [&](int w) {
    for (int64_t t; (t = next.fetch_add(1)) < tasks;) fn(t, w);
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < workers; ++i) threads.emplace_back(worker, i);
  worker(0);
  for (auto& th : threads) th.join();
}

// Runs body(task, scratch) for every task on the host's cores, one Body::Scratch per worker (a
// task must not read what an earlier task left in it).
template <typename Body>
void parallel_tasks(int64_t tasks, Body body) {
  const int n = num_workers(tasks);
  std::vector<typename Body::Scratch> scratch(n);
  parallel_for(tasks, n, [&](int64_t t, int w) { body(t, scratch[w]); });
}

}  // namespace nsl_cpu
