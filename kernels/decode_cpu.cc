// A decode step's kernels for the CPU, as XLA FFI custom calls (`nsl.kernels.decode_cpu`): the
// cached attention of a few queries over a KV cache plus the step's own keys (one softmax; the
// `Write` variant then stores the step's K/V into the cache in place), and the few-row products
// of its projections ("few-row products" below).
//
// Why this exists: a decode step is bound by reading memory (every layer's K/V and weights once
// per token), and XLA:CPU reads a layer's cache once per query: SPS's two queries (x_i and ρ_i)
// scored the keys as two GEMVs and weighted V in a two-row product that YNNPACK ran at half the
// speed of the one-row one, so a layer's cache attention took 1.4 ms against the standard
// model's 0.7 ms at XS (docs/benchmarks.md#profiles). Here each (batch row, head) reads its K and V once
// for all its queries.
//
// Math (`nsl.nn.kv_cache.attend_parts`, exact; softmax attention, docs/design.md#attention):
//   s = scale · q Kᵀ over the cached keys (K [Dh, S] per row and head, the cache's transposed
//   layout) and the step's own keys, −inf where `nsl.nn.masks.visible` says no; m = max s,
//   l = Σ exp(s − m), out = Σ exp(s − m) V / l, lse = m + log l. A query that sees no key gets
//   out 0 and lse −inf (`nsl.nn.attention.merge_lse`'s convention).
//
// Schedule: one task per (batch row, head) on XLA's own intra-op thread pool (no thread is
// started per call: a call lasts ~0.1-0.4 ms). The cached keys are read in runs of 64-key blocks
// that some query sees (unwritten cache entries are never read): scores as rank-1 updates of the
// [Q, S] score rows (K streamed row by row, each row once), p·V in the register-blocked
// micro-kernel with the Q queries as its rows (V streamed row by row, once, and prefetched while
// K streams). The write variant stores the new K/V last, so an entry it overwrites (the ring's
// oldest token, still visible to this step) is read first.
#include <atomic>
#include <memory>

#include "cpu_simd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace nsl_cpu;

constexpr int64_t kBlock = 64;    // keys per visibility block
constexpr int64_t kMaxQ = 16;     // queries per call the kernel takes (the host checks)

struct Args {
  const float *q, *kc, *vc, *kn, *vn;
  const bool *vis_c, *vis_n;
  float *out, *lse;
  int64_t B, Q, H, Dh, S, N;
  float scale;
  float *k_put = nullptr, *v_put = nullptr;  // the cache itself (aliased): the new K/V are written here
  const int32_t* write = nullptr;             // [N]: entry of each new slot (>= S: not kept)
};

