// Ragged paged attention on the CPU: an XLA FFI custom call.
//
// What it computes (rljax/rollout/paged_attention.py has the Python face,
// the shape checks and the XLA reference this is tested against): for row
// b, query t < T and query head h (kv head c = h / (Hq / Hkv)),
//
//   K_b = [prefix keys s in [start_e, end_e) of entry e = entry[b];
//          own keys u < len_bt],   len_bt = own_len[b] - (T - 1 - t)
//   out[b, t, h] = sum_j softmax_j(q[b, t, h] . K_b[j, c] * scale) V_b[j, c]
//
// The prefix keys sit in the pages ptable[e, s / P] at slot s % P, a row's
// own keys in the pages table[b, u / P] at slot u % P. Pages are laid out
// for the two products the kernel runs: k [N, Hkv, hd, P] (a page's keys
// as hd rows of P, so a query scores P keys with hd multiply-adds of
// P-wide vectors), v [N, Hkv, P, hd]. The pool may be f32 or bf16; bf16 is
// widened to f32 as it is read (exact), products and sums run in f32.
//
// Three properties XLA:CPU cannot give a paged cache:
//   - ragged: a row reads its own len_bt tokens, not the batch's longest;
//   - in place: pages are read where they lie, no gather copy into a
//     contiguous [B, S] layout (vLLM's PagedAttention, Kwon et al., 2023,
//     "Efficient Memory Management for Large Language Model Serving with
//     PagedAttention");
//   - shared prefix: the rows of one entry (the n samples of a prompt) are
//     scored together against each prompt page, which is read once for
//     all of them (cascade attention: Juravsky et al., 2024, "Hydragen";
//     Ye et al., 2024, FlashInfer), whatever their number.
// Prefix and own parts are merged by the online softmax (Milakov and
// Gimelshein, 2018, "Online normalizer calculation for softmax"; as in
// Dao et al., 2022, FlashAttention): per query a running max m, normaliser
// l and unnormalised output a; a page with scores x_p does
//   m' = max(m, max_p x_p), a' = a e^(m - m') + sum_p e^(x_p - m') v_p,
//   l' = l e^(m - m') + sum_p e^(x_p - m'),   and out = a / l at the end.
// A query that sees no key gets 0.
//
// Work items are (entry's rows, kv head) or (lone row, kv head), spread
// over XLA's intra-op thread pool. Vectors use GCC's vector extensions, so
// the same source compiles to AVX-512, AVX2 or NEON code (-march=native).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

template <int N>
struct Vec {
  typedef float f __attribute__((vector_size(N * 4)));
  typedef int32_t i __attribute__((vector_size(N * 4)));
  typedef uint32_t u __attribute__((vector_size(N * 4)));
  typedef uint16_t h __attribute__((vector_size(N * 2)));
};

