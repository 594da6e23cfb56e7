// Block-sparse flash attention for the CPU, forward and backward, as XLA FFI custom calls.
//
// Why this exists: XLA:CPU runs nsl's chunked attention (`nsl/nn/attention.py`, `_rows`) as
// batched dots whose key operand is a slice of K or V, and it copies every slice before the
// dot (~14% of the op at 1024 causal tokens); the exact-softmax row schedule it runs is
// otherwise what this kernel runs. Here each (batch, head) is one task that reads q/k/v in place
// ([B, S, H, D], row stride H·D), so nothing is copied but a transposed K (and V) per task.
//
// Math (softmax attention, docs/design.md#attention; FlashAttention-2's backward recomputation):
//   S = scale · Q Kᵀ on the visible key blocks of a query block, masked by the nsl rule
//   (`nsl.nn.masks.visible`), P = exp(S − m) / l row by row over all its visible keys at once
//   (exact, no online rescaling: a 64-row block's scores stay in L2), O = P V, lse = m + log l.
//   Backward: P = exp(S − lse), dP = dO Vᵀ, δ = rowsum(dO ∘ O) − dlse, dS = scale · P ∘ (dP − δ),
//   dQ = dS K, dK = dSᵀ Q, dV = Pᵀ dO. A row that sees no key has out 0, lse −inf, no gradient.
//
// Tiles: the host passes the static block map (`nsl.nn.masks.block_map`: EMPTY / PARTIAL / FULL
// from pos/tok/kind); per batch row a FULL tile whose query and key segment ids are one and the
// same id stays unmasked, one whose id ranges are disjoint is skipped (packed documents), and
// any other is masked per element. The products are a register-blocked kernel (6 rows × 2-4
// float vectors: GCC vector extensions, AVX2 or AVX-512 as the build host has).
#include "cpu_simd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace nsl_cpu;

constexpr int8_t kEmpty = 0, kPartial = 1;  // nsl.nn.masks block-map codes (FULL = 2)

// B operands are packed in column panels of nv·W floats: element (k, n) of a [K, N] operand at
// B[(n / pw)·pstride + k·pw + n % pw]. A [S, H·D] tensor's rows (or a transposed [D, S] one's)
// sit at a 1-4 KiB stride, which maps a micro-kernel's panel onto a few L1 sets; packed, a
// panel is one contiguous stream (measured: docs/benchmarks.md#profiles).
struct Panels {
  int nv;       // vectors per panel row
  int64_t pw;   // panel width nv·W
};

// C[M, N] (+)= A(M×K) · B, B packed (Panels) with panel stride pstride; N a multiple of pw.
void gemm(const Panels& pk, int64_t M, int64_t N, int64_t K, const float* A, int64_t rsa,
          int64_t csa, const float* B, int64_t pstride, float* C, int64_t ldc, bool acc) {
  for (int64_t n = 0, i = 0; n < N; n += pk.pw, ++i) {
    const float* b = B + i * pstride;
    switch (pk.nv) {
      case 1: gemm_panel<1>(M, K, A, rsa, csa, b, 1 * W, C + n, ldc, acc); break;
      case 2: gemm_panel<2>(M, K, A, rsa, csa, b, 2 * W, C + n, ldc, acc); break;
#if NV_MAX_IS_4
      case 3: gemm_panel<3>(M, K, A, rsa, csa, b, 3 * W, C + n, ldc, acc); break;
      case 4: gemm_panel<4>(M, K, A, rsa, csa, b, 4 * W, C + n, ldc, acc); break;
#endif
      default: break;
    }
  }
}

// Rows [0, S) × D of one (b, h) of a [B, S, H, D] tensor, packed as a [S, D] B operand
// (k = slot, n = feature): rows r0.. start at dst + r0·pw, panel stride S·pw.
void pack_rows(const float* x, int64_t b, int64_t h, int64_t S, int64_t H, int64_t D,
               const Panels& pk, float* dst) {
  const float* base = x + (b * S * H + h) * D;
  for (int64_t d0 = 0; d0 < D; d0 += pk.pw, dst += S * pk.pw)
    for (int64_t s = 0; s < S; ++s) std::memcpy(dst + s * pk.pw, base + s * H * D + d0, pk.pw * sizeof(float));
}