// Runs fn(task) for every task in [0, tasks): the calling thread and up to workers − 1 helpers
// scheduled on XLA's pool take tasks in order. The caller waits only for tasks that were taken,
// never for a helper to start (a pool whose threads are all busy cannot deadlock it); a helper
// that starts after the last task is done finds none and only touches the shared counters.
template <typename Fn>
void pool_for(ffi::ThreadPool& pool, int64_t tasks, int workers, Fn fn) {
  struct Shared {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto sh = std::make_shared<Shared>();
  auto body = [sh, tasks, fnp = &fn] {  // fn is dereferenced only for a task taken before the caller returns
    for (int64_t t; (t = sh->next.fetch_add(1)) < tasks;) {
      (*fnp)(t);
      sh->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int i = 1; i < workers; ++i) pool.Schedule(decltype(body)(body));  // Schedule takes its own copy
  body();
  while (sh->done.load(std::memory_order_acquire) < tasks) sched_yield();
}

struct Scratch {  // per thread (thread_local): XLA's pool threads live as long as the process
  std::vector<float> qs, s, acc, inv_l;
  std::vector<int64_t> runs;
};

// One (batch row, head): scores, softmax and the weighted values of its Q queries.
void task(const Args& a, int64_t bh) {
  thread_local Scratch sc;
  const int64_t b = bh / a.H, h = bh % a.H, Q = a.Q, Dh = a.Dh, S = a.S, N = a.N;
  const int64_t ld = S + N;  // a query's score row: cached keys, then the step's own
  sc.qs.resize(Q * Dh);
  sc.s.resize(Q * ld);
  sc.acc.assign(Q * Dh, 0.0f);
  sc.inv_l.resize(Q);
  for (int64_t i = 0; i < Q; ++i)
    for (int64_t d = 0; d < Dh; ++d) sc.qs[i * Dh + d] = a.q[((b * Q + i) * a.H + h) * Dh + d] * a.scale;
  const bool* vis = a.vis_c + b * Q * S;
  // Runs [lo, hi) of key blocks some query sees.
  sc.runs.clear();
  for (int64_t k0 = 0; k0 < S; k0 += kBlock) {
    const int64_t k1 = std::min(S, k0 + kBlock);
    bool any = false;
    for (int64_t i = 0; i < Q && !any; ++i)
      for (int64_t k = k0; k < k1; ++k)
        if (vis[i * S + k]) {
          any = true;
          break;
        }
    if (!any) continue;
    if (!sc.runs.empty() && sc.runs.back() == k0)
      sc.runs.back() = k1;
    else {
      sc.runs.push_back(k0);
      sc.runs.push_back(k1);
    }
  }
  float* s = sc.s.data();
  const float* K = a.kc + bh * Dh * S;  // [Dh, S]
  const float* V = a.vc + bh * S * Dh;  // [S, Dh]
  // V's visible rows are prefetched while the scores stream K, so both reads are in flight at once
  // (one sequential stream per core left the second query's arithmetic exposed; docs/benchmarks.md#profiles).
  int64_t v_lines = 0;
  for (size_t r = 0; r < sc.runs.size(); r += 2) v_lines += (sc.runs[r + 1] - sc.runs[r]) * Dh * 4 / 64;
  const int64_t per_row = (v_lines + Dh - 1) / Dh;  // lines of V per K row streamed (first run's rows)
  int64_t v_run = 0, v_at = sc.runs.empty() ? 0 : sc.runs[0] * Dh * 4;  // byte cursor in the current run
  auto prefetch_v = [&] {
    for (int64_t n = 0; n < per_row && v_run < (int64_t)sc.runs.size(); ++n) {
      __builtin_prefetch(reinterpret_cast<const char*>(V) + v_at, 0, 2);
      v_at += 64;
      if (v_at >= sc.runs[v_run + 1] * Dh * 4) {
        v_run += 2;
        if (v_run < (int64_t)sc.runs.size()) v_at = sc.runs[v_run] * Dh * 4;
      }
    }
  };
  // Scores of the cached keys: rank-1 updates s[i, :] += q[i, d] · K[d, :], one K row at a time.
  for (size_t r = 0; r < sc.runs.size(); r += 2) {
    const int64_t lo = sc.runs[r], hi = sc.runs[r + 1], nvec = (hi - lo) / W * W;
    for (int64_t i = 0; i < Q; ++i) std::fill(s + i * ld + lo, s + i * ld + hi, 0.0f);
    for (int64_t d = 0; d < Dh; ++d) {
      if (r == 0) prefetch_v();
      const float* kr = K + d * S;
      int64_t i = 0;
      for (; i + 2 <= Q; i += 2) {
        const vf q0 = splat(sc.qs[i * Dh + d]), q1 = splat(sc.qs[(i + 1) * Dh + d]);
        float *s0 = s + i * ld, *s1 = s0 + ld;
        for (int64_t k = lo; k < lo + nvec; k += W) {
          const vf kv = load(kr + k);
          store(s0 + k, load(s0 + k) + q0 * kv);
          store(s1 + k, load(s1 + k) + q1 * kv);
        }
        for (int64_t k = lo + nvec; k < hi; ++k) {
          s0[k] += q0[0] * kr[k];
          s1[k] += q1[0] * kr[k];
        }
      }
      if (i < Q) {
        const vf q0 = splat(sc.qs[i * Dh + d]);
        float* s0 = s + i * ld;
        for (int64_t k = lo; k < lo + nvec; k += W) store(s0 + k, load(s0 + k) + q0 * load(kr + k));
        for (int64_t k = lo + nvec; k < hi; ++k) s0[k] += q0[0] * kr[k];
      }
    }
  }
  // The step's own keys ([B, N, H, Dh], a few): plain dots.
  for (int64_t i = 0; i < Q; ++i)
    for (int64_t n = 0; n < N; ++n) {
      const float* kn = a.kn + ((b * N + n) * a.H + h) * Dh;
      float dot = 0.0f;
      for (int64_t d = 0; d < Dh; ++d) dot += sc.qs[i * Dh + d] * kn[d];
      s[i * ld + S + n] = dot;
    }
  // Softmax per query over its visible keys; the unnormalised weights overwrite the scores.
  for (int64_t i = 0; i < Q; ++i) {
    float* si = s + i * ld;
    const bool* vi = vis + i * S;
    const bool* vni = a.vis_n + (b * Q + i) * N;
    float m = kNegInf;
    for (size_t r = 0; r < sc.runs.size(); r += 2)
      for (int64_t k = sc.runs[r]; k < sc.runs[r + 1]; ++k) {
        si[k] = vi[k] ? si[k] : kNegInf;
        m = std::max(m, si[k]);
      }
    for (int64_t n = 0; n < N; ++n) {
      si[S + n] = vni[n] ? si[S + n] : kNegInf;
      m = std::max(m, si[S + n]);
    }
    float* oi = a.out + ((b * Q + i) * a.H + h) * Dh;
    float* li = a.lse + (b * a.H + h) * Q + i;
    if (m == kNegInf) {  // sees nothing
      std::fill(oi, oi + Dh, 0.0f);
      *li = kNegInf;
      for (size_t r = 0; r < sc.runs.size(); r += 2) std::fill(si + sc.runs[r], si + sc.runs[r + 1], 0.0f);
      continue;
    }
    float l = 0.0f;
    for (size_t r = 0; r < sc.runs.size(); r += 2) {
      const int64_t lo = sc.runs[r], hi = sc.runs[r + 1], nvec = (hi - lo) / W * W;
      l = exp_sum(si + lo, nvec, m, l);
      for (int64_t k = lo + nvec; k < hi; ++k) l += (si[k] = std::exp(si[k] - m));
    }
    for (int64_t n = 0; n < N; ++n) l += (si[S + n] = std::exp(si[S + n] - m));
    *li = m + std::log(l);
    sc.inv_l[i] = 1.0f / l;
  }
  // Weighted values: acc[Q, Dh] = P[Q, run] · V[run, Dh], in the micro-kernel (Q rows).
  float* acc = sc.acc.data();
  for (size_t r = 0; r < sc.runs.size(); r += 2) {
    const int64_t lo = sc.runs[r], len = sc.runs[r + 1] - lo;
    for (int64_t c = 0; c < Dh; c += NV_MAX * W) {
      const int64_t width = std::min<int64_t>(NV_MAX * W, Dh - c);
      const float* Vp = V + lo * Dh + c;
      switch (width / W) {
        case 1: gemm_panel<1>(Q, len, s + lo, ld, 1, Vp, Dh, acc + c, Dh, true); break;
        case 2: gemm_panel<2>(Q, len, s + lo, ld, 1, Vp, Dh, acc + c, Dh, true); break;
#if NV_MAX_IS_4
        case 3: gemm_panel<3>(Q, len, s + lo, ld, 1, Vp, Dh, acc + c, Dh, true); break;
        case 4: gemm_panel<4>(Q, len, s + lo, ld, 1, Vp, Dh, acc + c, Dh, true); break;
#endif
        default: break;
      }
    }
  }
  for (int64_t i = 0; i < Q; ++i) {
    const float* si = s + i * ld;
    float* oi = a.out + ((b * Q + i) * a.H + h) * Dh;
    if (a.lse[(b * a.H + h) * Q + i] == kNegInf) continue;
    const float inv = sc.inv_l[i];
    for (int64_t d = 0; d < Dh; ++d) {
      float x = acc[i * Dh + d];
      for (int64_t n = 0; n < N; ++n) x += si[S + n] * a.vn[((b * N + n) * a.H + h) * Dh + d];
      oi[d] = x * inv;
    }
  }
  // The step's own K/V into the cache, after every read of this (batch row, head) above: an entry
  // overwritten here (the ring's oldest token) was still visible to these queries.
  if (a.k_put)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t e = a.write[n];
      if (e < 0 || e >= S) continue;
      const float* kn = a.kn + ((b * N + n) * a.H + h) * Dh;
      const float* vn = a.vn + ((b * N + n) * a.H + h) * Dh;
      float* kp = a.k_put + bh * Dh * S + e;
      for (int64_t d = 0; d < Dh; ++d) kp[d * S] = kn[d];
      std::memcpy(a.v_put + (bh * S + e) * Dh, vn, Dh * sizeof(float));
    }
}

ffi::Error Check(ffi::Buffer<ffi::F32>& q, ffi::Buffer<ffi::F32>& kc, ffi::Buffer<ffi::F32>& vc,
                 ffi::Buffer<ffi::PRED>& vis_c, ffi::Buffer<ffi::F32>& kn, ffi::Buffer<ffi::F32>& vn,
                 ffi::Buffer<ffi::PRED>& vis_n, Args& a) {
  auto qd = q.dimensions(), kd = kc.dimensions(), vd = vc.dimensions(), nd = kn.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || nd.size() != 4)
    return ffi::Error::InvalidArgument("decode_cpu: q [B, Q, H, Dh], K [B, H, Dh, S], V [B, H, S, Dh], "
                                       "new K/V [B, N, H, Dh]");
  const int64_t B = qd[0], Q = qd[1], H = qd[2], Dh = qd[3], S = kd[3], N = nd[1];
  if (kd[0] != B || kd[1] != H || kd[2] != Dh || vd[0] != B || vd[1] != H || vd[2] != S || vd[3] != Dh ||
      nd[0] != B || nd[2] != H || nd[3] != Dh || vn.element_count() != kn.element_count() ||
      vis_c.element_count() != B * Q * S || vis_n.element_count() != B * Q * N)
    return ffi::Error::InvalidArgument("decode_cpu: operand shapes disagree");
  if (Dh % W || Q > kMaxQ || Q < 1)
    return ffi::Error::InvalidArgument("decode_cpu: head dim must be a multiple of the vector width, "
                                       "and 1-16 queries");
  a = Args{q.typed_data(), kc.typed_data(), vc.typed_data(), kn.typed_data(), vn.typed_data(),
           vis_c.typed_data(), vis_n.typed_data(), nullptr, nullptr, B, Q, H, Dh, S, N,
           1.0f / std::sqrt((float)Dh)};
  return ffi::Error::Success();
}