template <int N>
inline typename Vec<N>::f Load(const float* p) {
  typename Vec<N>::f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <int N>
inline typename Vec<N>::f Load(const uint16_t* p) {
  typename Vec<N>::h raw;
  std::memcpy(&raw, p, sizeof(raw));
  typename Vec<N>::u wide = __builtin_convertvector(raw, typename Vec<N>::u) << 16;
  return (typename Vec<N>::f)wide;
}

template <int N>
inline void Store(float* p, typename Vec<N>::f v) { std::memcpy(p, &v, sizeof(v)); }

// e^x for x <= 0: 2^(x log2 e) = 2^k * 2^f, degree-6 polynomial for 2^f.
template <int N>
inline typename Vec<N>::f Exp(typename Vec<N>::f x) {
  using F = typename Vec<N>::f;
  using I = typename Vec<N>::i;
  x = x < -87.0f ? F{} - 87.0f : x;
  F t = x * 1.44269504088896341f;
  F k = __builtin_convertvector(__builtin_convertvector(t, I), F);
  k += __builtin_convertvector(t < k, F);  // trunc -> floor (masks are -1)
  F f = t - k;
  F p = F{} + 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  I e = (__builtin_convertvector(k, I) + 127) << 23;
  return p * (F)e;
}

constexpr int kBlock = 4;  // queries scored together against one page

template <typename KV, int D, int P>
struct Attention {
  using FP = typename Vec<P>::f;
  static constexpr int DV = D >= 16 ? 16 : D;  // vector width over hd
  using FD = typename Vec<DV>::f;
  static constexpr int ND = D / DV;

  int64_t B, T, Hq, Hkv, N, W, E, Wp;
  const float* q;
  const KV* pool_k;
  const KV* pool_v;
  const int32_t* table;
  const int32_t* own_len;
  const int32_t* ptable;
  const int32_t* pstart;
  const int32_t* pend;
  const int32_t* entry;
  float* out;
  float scale;

  // m queries (qs [m][D], pre-scaled) against tokens [lo, hi) of one page;
  // query j sees page token p iff base + p < limit[j]. Online softmax: max
  // mx, normaliser l, unnormalised output acc [m][D].
  static void Page(const KV* kt, const KV* vp, int lo, int hi, int base,
                   int m, const float* qs, const int* limit, float* mx,
                   float* l, float* acc) {
    FP iota;
    for (int p = 0; p < P; ++p) iota[p] = (float)p;
    for (int j0 = 0; j0 < m; j0 += kBlock) {
      const int nb = std::min(kBlock, m - j0);
      FP s[kBlock] = {}, s2[kBlock] = {};
      for (int i = 0; i + 1 < D; i += 2) {
        FP k0 = Load<P>(kt + i * P), k1 = Load<P>(kt + (i + 1) * P);
        for (int j = 0; j < nb; ++j) {
          const float* qj = qs + (j0 + j) * D;
          s[j] += qj[i] * k0;
          s2[j] += qj[i + 1] * k1;
        }
      }
      if (D % 2) {
        FP k0 = Load<P>(kt + (D - 1) * P);
        for (int j = 0; j < nb; ++j) s[j] += qs[(j0 + j) * D + D - 1] * k0;
      }
      alignas(64) float e[kBlock][P];
      int first = P, last = 0;
      for (int j = 0; j < nb; ++j) {
        const int jj = j0 + j;
        const int b = std::min(hi, limit[jj] - base);
        FP sc = s[j] + s2[j];
        if (b <= lo) {
          Store<P>(e[j], FP{});
          continue;
        }
        first = std::min(first, lo);
        last = std::max(last, b);
        auto live = (iota >= (float)lo) & (iota < (float)b);
        float peak = -INFINITY;
        for (int p = lo; p < b; ++p) peak = std::max(peak, sc[p]);
        const float top = std::max(mx[jj], peak);
        const float rescale = mx[jj] == -INFINITY ? 0.f : std::exp(mx[jj] - top);
        mx[jj] = top;
        FP ex = Exp<P>(sc - top);
        ex = live ? ex : FP{};
        Store<P>(e[j], ex);
        float sum = 0.f;
        for (int p = lo; p < b; ++p) sum += ex[p];
        l[jj] = l[jj] * rescale + sum;
        if (rescale != 1.f) {
          float* aj = acc + jj * D;
          for (int i = 0; i < D; ++i) aj[i] *= rescale;
        }
      }
      if (last <= first) continue;
      FD a[kBlock][ND];
      for (int j = 0; j < nb; ++j)
        for (int v = 0; v < ND; ++v) a[j][v] = Load<DV>(acc + (j0 + j) * D + v * DV);
      for (int p = first; p < last; ++p) {
        FD r[ND];
        for (int v = 0; v < ND; ++v) r[v] = Load<DV>(vp + p * D + v * DV);
        for (int j = 0; j < nb; ++j) {
          const float w = e[j][p];
          for (int v = 0; v < ND; ++v) a[j][v] += w * r[v];
        }
      }
      for (int j = 0; j < nb; ++j)
        for (int v = 0; v < ND; ++v) Store<DV>(acc + (j0 + j) * D + v * DV, a[j][v]);
    }
  }

  const KV* KPage(int64_t page, int64_t h) const { return pool_k + (page * Hkv + h) * D * P; }
  const KV* VPage(int64_t page, int64_t h) const { return pool_v + (page * Hkv + h) * P * D; }

  void Prefetch(int64_t page, int64_t h) const {
    const char* a = (const char*)KPage(page, h);
    const char* b = (const char*)VPage(page, h);
    for (int o = 0; o < (int)(D * P * sizeof(KV)); o += 64) {
      __builtin_prefetch(a + o);
      __builtin_prefetch(b + o);
    }
  }

  // Rows `rows` (those of prefix entry e, or one row when e < 0), head h.
  void Item(const int* rows, int nrows, int e, int64_t h) const {
    const int group = (int)(Hq / Hkv);
    const int per = (int)T * group;
    const int m = nrows * per;
    std::vector<float> buf((size_t)m * (2 + 2 * D));
    float* mx = buf.data();
    float* l = mx + m;
    float* acc = l + m;
    float* qs = acc + (size_t)m * D;
    std::vector<int> limit(m);
    int j = 0;
    for (int ri = 0; ri < nrows; ++ri) {
      const int r = rows[ri];
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < group; ++k, ++j) {
          const float* src = q + ((r * T + t) * Hq + h * group + k) * D;
          for (int i = 0; i < D; ++i) qs[j * D + i] = src[i] * scale;
          limit[j] = own_len[r] - (int)(T - 1 - t);
          mx[j] = -INFINITY;
          l[j] = 0.f;
        }
    }
    std::fill(acc, acc + (size_t)m * D, 0.f);
    if (e >= 0) {
      std::vector<int> all(m, pend[e]);
      const int a = pstart[e], b = pend[e];
      for (int pg = std::max(0, a) / P; pg * P < b && pg < Wp; ++pg) {
        const int64_t page = ptable[e * Wp + pg];
        if (page < 0 || page >= N) continue;
        const int lo = std::max(0, a - pg * P), hi = std::min(P, b - pg * P);
        Page(KPage(page, h), VPage(page, h), lo, hi, pg * P, m, qs, all.data(), mx, l, acc);
      }
    }
    for (int ri = 0; ri < nrows; ++ri) {
      const int r = rows[ri], o = ri * per, len = own_len[r];
      for (int pg = 0; pg * P < len && pg < W; ++pg) {
        const int64_t page = table[r * W + pg];
        if (page < 0 || page >= N) continue;
        if ((pg + 1) * P < len && pg + 1 < W) {
          const int64_t next = table[r * W + pg + 1];
          if (next >= 0 && next < N) Prefetch(next, h);
        }
        Page(KPage(page, h), VPage(page, h), 0, P, pg * P, per, qs + o * D,
             limit.data() + o, mx + o, l + o, acc + (size_t)o * D);
      }
    }
    j = 0;
    for (int ri = 0; ri < nrows; ++ri) {
      const int r = rows[ri];
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < group; ++k, ++j) {
          float* dst = out + ((r * T + t) * Hq + h * group + k) * D;
          const float inv = l[j] > 0.f ? 1.f / l[j] : 0.f;
          for (int i = 0; i < D; ++i) dst[i] = acc[(size_t)j * D + i] * inv;
        }
    }
  }
};