// The same rows transposed, packed as a [D, S] B operand (k = feature, n = slot): key block j
// of width bk starts at dst + (j·bk / pw)·D·pw, panel stride D·pw.
void pack_cols(const float* x, int64_t b, int64_t h, int64_t S, int64_t H, int64_t D,
               const Panels& pk, float* dst) {
  const float* base = x + (b * S * H + h) * D;
  for (int64_t s0 = 0; s0 < S; s0 += pk.pw, dst += D * pk.pw)
    for (int64_t i = 0; i < pk.pw; ++i) {
      const float* src = base + (s0 + i) * H * D;
      for (int64_t d = 0; d < D; ++d) dst[d * pk.pw + i] = src[d];
    }
}

struct Rule {
  bool causal, same_segment;
  int64_t window, persistent_window;  // < 0: none
};

struct Shape {
  int64_t B, Sq, Sk, H, D, bq, bk, nqb, nkb;
  Panels pk;
};

struct Meta {
  const int32_t *q_pos, *q_tok, *k_pos, *k_tok, *k_kind;  // static layout, [S]
  const int32_t *q_seg, *k_seg;                          // [B, S] (zeros when unused)
  const int8_t* bmap;                                    // [nqb, nkb]
};

// What a forward or backward call knows besides its arrays (`describe` fills it in). Each
// (batch row, head) is one task.
struct Call {
  Shape sh;
  Rule rule;
  Meta m;
  float scale;  // 1/√D, the scores' factor
};

// Masks S[rows, bk] (row stride ldS) of query rows q0.. against keys k0.. in place (→ −inf).
void apply_mask(float* S, int64_t ldS, int64_t rows, int64_t bk, const Rule& rule, const Meta& m,
                int64_t b, const Shape& sh, int64_t q0, int64_t k0) {
  const int32_t* qseg = m.q_seg + b * sh.Sq;
  const int32_t* kseg = m.k_seg + b * sh.Sk;
  const vf ninf = splat(kNegInf);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t qp = m.q_pos[q0 + r], qt = m.q_tok[q0 + r], qs = qseg[q0 + r];
    float* s = S + r * ldS;
    for (int64_t c = 0; c < bk; c += W) {
      vi vis = (vi){} - 1;
      if (rule.causal) vis &= loadi(m.k_pos + k0 + c) <= qp;
      if (rule.window >= 0 || rule.persistent_window >= 0) {
        const vi dist = qt - loadi(m.k_tok + k0 + c);
        const vi pers = loadi(m.k_kind + k0 + c) == 0;
        if (rule.window >= 0) vis &= pers | (dist <= (int32_t)rule.window);
        if (rule.persistent_window >= 0) vis &= ~pers | (dist <= (int32_t)rule.persistent_window);
      }
      if (rule.same_segment) vis &= loadi(kseg + k0 + c) == qs;
      store(s + c, vis ? load(s + c) : ninf);
    }
  }
}

// The visible key blocks of query block i for batch row b: (block, needs element mask).
void visible_blocks(const Rule& rule, const Meta& m, const Shape& sh, int64_t b, int64_t i,
                    std::vector<std::pair<int64_t, bool>>& out) {
  out.clear();
  int32_t qmin = 0, qmax = 0;
  if (rule.same_segment) {
    const int32_t* s = m.q_seg + b * sh.Sq + i * sh.bq;
    qmin = *std::min_element(s, s + sh.bq);
    qmax = *std::max_element(s, s + sh.bq);
  }
  for (int64_t j = 0; j < sh.nkb; ++j) {
    const int8_t code = m.bmap[i * sh.nkb + j];
    if (code == kEmpty) continue;
    bool masked = code == kPartial;
    if (rule.same_segment) {
      const int32_t* s = m.k_seg + b * sh.Sk + j * sh.bk;
      const int32_t kmin = *std::min_element(s, s + sh.bk), kmax = *std::max_element(s, s + sh.bk);
      if (kmax < qmin || kmin > qmax) continue;  // no segment in common
      if (!(qmin == qmax && kmin == kmax && qmin == kmin)) masked = true;
    }
    out.emplace_back(j, masked);
  }
}

