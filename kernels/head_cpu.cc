// The tied output head and its softmax cross-entropy for the CPU, with the gradients of h and E
// formed in the same pass, as one XLA FFI custom call.
//
// Why this exists: at nsl's small CPU sizes the 50k-way head is most of a step's FLOPs (78% at
// d 256, 4 layers), and XLA:CPU runs `nsl.nn.cross_entropy.head_cross_entropy`'s chunked scan as three
// [1024, 256] × [256, 50304]-sized dots at ~80-100 GFLOP/s on 2 cores plus five passes over a
// 206 MB logits block; here the three products run in the register-blocked micro-kernel on
// cache-sized tiles and the softmax is applied while a tile is hot (docs/benchmarks.md#profiles).
//
// Math (the mean next-token NLL, docs/papers/sps.md#loss; nothing approximated):
//   z = scale · h Eᵀ, nll_r = logsumexp(z_r) − z_r[t_r], loss = Σ_r w_r nll_r / max(Σ w, 1).
//   With c_r = w_r · scale / max(Σ w, 1) (the caller's `coef`), p = softmax(z):
//   dh_r = c_r (Σ_v p_rv E_v − E_{t_r}),  dE_v = Σ_r c_r (p_rv − [v = t_r]) h_r.
//
// Schedule: rows in blocks of kRows; per block, vocabulary chunks of kChunk are tasks over the
// host's cores. Pass 1 (per chunk): z for the block's rows, the chunk's row max m and
// s = Σ exp(z − m), exp(z − m) kept chunk-major ([chunks, rows, kChunk]: pass 2 reads a chunk's
// block back as one contiguous run). Then per row: M = max m, S = Σ s e^{m−M},
// nll, and per (row, chunk) the factor c_r e^{m−M} / S. Pass 2 (per chunk, gradients only): the
// chunk's buffer times its factors is c_r p (in place), then the chunk's rows of dE and its share of
// dh from it; the one-hot terms are subtracted last. Three products per row and vocabulary entry, as
// the XLA path; nothing is transposed but packed E chunks.
//
// Determinism (docs/guide/determinism.md): dh sums over the whole vocabulary, so its order is fixed
// by the data, not by the threads: pass 2's tasks are groups of kGroup consecutive chunks, each
// summing its chunks in order into its own dh partial, and the partials are added in group order.
// Every other output is written by one task. The bits depend on the shapes and the build only, not
// on the number of workers or which one ran which task.
// Measured at 2048 × 256 × 50,304 on 2 AVX2 cores: 1.04 s (≈150 GFLOP/s; the dh product ≈78 GFLOP/s
// a core, the micro-kernel's ceiling) against 1.3-1.5 s for the XLA scan (same process); on 2
// AVX-512 cores 0.60-0.64 s (250-264 GFLOP/s; with the block as 256 strided rows of a [rows, V]
// buffer 0.69-0.76 s).
#include <memory>
#include <mutex>

#include "cpu_simd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace nsl_cpu;

constexpr int64_t kRows = 256;   // rows per block: the buffer is kRows · V floats (51 MB at 50k)
constexpr int64_t kChunk = 256;  // vocabulary per task: a packed E chunk is 256 KB at d 256
constexpr int64_t kGroup = 4;   // chunks per pass-2 task, one dh partial each (1/8 of packed E's size)
constexpr int64_t PW = NV_MAX * W;  // packed panel width (16 with AVX2, 64 with AVX-512)

// Buffers reused across calls (a fresh 150 MB mapping per call costs its page faults every step);
// one call at a time holds them.
struct Pool {
  std::mutex mu;
  std::unique_ptr<float[]> buf;
  int64_t size = 0;
  float* get(int64_t n) {
    if (n > size) {
      buf.reset(new float[n]);
      size = n;
    }
    return buf.get();
  }
};

Pool& pool() {
  static Pool p;
  return p;
}

struct Head {
  const float *h, *E, *coef;
  const int32_t* t;
  int64_t N, V, D;
  float scale;
  bool grads;
  float *nll, *dh, *dE;

  int workers = 1;
  int64_t nch = 0;
  int64_t zrows = 0;                 // min(kRows, N): the rows of a block
  float* z = nullptr;                // [nch, zrows, kChunk]: exp(z − m) of the current block, chunk-major
  float* zchunk(int64_t c) const { return z + c * zrows * kChunk; }  // chunk c's [rows, L] block, row stride L
  float* et = nullptr;               // Eᵀ packed per chunk as [L/PW][D][PW] (at v0·D)
  float* ep = nullptr;               // E packed per chunk as [D/PW][L][PW] (at v0·D; gradients only)
  std::vector<float> m, s;           // [kRows, nch]: per-chunk row max and sum; then the factors
  std::vector<float> zt;             // [kRows]: z_r[t_r]
  std::vector<float> hs;             // the block's rows times scale (pass 1's A operand)
  std::vector<float> hp;             // the block's h packed [D/PW][rows][PW] (pass 2's B operand)
  float* dhg = nullptr;              // [groups, zrows, D]: each chunk group's dh partial
  void chunk_range(int64_t c, int64_t& v0, int64_t& L) const {
    v0 = c * kChunk;
    L = std::min(kChunk, V - v0);
  }