// Work items are claimed from `next`; `finished` counts those done. The
// calling thread works too and then waits only for items other threads
// claimed and have not finished: a helper that starts after every item was
// claimed returns at once, and nobody waits for it.
struct Progress {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> finished{0};
};

template <typename KV, int D, int P>
ffi::Error Run(ffi::ThreadPool pool, const int64_t* dims, const void* q,
               const void* pk, const void* pv, const int32_t* table,
               const int32_t* own_len, const int32_t* ptable,
               const int32_t* pstart, const int32_t* pend,
               const int32_t* entry, float* out, float scale) {
  auto a = std::make_shared<Attention<KV, D, P>>();
  a->B = dims[0]; a->T = dims[1]; a->Hq = dims[2]; a->Hkv = dims[3];
  a->N = dims[4]; a->W = dims[5]; a->E = dims[6]; a->Wp = dims[7];
  a->q = (const float*)q; a->pool_k = (const KV*)pk; a->pool_v = (const KV*)pv;
  a->table = table; a->own_len = own_len; a->ptable = ptable;
  a->pstart = pstart; a->pend = pend; a->entry = entry; a->out = out;
  a->scale = scale;
  // Work items: the rows of each prefix entry together, rows without one
  // alone; times each kv head.
  auto order = std::make_shared<std::vector<int>>();
  auto starts = std::make_shared<std::vector<int>>();
  auto ids = std::make_shared<std::vector<int>>();
  std::vector<std::vector<int>> by(a->E);
  for (int b = 0; b < a->B; ++b)
    if (entry[b] >= 0 && entry[b] < a->E) by[entry[b]].push_back(b);
  for (int e = 0; e < a->E; ++e) {
    if (by[e].empty()) continue;
    starts->push_back((int)order->size());
    ids->push_back(e);
    order->insert(order->end(), by[e].begin(), by[e].end());
  }
  for (int b = 0; b < a->B; ++b) {
    if (entry[b] >= 0 && entry[b] < a->E) continue;
    starts->push_back((int)order->size());
    ids->push_back(-1);
    order->push_back(b);
  }
  starts->push_back((int)order->size());
  const int64_t items = (int64_t)ids->size() * a->Hkv;
  auto progress = std::make_shared<Progress>();
  auto work = [a, order, starts, ids, progress, items]() {
    for (int64_t i; (i = progress->next.fetch_add(1)) < items;) {
      const int64_t g = i / a->Hkv;
      a->Item(order->data() + (*starts)[g], (*starts)[g + 1] - (*starts)[g],
              (*ids)[g], i % a->Hkv);
      progress->finished.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads() - 1, items - 1);
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work]() { work(); });
  work();
  // Spin (yielding) rather than sleep: on a loaded host a sleeping
  // thread's wake-up costs a scheduler slice, at every layer of every step.
  while (progress->finished.load(std::memory_order_acquire) < items)
    std::this_thread::yield();
  return ffi::Error::Success();
}