void Run(ffi::ThreadPool& pool, const Args& a) {
  const int64_t tasks = a.B * a.H;
  pool_for(pool, tasks, num_workers(tasks), [&](int64_t t) { task(a, t); });
}

ffi::Error Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> kc, ffi::Buffer<ffi::F32> vc,
                ffi::Buffer<ffi::PRED> vis_c, ffi::Buffer<ffi::F32> kn, ffi::Buffer<ffi::F32> vn,
                ffi::Buffer<ffi::PRED> vis_n, ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> lse) {
  Args a;
  if (auto err = Check(q, kc, vc, vis_c, kn, vn, vis_n, a); !err.success()) return err;
  a.out = out->typed_data();
  a.lse = lse->typed_data();
  Run(pool, a);
  return ffi::Error::Success();
}

// The same, and the step's K/V written at `write` into the cache, which the call updates in place
// (K and V are aliased to the last two results): one pass over the layer's cache instead of XLA's
// separate in-place update, whose transposed-K column touches Dh·B·H scattered lines.
ffi::Error WriteImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> kc,
                     ffi::Buffer<ffi::F32> vc, ffi::Buffer<ffi::PRED> vis_c, ffi::Buffer<ffi::F32> kn,
                     ffi::Buffer<ffi::F32> vn, ffi::Buffer<ffi::PRED> vis_n, ffi::Buffer<ffi::S32> write,
                     ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> lse,
                     ffi::ResultBuffer<ffi::F32> k_put, ffi::ResultBuffer<ffi::F32> v_put) {
  Args a;
  if (auto err = Check(q, kc, vc, vis_c, kn, vn, vis_n, a); !err.success()) return err;
  if (write.element_count() != a.N || k_put->element_count() != kc.element_count() ||
      v_put->element_count() != vc.element_count())
    return ffi::Error::InvalidArgument("decode_cpu: write [N] and the cache's K/V as results");
  a.out = out->typed_data();
  a.lse = lse->typed_data();
  a.k_put = k_put->typed_data();
  a.v_put = v_put->typed_data();
  a.write = write.typed_data();
  // Aliased results are the cache buffers; read the cache through them in case XLA gave a copy.
  a.kc = a.k_put;
  a.vc = a.v_put;
  Run(pool, a);
  return ffi::Error::Success();
}