  // Both B-operand layouts of chunk c, once per call (every row block reuses them).
  void pack(int64_t c) {
    int64_t v0, L;
    chunk_range(c, v0, L);
    for (int64_t p = 0; p < L / PW; ++p)
      for (int64_t j = 0; j < PW; ++j) {
        const float* src = E + (v0 + p * PW + j) * D;
        float* dst = et + v0 * D + p * D * PW + j;
        for (int64_t d = 0; d < D; ++d) dst[d * PW] = src[d];
      }
    if (grads)
      for (int64_t p = 0; p < D / PW; ++p)
        for (int64_t j = 0; j < L; ++j)
          std::memcpy(ep + v0 * D + (p * L + j) * PW, E + (v0 + j) * D + p * PW, PW * sizeof(float));
  }

  // Pass 1 over chunk c for rows [r0, r0 + R).
  void logits(int64_t c, int64_t r0, int64_t R) {
    int64_t v0, L;
    chunk_range(c, v0, L);
    for (int64_t p = 0; p < L / PW; ++p)
      gemm_panel<NV_MAX>(R, D, hs.data(), D, 1, et + v0 * D + p * D * PW, PW, zchunk(c) + p * PW, L, false);
    for (int64_t r = 0; r < R; ++r) {
      float* zr = zchunk(c) + r * L;
      const float mx = row_max(zr, L);
      const int64_t tj = t[r0 + r] - v0;
      if (tj >= 0 && tj < L) zt[r] = zr[tj];  // before exp_sum overwrites the logit
      m[r * nch + c] = mx;
      s[r * nch + c] = exp_sum(zr, L, mx);
    }
  }

  int64_t groups() const { return (nch + kGroup - 1) / kGroup; }

  // Pass 2 over chunk c: m now holds the factors c_r e^{m − M} / S. `dhp` is the chunk's group's
  // dh partial, which the group's first chunk overwrites (`lead`).
  void grads_chunk(int64_t c, float* dhp, bool lead, int64_t R, bool first) {
    int64_t v0, L;
    chunk_range(c, v0, L);
    for (int64_t r = 0; r < R; ++r) {  // exp(z − m) → p · c in place
      const vf f = splat(m[r * nch + c]);
      float* zr = zchunk(c) + r * L;
      for (int64_t j = 0; j < L; j += W) store(zr + j, load(zr + j) * f);
    }
    const float* pz = zchunk(c);
    for (int64_t p = 0; p < D / PW; ++p)  // dh[rows, D] (+)= P[rows, L] · E[L, D]
      gemm_panel<NV_MAX>(R, L, pz, L, 1, ep + v0 * D + p * L * PW, PW, dhp + p * PW, D, !lead);
    for (int64_t p = 0; p < D / PW; ++p)  // dE[L, D] (+)= Pᵀ[L, rows] · h[rows, D]
      gemm_panel<NV_MAX>(L, R, pz, 1, L, hp.data() + p * R * PW, PW, dE + v0 * D + p * PW, D, !first);
  }