ffi::Error Dispatch(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                    ffi::AnyBuffer pk, ffi::AnyBuffer pv,
                    ffi::Buffer<ffi::S32> table, ffi::Buffer<ffi::S32> own_len,
                    ffi::Buffer<ffi::S32> ptable, ffi::Buffer<ffi::S32> pstart,
                    ffi::Buffer<ffi::S32> pend, ffi::Buffer<ffi::S32> entry,
                    ffi::ResultBuffer<ffi::F32> out, float scale) {
  const auto qd = q.dimensions();
  const auto kd = pk.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || table.dimensions().size() != 2 ||
      ptable.dimensions().size() != 2)
    return ffi::Error::InvalidArgument("paged_attention: bad ranks");
  const int64_t dims[8] = {qd[0], qd[1], qd[2], kd[1], kd[0],
                           table.dimensions()[1], ptable.dimensions()[0],
                           ptable.dimensions()[1]};
  const int64_t D = qd[3], P = kd[3];
  // A uint16 pool holds bf16 bit patterns (rljax/rollout/kv_pages.py).
  const bool bf16 = pk.element_type() == ffi::DataType::BF16 ||
                    pk.element_type() == ffi::DataType::U16;
  if (!bf16 && pk.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument(
        "paged_attention: pool is not f32, bf16 or uint16 (bf16 bits)");
#define RLJAX_CASE(d, p)                                                     \
  if (D == d && P == p)                                                      \
    return bf16 ? Run<uint16_t, d, p>(pool, dims, q.untyped_data(),          \
                                      pk.untyped_data(), pv.untyped_data(),  \
                                      table.typed_data(),                    \
                                      own_len.typed_data(),                  \
                                      ptable.typed_data(),                   \
                                      pstart.typed_data(), pend.typed_data(), \
                                      entry.typed_data(), out->typed_data(), \
                                      scale)                                 \
                : Run<float, d, p>(pool, dims, q.untyped_data(),             \
                                   pk.untyped_data(), pv.untyped_data(),     \
                                   table.typed_data(), own_len.typed_data(), \
                                   ptable.typed_data(), pstart.typed_data(), \
                                   pend.typed_data(), entry.typed_data(),    \
                                   out->typed_data(), scale);
  RLJAX_CASE(8, 8) RLJAX_CASE(8, 16) RLJAX_CASE(32, 16) RLJAX_CASE(64, 16)
  RLJAX_CASE(128, 16) RLJAX_CASE(64, 32) RLJAX_CASE(128, 32)
#undef RLJAX_CASE
  return ffi::Error::InvalidArgument("paged_attention: unsupported head dim or page size");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    RljaxPagedAttention, Dispatch,
    ffi::Ffi::Bind()
        .Ctx<ffi::ThreadPool>()
        .Arg<ffi::Buffer<ffi::F32>>()
        .Arg<ffi::AnyBuffer>()
        .Arg<ffi::AnyBuffer>()
        .Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::S32>>()
        .Arg<ffi::Buffer<ffi::S32>>()
        .Ret<ffi::Buffer<ffi::F32>>()
        .Attr<float>("scale"));