// ----------------------------------------------------------------------------- few-row products
// y[M, N] = x[M, K] · W[K, N] for the few rows of a decode step (`layers.dense`). XLA:CPU ran a
// decode step's products at ~65% of the weights' read bandwidth, and 16 rows (an SPS step's x and
// ρ slots) 1.6-1.8 ms a step slower than 8 at XS (docs/benchmarks.md#profiles). Such a product reads W once
// and is bound by how many lines a core keeps in flight, so each task streams a contiguous range
// of W's rows (whole rows, or a column chunk of them on many cores), in blocks of 32 rows: every
// row of x passes over a block in the register-blocked micro-kernel, whose k loop prefetches the
// next block (`gemm_panel_pf`). Row ranges after the first sum into partial products, added last.
//
// Determinism (docs/guide/determinism.md): the row ranges are fixed by K alone (min(blocks, 4) of
// them), never by the number of cores, and their partials are added in range order; the cores only
// change how the columns are split, which changes no sum. The attention kernels above write each
// (batch row, head) from one task. So every result is the same bits whichever thread runs what,
// and on any number of cores.

constexpr int64_t kMaxRows = 32;     // rows a product may have here (the host checks)
constexpr int64_t kRowBlock = 32;    // rows of W per block
constexpr int64_t kMaxRowSplit = 4;  // row ranges at most (each adds an [M, N] partial to sum)
constexpr int64_t PW = NV_MAX * W;   // the micro-kernel's panel width