  void run() {
    nch = (V + kChunk - 1) / kChunk;
    workers = num_workers(nch);
    const int64_t rows = std::min(kRows, N);
    m.resize(rows * nch);
    s.resize(rows * nch);
    zt.resize(rows);
    hs.resize(rows * D);
    if (grads) hp.resize(rows * D);
    parallel_for(nch, workers, [&](int64_t c, int) { pack(c); });
    for (int64_t r0 = 0; r0 < N; r0 += kRows) {
      const int64_t R = std::min(kRows, N - r0);
      for (int64_t i = 0; i < R * D; ++i) hs[i] = h[r0 * D + i] * scale;
      parallel_for(nch, workers, [&](int64_t c, int) { logits(c, r0, R); });
      for (int64_t r = 0; r < R; ++r) {
        const float* mr = m.data() + r * nch;
        float* sr = s.data() + r * nch;
        float M = kNegInf, S = 0.0f;
        for (int64_t c = 0; c < nch; ++c) M = std::max(M, mr[c]);
        for (int64_t c = 0; c < nch; ++c) S += sr[c] * std::exp(mr[c] - M);
        nll[r0 + r] = M + std::log(S) - zt[r];
        const float cr = coef[r0 + r] / S;
        for (int64_t c = 0; c < nch; ++c) m[r * nch + c] = cr * std::exp(mr[c] - M);
      }
      if (!grads) continue;
      for (int64_t p = 0; p < D / PW; ++p)
        for (int64_t r = 0; r < R; ++r)
          std::memcpy(hp.data() + (p * R + r) * PW, h + (r0 + r) * D + p * PW, PW * sizeof(float));
      const int64_t G = groups();
      parallel_for(G, num_workers(G), [&](int64_t g, int) {
        float* dhp = dhg + g * zrows * D;
        for (int64_t c = g * kGroup; c < std::min(nch, (g + 1) * kGroup); ++c)
          grads_chunk(c, dhp, c == g * kGroup, R, r0 == 0);
      });
      // dh = −c_r E_t + Σ_g partial_g in group order, in 16-row slices; a large merge (50k vocabulary:
      // 1-2% of a block's time) over the cores, a small one here (a thread start costs more).
      const int64_t slices = (R + 15) / 16;
      const int merge_workers = G * R * D > (int64_t{1} << 21) ? num_workers(slices) : 1;
      parallel_for(slices, merge_workers, [&](int64_t i, int) {
        for (int64_t r = i * 16; r < std::min(R, i * 16 + 16); ++r) {
          const float cr = coef[r0 + r];
          const float* et = E + (int64_t)t[r0 + r] * D;
          float* dhr = dh + (r0 + r) * D;
          for (int64_t d = 0; d < D; d += W) {
            vf acc = splat(-cr) * load(et + d);
            for (int64_t g = 0; g < G; ++g) acc += load(dhg + (g * zrows + r) * D + d);
            store(dhr + d, acc);
          }
        }
      });
      // The one-hot terms of dE, in row order (rows may share a target).
      for (int64_t r = 0; r < R; ++r) {
        const float cr = coef[r0 + r];
        const float* hr = h + (r0 + r) * D;
        float* der = dE + (int64_t)t[r0 + r] * D;
        for (int64_t d = 0; d < D; ++d) der[d] -= cr * hr[d];
      }
    }
  }
};

ffi::Error Impl(ffi::Buffer<ffi::F32> h, ffi::Buffer<ffi::F32> E, ffi::Buffer<ffi::S32> t,
                ffi::Buffer<ffi::F32> coef, float scale, int64_t grads, ffi::ResultBuffer<ffi::F32> nll,
                ffi::ResultBuffer<ffi::F32> dh, ffi::ResultBuffer<ffi::F32> dE) {
  auto hd = h.dimensions(), ed = E.dimensions();
  if (hd.size() != 2 || ed.size() != 2 || hd[1] != ed[1] || t.element_count() != hd[0] ||
      coef.element_count() != hd[0])
    return ffi::Error::InvalidArgument("head_cpu: h [N, D], E [V, D], targets and coef [N]");
  const int64_t N = hd[0], V = ed[0], D = hd[1];
  if (D % PW || V % PW)
    return ffi::Error::InvalidArgument("head_cpu: d_model and vocabulary must be multiples of the "
                                       "panel width");
  const int32_t* tp = t.typed_data();
  for (int64_t r = 0; r < N; ++r)
    if (tp[r] < 0 || tp[r] >= V) return ffi::Error::InvalidArgument("head_cpu: a target is outside the vocabulary");
  if (N == 0) return ffi::Error::Success();
  Pool& pl = pool();
  std::lock_guard<std::mutex> lock(pl.mu);
  Head hc{h.typed_data(), E.typed_data(), coef.typed_data(), tp, N, V, D, scale, grads != 0,
          nll->typed_data(), dh->typed_data(), dE->typed_data()};
  hc.zrows = std::min(kRows, N);
  const int64_t nch = (V + kChunk - 1) / kChunk;
  const int64_t zn = hc.zrows * nch * kChunk;  // Head::zchunk's layout
  const int64_t gn = grads ? (nch + kGroup - 1) / kGroup * hc.zrows * D : 0;  // Head::dhg
  hc.z = pl.get(zn + (grads ? 2 : 1) * V * D + gn);
  hc.et = hc.z + zn;
  hc.ep = hc.et + V * D;
  hc.dhg = hc.ep + (grads ? V * D : 0);
  hc.run();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(NslHeadCpu, Impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("grads")
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// The panel width D and V must be multiples of (16 with AVX2, 64 with AVX-512): asked by the host.
extern "C" int NslHeadCpuPanelWidth() { return (int)PW; }