// Softmax rows of S[rows, L] in place with max subtracted; returns row max and sum.
void softmax_rows(float* S, int64_t ldS, int64_t rows, int64_t L, float* mx, float* sum) {
  for (int64_t r = 0; r < rows; ++r) {
    float* s = S + r * ldS;
    const float m = mx[r] = row_max(s, L);
    if (m == kNegInf) {
      sum[r] = 0.0f;
      std::memset(s, 0, L * sizeof(float));
      continue;
    }
    sum[r] = exp_sum(s, L, m);
  }
}

struct Fwd : Call {
  struct Scratch {
    std::vector<float> qs, kt, vp, s, o, mx, sum;
    std::vector<std::pair<int64_t, bool>> blocks;
  };
  const float *q, *k, *v;
  float *out, *lse;

  void operator()(int64_t task, Scratch& w) const {
    const int64_t b = task / sh.H, h = task % sh.H, HD = sh.H * sh.D, D = sh.D, pw = sh.pk.pw;
    w.qs.resize(sh.bq * D);
    w.kt.resize(D * sh.Sk);
    w.vp.resize(sh.Sk * D);
    w.s.resize(sh.bq * sh.Sk);
    w.o.resize(sh.bq * D);
    w.mx.resize(sh.bq);
    w.sum.resize(sh.bq);
    pack_cols(k, b, h, sh.Sk, sh.H, D, sh.pk, w.kt.data());
    pack_rows(v, b, h, sh.Sk, sh.H, D, sh.pk, w.vp.data());
    for (int64_t i = 0; i < sh.nqb; ++i) {
      const int64_t q0 = i * sh.bq;
      float* orow = out + ((b * sh.Sq + q0) * sh.H + h) * D;
      float* lrow = lse + (b * sh.H + h) * sh.Sq + q0;
      visible_blocks(rule, m, sh, b, i, w.blocks);
      if (w.blocks.empty()) {
        for (int64_t r = 0; r < sh.bq; ++r) {
          std::memset(orow + r * HD, 0, D * sizeof(float));
          lrow[r] = kNegInf;
        }
        continue;
      }
      const int64_t L = (int64_t)w.blocks.size() * sh.bk;
      const float* qrow = q + ((b * sh.Sq + q0) * sh.H + h) * D;
      for (int64_t r = 0; r < sh.bq; ++r)
        for (int64_t d = 0; d < D; ++d) w.qs[r * D + d] = qrow[r * HD + d] * scale;
      for (size_t c = 0; c < w.blocks.size(); ++c) {
        const int64_t j = w.blocks[c].first;
        float* sc = w.s.data() + c * sh.bk;
        gemm(sh.pk, sh.bq, sh.bk, D, w.qs.data(), D, 1, w.kt.data() + j * sh.bk / pw * D * pw, D * pw,
             sc, L, false);
        if (w.blocks[c].second) apply_mask(sc, L, sh.bq, sh.bk, rule, m, b, sh, q0, j * sh.bk);
      }
      softmax_rows(w.s.data(), L, sh.bq, L, w.mx.data(), w.sum.data());
      for (size_t c = 0; c < w.blocks.size(); ++c) {
        const int64_t j = w.blocks[c].first;
        gemm(sh.pk, sh.bq, D, sh.bk, w.s.data() + c * sh.bk, L, 1, w.vp.data() + j * sh.bk * pw,
             sh.Sk * pw, w.o.data(), D, c > 0);
      }
      for (int64_t r = 0; r < sh.bq; ++r) {
        const float l = w.sum[r];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int64_t d = 0; d < D; ++d) orow[r * HD + d] = w.o[r * D + d] * inv;
        lrow[r] = l > 0.0f ? w.mx[r] + std::log(l) : kNegInf;
      }
    }
  }
};

struct Bwd : Call {
  struct Scratch {
    std::vector<float> qs, kt, vt, kp, qp, dop, s, dp, delta, lse, dk, dv;
    std::vector<std::pair<int64_t, bool>> blocks;
  };
  const float *q, *k, *v, *out, *lse, *dout, *dlse;
  float *dq, *dk, *dv;