// out[:, n0:n1] = x[:, r0:r1] · W[r0:r1, n0:n1] (out's row stride N).
void mm_task(const float* x, const float* w, float* out, int64_t M, int64_t K, int64_t N, int64_t r0, int64_t r1,
             int64_t n0, int64_t n1) {
  const char* col0 = reinterpret_cast<const char*>(w + n0);
  RowPrefetch pf{col0 + std::min(r1, r0 + kRowBlock) * N * 4, col0 + r1 * N * 4, 0, (n1 - n0) * 4, N * 4};
  for (int64_t k0 = r0; k0 < r1; k0 += kRowBlock) {
    const int64_t kb = std::min(kRowBlock, r1 - k0);
    for (int64_t n = n0; n < n1; n += PW) {
      const float* b = w + k0 * N + n;
      switch (std::min(PW, n1 - n) / W) {
        case 1: gemm_panel<1>(M, kb, x + k0, K, 1, b, N, out + n, N, k0 > r0); break;
#if NV_MAX_IS_4
        case 2: gemm_panel<2>(M, kb, x + k0, K, 1, b, N, out + n, N, k0 > r0); break;
        case 3: gemm_panel<3>(M, kb, x + k0, K, 1, b, N, out + n, N, k0 > r0); break;
#endif
        default: gemm_panel_pf(M, kb, x + k0, K, 1, b, N, out + n, N, k0 > r0, pf); break;
      }
    }
  }
}

ffi::Error MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                      ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0])
    return ffi::Error::InvalidArgument("decode_cpu matmul: x [M, K], W [K, N]");
  const int64_t M = xd[0], K = xd[1], N = wd[1];
  if (M > kMaxRows || N % W)
    return ffi::Error::InvalidArgument("decode_cpu matmul: at most 32 rows, N a multiple of the vector width");
  float* yp = y->typed_data();
  if (K == 0) std::fill(yp, yp + M * N, 0.0f);
  if (M == 0 || N == 0 || K == 0) return ffi::Error::Success();
  const float *xp = x.typed_data(), *wp = w.typed_data();
  // R row ranges (fixed by K: the order of the sums) × C column chunks (by the cores), one task each.
  const int64_t blocks = (K + kRowBlock - 1) / kRowBlock, panels = (N + PW - 1) / PW;
  const int64_t R = std::min<int64_t>(blocks, kMaxRowSplit);
  const int workers = num_workers(R * panels);
  const int64_t C = std::min<int64_t>(panels, std::max<int64_t>(1, workers / R));
  const int64_t cw = (panels + C - 1) / C * PW;
  std::unique_ptr<float[]> part(R > 1 ? new float[(R - 1) * M * N] : nullptr);
  pool_for(pool, R * C, workers, [&](int64_t t) {
    const int64_t r = t / C, c = t % C, n0 = c * cw, n1 = std::min(N, n0 + cw);
    if (n0 >= n1) return;
    mm_task(xp, wp, r ? part.get() + (r - 1) * M * N : yp, M, K, N, r * blocks / R * kRowBlock,
            std::min(K, (r + 1) * blocks / R * kRowBlock), n0, n1);
  });
  for (int64_t r = 1; r < R; ++r) {
    const float* pr = part.get() + (r - 1) * M * N;
    for (int64_t i = 0; i < M * N; i += W) store(yp + i, load(yp + i) + load(pr + i));
  }
  return ffi::Error::Success();
}

}  // namespace

// Both attention handlers take q, the cache's K and V and visibility, the step's K/V and visibility.
static auto AttendArgs() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::PRED>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::PRED>>();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(NslDecodeCpu, Impl, AttendArgs().Ret<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(NslDecodeCpuWrite, WriteImpl,
                              AttendArgs()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(NslDecodeMatmulCpu, MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// The head dim (and a product's N) must be a multiple of this (the float vector: 16 with AVX-512, 8 with AVX2).
extern "C" int NslDecodeCpuVectorWidth() { return (int)W; }