  void operator()(int64_t task, Scratch& w) const {
    const int64_t b = task / sh.H, h = task % sh.H, HD = sh.H * sh.D, D = sh.D, pw = sh.pk.pw;
    w.qs.resize(sh.bq * D);
    for (auto* x : {&w.kt, &w.vt, &w.kp, &w.dk, &w.dv}) x->resize(sh.Sk * D);
    w.qp.resize(sh.Sq * D);
    w.dop.resize(sh.Sq * D);
    w.s.resize(sh.bq * sh.Sk);
    w.dp.resize(sh.bq * sh.Sk);
    w.delta.resize(sh.bq);
    w.lse.resize(sh.bq);
    pack_cols(k, b, h, sh.Sk, sh.H, D, sh.pk, w.kt.data());
    pack_cols(v, b, h, sh.Sk, sh.H, D, sh.pk, w.vt.data());
    pack_rows(k, b, h, sh.Sk, sh.H, D, sh.pk, w.kp.data());
    pack_rows(q, b, h, sh.Sq, sh.H, D, sh.pk, w.qp.data());
    pack_rows(dout, b, h, sh.Sq, sh.H, D, sh.pk, w.dop.data());
    std::fill(w.dk.begin(), w.dk.end(), 0.0f);
    std::fill(w.dv.begin(), w.dv.end(), 0.0f);
    for (int64_t i = 0; i < sh.nqb; ++i) {
      const int64_t q0 = i * sh.bq, row0 = ((b * sh.Sq + q0) * sh.H + h) * D;
      float* dqrow = dq + row0;
      visible_blocks(rule, m, sh, b, i, w.blocks);
      if (w.blocks.empty()) {
        for (int64_t r = 0; r < sh.bq; ++r) std::memset(dqrow + r * HD, 0, D * sizeof(float));
        continue;
      }
      const int64_t L = (int64_t)w.blocks.size() * sh.bk;
      const float *qrow = q + row0, *dorow = dout + row0, *orow = out + row0;
      const float* lrow = lse + (b * sh.H + h) * sh.Sq + q0;
      const float* dlrow = dlse + (b * sh.H + h) * sh.Sq + q0;
      for (int64_t r = 0; r < sh.bq; ++r) {
        float acc = 0.0f;
        for (int64_t d = 0; d < D; ++d) {
          w.qs[r * D + d] = qrow[r * HD + d] * scale;
          acc += dorow[r * HD + d] * orow[r * HD + d];
        }
        w.delta[r] = acc - dlrow[r];
        w.lse[r] = lrow[r];
      }
      for (size_t c = 0; c < w.blocks.size(); ++c) {
        const int64_t j = w.blocks[c].first, col = j * sh.bk / pw * D * pw;
        float* sc = w.s.data() + c * sh.bk;
        gemm(sh.pk, sh.bq, sh.bk, D, w.qs.data(), D, 1, w.kt.data() + col, D * pw, sc, L, false);
        if (w.blocks[c].second) apply_mask(sc, L, sh.bq, sh.bk, rule, m, b, sh, q0, j * sh.bk);
        gemm(sh.pk, sh.bq, sh.bk, D, dorow, HD, 1, w.vt.data() + col, D * pw, w.dp.data() + c * sh.bk,
             L, false);
      }
      for (int64_t r = 0; r < sh.bq; ++r) {
        float* s = w.s.data() + r * L;
        float* dp = w.dp.data() + r * L;
        if (w.lse[r] == kNegInf) {  // the row saw no key: p = 0
          std::memset(s, 0, L * sizeof(float));
          std::memset(dp, 0, L * sizeof(float));
          continue;
        }
        const float l = w.lse[r], dl = w.delta[r];
        for (int64_t c = 0; c < L; c += W) {
          const vf p = vexp(load(s + c) - l);
          store(s + c, p);
          store(dp + c, p * (load(dp + c) - dl) * scale);
        }
      }
      for (size_t c = 0; c < w.blocks.size(); ++c) {
        const int64_t j = w.blocks[c].first, k0 = j * sh.bk;
        const float* ds = w.dp.data() + c * sh.bk;
        const float* p = w.s.data() + c * sh.bk;
        // dQ = dS K, dK += dSᵀ Q, dV += Pᵀ dO
        gemm(sh.pk, sh.bq, D, sh.bk, ds, L, 1, w.kp.data() + k0 * pw, sh.Sk * pw, dqrow, HD, c > 0);
        gemm(sh.pk, sh.bk, D, sh.bq, ds, 1, L, w.qp.data() + q0 * pw, sh.Sq * pw, w.dk.data() + k0 * D, D, true);
        gemm(sh.pk, sh.bk, D, sh.bq, p, 1, L, w.dop.data() + q0 * pw, sh.Sq * pw, w.dv.data() + k0 * D, D, true);
      }
    }
    float* dkb = dk + (b * sh.Sk * sh.H + h) * D;
    float* dvb = dv + (b * sh.Sk * sh.H + h) * D;
    for (int64_t s = 0; s < sh.Sk; ++s) {
      std::memcpy(dkb + s * HD, w.dk.data() + s * D, D * sizeof(float));
      std::memcpy(dvb + s * HD, w.dv.data() + s * D, D * sizeof(float));
    }
  }
};

ffi::Error check_shapes(const ffi::Buffer<ffi::F32>& q, const ffi::Buffer<ffi::F32>& k,
                        const ffi::Buffer<ffi::F32>& v, const ffi::Buffer<ffi::S8>& bmap,
                        int64_t bq, int64_t bk, Shape& sh) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), md = bmap.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || md.size() != 2)
    return ffi::Error::InvalidArgument("flash_cpu: q/k/v must be [B, S, H, D], the block map 2-D");
  sh = Shape{qd[0], qd[1], kd[1], qd[2], qd[3], bq, bk, 0, 0};
  if (kd[0] != sh.B || kd[2] != sh.H || kd[3] != sh.D || vd[0] != kd[0] || vd[1] != kd[1] ||
      vd[2] != kd[2] || vd[3] != kd[3])
    return ffi::Error::InvalidArgument("flash_cpu: q, k, v disagree on batch, heads or head dim");
  if (sh.D % 16 || bq <= 0 || bk % 16 || bk <= 0 || sh.Sq % bq || sh.Sk % bk)
    return ffi::Error::InvalidArgument("flash_cpu: head dim and key block must be multiples of 16 "
                                       "and the blocks must divide the lengths");
  sh.nqb = sh.Sq / bq;
  sh.nkb = sh.Sk / bk;
  sh.pk = Panels{1, W};
  for (int nv = NV_MAX; nv > 1; --nv)
    if (sh.D % (nv * W) == 0 && bk % (nv * W) == 0) {
      sh.pk = Panels{nv, nv * W};
      break;
    }
  if (md[0] != sh.nqb || md[1] != sh.nkb)
    return ffi::Error::InvalidArgument("flash_cpu: block map shape does not match the blocks");
  return ffi::Error::Success();
}

// The call's description from its arrays and attributes, or check_shapes' error.
ffi::Error describe(const ffi::Buffer<ffi::F32>& q, const ffi::Buffer<ffi::F32>& k,
                    const ffi::Buffer<ffi::F32>& v, const ffi::Buffer<ffi::S32>& q_meta,
                    const ffi::Buffer<ffi::S32>& k_meta, const ffi::Buffer<ffi::S32>& q_seg,
                    const ffi::Buffer<ffi::S32>& k_seg, const ffi::Buffer<ffi::S8>& bmap, const Rule& rule,
                    int64_t block_q, int64_t block_k, Call& c) {
  if (auto e = check_shapes(q, k, v, bmap, block_q, block_k, c.sh); e.failure()) return e;
  const int32_t* qm = q_meta.typed_data();  // [pos; tok] of the query slots
  const int32_t* km = k_meta.typed_data();  // [pos; tok; kind] of the key slots
  c.rule = rule;
  c.m = Meta{qm, qm + c.sh.Sq, km, km + c.sh.Sk, km + 2 * c.sh.Sk, q_seg.typed_data(), k_seg.typed_data(),
             bmap.typed_data()};
  c.scale = 1.0f / std::sqrt((float)c.sh.D);
  return ffi::Error::Success();
}

ffi::Error FwdImpl(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                   ffi::Buffer<ffi::S32> q_meta, ffi::Buffer<ffi::S32> k_meta,
                   ffi::Buffer<ffi::S32> q_seg, ffi::Buffer<ffi::S32> k_seg, ffi::Buffer<ffi::S8> bmap,
                   int64_t causal, int64_t same_segment, int64_t window, int64_t persistent_window,
                   int64_t block_q, int64_t block_k, ffi::ResultBuffer<ffi::F32> out,
                   ffi::ResultBuffer<ffi::F32> lse) {
  Call c;
  const Rule rule{causal != 0, same_segment != 0, window, persistent_window};
  if (auto e = describe(q, k, v, q_meta, k_meta, q_seg, k_seg, bmap, rule, block_q, block_k, c); e.failure())
    return e;
  parallel_tasks(c.sh.B * c.sh.H,
                 Fwd{c, q.typed_data(), k.typed_data(), v.typed_data(), out->typed_data(), lse->typed_data()});
  return ffi::Error::Success();
}

ffi::Error BwdImpl(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                   ffi::Buffer<ffi::F32> out, ffi::Buffer<ffi::F32> lse, ffi::Buffer<ffi::F32> dout,
                   ffi::Buffer<ffi::F32> dlse, ffi::Buffer<ffi::S32> q_meta,
                   ffi::Buffer<ffi::S32> k_meta, ffi::Buffer<ffi::S32> q_seg,
                   ffi::Buffer<ffi::S32> k_seg, ffi::Buffer<ffi::S8> bmap, int64_t causal,
                   int64_t same_segment, int64_t window, int64_t persistent_window, int64_t block_q,
                   int64_t block_k, ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                   ffi::ResultBuffer<ffi::F32> dv) {
  Call c;
  const Rule rule{causal != 0, same_segment != 0, window, persistent_window};
  if (auto e = describe(q, k, v, q_meta, k_meta, q_seg, k_seg, bmap, rule, block_q, block_k, c); e.failure())
    return e;
  parallel_tasks(c.sh.B * c.sh.H, Bwd{c, q.typed_data(), k.typed_data(), v.typed_data(), out.typed_data(),
                                      lse.typed_data(), dout.typed_data(), dlse.typed_data(), dq->typed_data(),
                                      dk->typed_data(), dv->typed_data()});
  return ffi::Error::Success();
}

}  // namespace

// The next N ≥ 1 arguments (Ret: results) of an FFI binding, all f32 arrays. Each builder method
// consumes the builder and returns one of a new type, and a builder can be neither copied nor
// moved from outside, so the recursion only ever returns what a method returned.
template <int N, bool Ret = false, typename Binding>
auto f32_buffers(Binding&& b) {
  static_assert(N >= 1);
  auto next = [&] {
    if constexpr (Ret)
      return std::move(b).template Ret<ffi::Buffer<ffi::F32>>();
    else
      return std::move(b).template Arg<ffi::Buffer<ffi::F32>>();
  };
  if constexpr (N == 1)
    return next();
  else
    return f32_buffers<N - 1, Ret>(next());
}

// FwdImpl's and BwdImpl's signature: `Args` f32 arrays (q, k, v; the backward adds out, lse,
// dout, dlse), the query and key layouts and segment ids and the block map, the rule's and the
// blocks' attributes, `Rets` f32 results. (`.template`: the builder's type depends on Args.)
template <int Args, int Rets>
auto flash_binding() {
  return f32_buffers<Rets, true>(f32_buffers<Args>(ffi::Ffi::Bind())
                                     .template Arg<ffi::Buffer<ffi::S32>>()  // q_meta
                                     .template Arg<ffi::Buffer<ffi::S32>>()  // k_meta
                                     .template Arg<ffi::Buffer<ffi::S32>>()  // q_seg
                                     .template Arg<ffi::Buffer<ffi::S32>>()  // k_seg
                                     .template Arg<ffi::Buffer<ffi::S8>>()   // bmap
                                     .template Attr<int64_t>("causal")
                                     .template Attr<int64_t>("same_segment")
                                     .template Attr<int64_t>("window")
                                     .template Attr<int64_t>("persistent_window")
                                     .template Attr<int64_t>("block_q")
                                     .template Attr<int64_t>("block_k"));
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(NslFlashCpuFwd, FwdImpl, (flash_binding<3, 2>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(NslFlashCpuBwd, BwdImpl, (flash_binding<7, 3>()));
