// modserve-cuda-bench: decode tokens/s and time to first token of a Llama-shaped model driven
// op by op through a backend (the cuda one by default), with random BF16 weights and a BF16 KV
// pool, dense and MoD. It measures the backend, not the engine: no scheduler, no sampling, and
// MoD routing decisions are drawn on the host up front (the no-host-sync decode the engine is
// meant to reach), with one logits copy per step. Prints one markdown table.
//
//   modserve-cuda-bench --shapes tinyllama,llama3-8b --batches 1,8,64 --context 512
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/backend/backend.h"
#include "engine/backend/registry.h"
#include "engine/common/dtype.h"
#include "engine/common/logging.h"
#include "engine/common/tensor_view.h"
#include "tools/cli_usage.h"

ABSL_FLAG(std::string, backend, "cuda", "backend to drive (cuda or cpu)");
ABSL_FLAG(std::string, shapes, "tinyllama,llama3-8b", "model shapes: tinyllama, llama3-8b");
ABSL_FLAG(std::string, batches, "1,8,64", "decode batch sizes");
ABSL_FLAG(int32_t, context, 512, "KV entries each decoding sequence attends over");
ABSL_FLAG(int32_t, steps, 20, "timed decode steps per configuration (after 3 warm-up steps)");
ABSL_FLAG(std::string, prompts, "128,2048", "prompt lengths for time to first token");
ABSL_FLAG(double, capacity, 0.125, "MoD: fraction of tokens entering a routed layer");

namespace modserve::backend {
namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  std::string name;
  int64_t d, n_heads, n_kv_heads, head_dim, d_ff, n_layers, vocab;
};

Shape ShapeByName(const std::string& name) {
  if (name == "tinyllama") return {name, 2048, 32, 4, 64, 5632, 22, 32000};
  if (name == "llama3-8b") return {name, 4096, 32, 8, 128, 14336, 32, 128256};
  MODSERVE_CHECK(false) << "unknown shape '" << name << "' (known: tinyllama, llama3-8b)";
  return {};
}

std::vector<int> ParseInts(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int v = 0;
    MODSERVE_CHECK(absl::SimpleAtoi(part, &v) && v > 0) << "not a positive integer: " << part;
    out.push_back(v);
  }
  return out;
}

void Ok(const absl::Status& st) { MODSERVE_CHECK(st.ok()) << st; }

// Owns the device buffers of one model shape and runs its forward pass op by op.
class Model {
 public:
  static constexpr int kBlockSize = 16;

  Model(Backend* be, const Shape& s, int max_rows, int max_seqs, int max_ctx)
      : be_(be), s_(s), max_rows_(max_rows), max_seqs_(max_seqs) {
    std::mt19937 rng(1234);
    std::normal_distribution<float> dist(0.0f, 0.02f);
    tile_.resize(size_t{16} << 20);  // 32 MiB of random bf16, tiled over every weight
    for (auto& v : tile_) v = F32ToBf16(dist(rng));
    embed_ = Weight({s.vocab, s.d});
    lm_head_ = Weight({s.vocab, s.d});
    norm_ = Ones(s.d);
    const int64_t q_dim = s.n_heads * s.head_dim, kv_dim = s.n_kv_heads * s.head_dim;
    pages_per_seq_ = (max_ctx + kBlockSize - 1) / kBlockSize + 1;
    const int64_t num_pages = pages_per_seq_ * max_seqs;
    for (int64_t l = 0; l < s.n_layers; ++l) {
      Layer L;
      L.ln1 = Ones(s.d);
      L.ln2 = Ones(s.d);
      L.wq = Weight({q_dim, s.d});
      L.wk = Weight({kv_dim, s.d});
      L.wv = Weight({kv_dim, s.d});
      L.wo = Weight({s.d, q_dim});
      L.gate = Weight({s.d_ff, s.d});
      L.up = Weight({s.d_ff, s.d});
      L.down = Weight({s.d, s.d_ff});
      L.router = Weight({1, s.d});
      L.pool = Weight({num_pages, 2 * s.n_kv_heads, kBlockSize, s.head_dim});
      layers_.push_back(std::move(L));
    }
    const int64_t R = max_rows;
    x_ = F32({R, s.d});
    xs_ = F32({R, s.d});
    a_ = F32({R, s.d});
    q_ = F32({R, q_dim});
    k_ = F32({R, kv_dim});
    v_ = F32({R, kv_dim});
    att_ = F32({R, q_dim});
    o_ = F32({R, s.d});
    g_ = F32({R, s.d_ff});
    u_ = F32({R, s.d_ff});
    score_ = F32({R, 1});
    logits_ = F32({max_seqs, s.vocab});
    ids_ = I32(R);
    pos_ = I32(R);
    slots_ = I32(R);
    row_seq_ = I32(R);
    row_kv_len_ = I32(R);
    idx_ = I32(R);
    s_sel_ = F32({R});
    page_table_ = I32(int64_t{max_seqs} * pages_per_seq_);
    std::vector<int32_t> pt(static_cast<size_t>(max_seqs) * pages_per_seq_);
    for (size_t i = 0; i < pt.size(); ++i) pt[i] = static_cast<int32_t>(i);  // seq s: its own run
    Upload(pt, page_table_);
    Ok(be_->Synchronize());
  }

  // Bytes of weights one layer's block reads (the router is counted separately).
  int64_t BlockBytes() const {
    const int64_t q_dim = s_.n_heads * s_.head_dim, kv_dim = s_.n_kv_heads * s_.head_dim;
    return 2 * (s_.d * (2 * q_dim + 2 * kv_dim) + 3 * s_.d * s_.d_ff + 2 * s_.d);
  }
  int64_t HeadBytes() const { return 2 * (s_.vocab * s_.d + s_.d); }
  int64_t KvBytesPerEntry() const { return 2 * 2 * s_.n_kv_heads * s_.head_dim; }

  // One decode step for `batch` sequences at context `ctx`; routed[l] lists, per routed layer,
  // which rows enter (empty vector for dense layers = all rows). Returns weight + KV bytes read.
  int64_t DecodeStep(int batch, int ctx, const std::vector<std::vector<int32_t>>* routed) {
    std::vector<int32_t> ids(batch), pos(batch), slots(batch), seq(batch), len(batch);
    for (int b = 0; b < batch; ++b) {
      ids[b] = (b * 7919) % static_cast<int32_t>(s_.vocab);
      pos[b] = ctx - 1;
      slots[b] = static_cast<int32_t>(b * pages_per_seq_ * kBlockSize + ctx - 1);
      seq[b] = b;
      len[b] = ctx;
    }
    Upload(ids, ids_);
    Upload(pos, pos_);
    Upload(slots, slots_);
    Upload(seq, row_seq_);
    Upload(len, row_kv_len_);
    const TensorView x = View(x_, {batch, s_.d});
    be_->Embed(View(ids_, {batch}), embed_.view, x);
    int64_t bytes = 2 * batch * s_.d;
    for (int64_t l = 0; l < s_.n_layers; ++l) {
      if (routed == nullptr || (*routed)[l].empty()) {
        Block(l, x, batch, /*num_seqs=*/batch, pos_, slots_, row_seq_, row_kv_len_);
        bytes += BlockBytes() + int64_t{batch} * ctx * KvBytesPerEntry();
        continue;
      }
      // s = router(x) for every row; the selected rows (decided up front) run the block.
      be_->Gemm(x, layers_[l].router.view, {}, View(score_, {batch, 1}));
      bytes += 2 * s_.d;
      const std::vector<int32_t>& sel = (*routed)[l];
      if (sel.size() == 1 && sel[0] < 0) continue;  // nobody entered
      const int m = static_cast<int>(sel.size());
      std::vector<int32_t> spos(m), sslots(m), sseq(m), slen(m);
      for (int j = 0; j < m; ++j) {
        spos[j] = pos[sel[j]];
        sslots[j] = slots[sel[j]];
        sseq[j] = seq[sel[j]];
        slen[j] = len[sel[j]];
      }
      Upload(sel, idx_);
      Upload(std::vector<float>(m, 0.5f), s_sel_);
      Upload(spos, pos_);
      Upload(sslots, slots_);
      Upload(sseq, row_seq_);
      Upload(slen, row_kv_len_);
      const TensorView xs = View(xs_, {m, s_.d});
      be_->GatherRows(x, View(idx_, {m}), xs);
      Block(l, xs, m, batch, pos_, slots_, row_seq_, row_kv_len_);
      be_->ScatterCombine({}, x, xs, View(idx_, {m}), View(s_sel_, {m}));
      bytes += BlockBytes() + int64_t{m} * ctx * KvBytesPerEntry();
      Upload(pos, pos_);
      Upload(slots, slots_);
      Upload(seq, row_seq_);
      Upload(len, row_kv_len_);
    }
    be_->RmsNorm({1e-5f}, x, norm_.view, x);
    const TensorView logits = View(logits_, {batch, s_.vocab});
    be_->Gemm(x, lm_head_.view, {}, logits);
    host_logits_.resize(static_cast<size_t>(batch * s_.vocab));
    Ok(be_->CopyToHost(logits, TensorView(host_logits_.data(), DType::kF32, {batch, s_.vocab})));
    return bytes + HeadBytes();
  }

  // A prompt of n tokens in one step (sequence 0), logits of the last row only. With mod, routed
  // layers run the block on every 1/capacity-th row.
  void Prefill(int n, bool mod, double capacity) {
    std::vector<int32_t> ids(n), pos(n), seq(n, 0), len(n);
    for (int i = 0; i < n; ++i) {
      ids[i] = (i * 31) % static_cast<int32_t>(s_.vocab);
      pos[i] = i;
      len[i] = i + 1;
    }
    Upload(ids, ids_);
    Upload(pos, pos_);
    Upload(pos, slots_);  // sequence 0 owns pages 0.. in order: slot = position
    Upload(seq, row_seq_);
    Upload(len, row_kv_len_);
    const TensorView x = View(x_, {n, s_.d});
    be_->Embed(View(ids_, {n}), embed_.view, x);
    const int stride = std::max(1, static_cast<int>(1.0 / capacity + 0.5));
    for (int64_t l = 0; l < s_.n_layers; ++l) {
      if (!mod || l % 2 == 0) {
        Upload(pos, pos_);
        Upload(pos, slots_);
        Upload(len, row_kv_len_);
        Block(l, x, n, 1, pos_, slots_, row_seq_, row_kv_len_);
        continue;
      }
      be_->Gemm(x, layers_[l].router.view, {}, View(score_, {n, 1}));
      std::vector<int32_t> sel, spos, slen;
      for (int i = 0; i < n; i += stride) {
        sel.push_back(i);
        spos.push_back(i);
        slen.push_back(static_cast<int32_t>(sel.size()));
      }
      const int m = static_cast<int>(sel.size());
      std::vector<int32_t> sslots(m);
      for (int j = 0; j < m; ++j) sslots[j] = j;
      Upload(sel, idx_);
      Upload(std::vector<float>(m, 0.5f), s_sel_);
      Upload(spos, pos_);
      Upload(sslots, slots_);
      Upload(slen, row_kv_len_);
      const TensorView xs = View(xs_, {m, s_.d});
      be_->GatherRows(x, View(idx_, {m}), xs);
      Block(l, xs, m, 1, pos_, slots_, row_seq_, row_kv_len_);
      be_->ScatterCombine({}, x, xs, View(idx_, {m}), View(s_sel_, {m}));
    }
    Upload(std::vector<int32_t>{n - 1}, idx_);
    const TensorView last = View(xs_, {1, s_.d});
    be_->GatherRows(x, View(idx_, {1}), last);
    be_->RmsNorm({1e-5f}, last, norm_.view, last);
    const TensorView logits = View(logits_, {1, s_.vocab});
    be_->Gemm(last, lm_head_.view, {}, logits);
    host_logits_.resize(static_cast<size_t>(s_.vocab));
    Ok(be_->CopyToHost(logits, TensorView(host_logits_.data(), DType::kF32, {1, s_.vocab})));
  }

  int64_t WeightBytes() const { return s_.n_layers * BlockBytes() + HeadBytes() + 2 * s_.vocab * s_.d; }

 private:
  struct Buf {
    DeviceBuffer mem;
    TensorView view;
  };
  struct Layer {
    Buf ln1, ln2, wq, wk, wv, wo, gate, up, down, router, pool;
  };

  Buf Alloc(DType dt, std::initializer_list<int64_t> dims) {
    Buf b;
    int64_t n = 1;
    for (int64_t v : dims) n *= v;
    auto mem = be_->Allocate(static_cast<size_t>(n) * DTypeBytes(dt));
    Ok(mem.status());
    b.mem = std::move(mem).value();
    b.view = TensorView(b.mem.data(), dt, dims, be_->device());
    return b;
  }
  Buf Weight(std::initializer_list<int64_t> dims) {
    Buf b = Alloc(DType::kBF16, dims);
    const int64_t n = b.view.numel();
    for (int64_t off = 0; off < n; off += static_cast<int64_t>(tile_.size())) {
      const int64_t len = std::min<int64_t>(static_cast<int64_t>(tile_.size()), n - off);
      TensorView src(tile_.data(), DType::kBF16, {len});
      TensorView dst(static_cast<bf16_t*>(b.view.data) + off, DType::kBF16, {len}, be_->device());
      Ok(be_->CopyToDevice(src, dst));
    }
    Ok(be_->Synchronize());  // tile_ is reused by the next weight's large (unstaged) copies
    return b;
  }
  Buf Ones(int64_t d) {
    Buf b = Alloc(DType::kBF16, {d});
    std::vector<bf16_t> one(d, F32ToBf16(1.0f));
    Ok(be_->CopyToDevice(TensorView(one.data(), DType::kBF16, {d}), b.view));
    Ok(be_->Synchronize());
    return b;
  }
  Buf F32(std::initializer_list<int64_t> dims) { return Alloc(DType::kF32, dims); }
  Buf I32(int64_t n) { return Alloc(DType::kI32, {n}); }
  TensorView View(const Buf& b, std::initializer_list<int64_t> dims) const {
    return b.mem.View(b.view.dtype, dims);
  }
  template <typename T>
  void Upload(const std::vector<T>& host, const Buf& dst) {
    const DType dt = std::is_same_v<T, float> ? DType::kF32 : DType::kI32;
    const int64_t n = static_cast<int64_t>(host.size());
    Ok(be_->CopyToDevice(TensorView(const_cast<T*>(host.data()), dt, {n}),
                         dst.mem.View(dt, {n})));
  }

  void Block(int64_t l, const TensorView& rows, int64_t m, int64_t /*num_seqs*/, const Buf& pos,
             const Buf& slots, const Buf& row_seq, const Buf& row_kv_len) {
    const Layer& L = layers_[l];
    const int64_t hd = s_.head_dim, H = s_.n_heads, KV = s_.n_kv_heads;
    const TensorView a = View(a_, {m, s_.d});
    be_->RmsNorm({1e-5f}, rows, L.ln1.view, a);
    be_->Gemm(a, L.wq.view, {}, View(q_, {m, H * hd}));
    be_->Gemm(a, L.wk.view, {}, View(k_, {m, KV * hd}));
    be_->Gemm(a, L.wv.view, {}, View(v_, {m, KV * hd}));
    be_->RopeAndAppendKv({static_cast<int>(H), static_cast<int>(KV), static_cast<int>(hd), 500000.0,
                          kBlockSize},
                         View(q_, {m, H, hd}), View(k_, {m, KV, hd}), View(v_, {m, KV, hd}),
                         View(pos, {m}), View(slots, {m}), L.pool.view);
    be_->Attention({static_cast<int>(H), static_cast<int>(KV), static_cast<int>(hd), kBlockSize,
                    1.0f / std::sqrt(static_cast<float>(hd))},
                   View(q_, {m, H, hd}), L.pool.view,
                   View(page_table_, {max_seqs_, pages_per_seq_}), View(row_seq, {m}),
                   View(row_kv_len, {m}), View(att_, {m, H * hd}));
    be_->Gemm(View(att_, {m, H * hd}), L.wo.view, {}, View(o_, {m, s_.d}));
    be_->Add(rows, View(o_, {m, s_.d}), rows);
    be_->RmsNorm({1e-5f}, rows, L.ln2.view, a);
    be_->Gemm(a, L.gate.view, {}, View(g_, {m, s_.d_ff}));
    be_->Gemm(a, L.up.view, {}, View(u_, {m, s_.d_ff}));
    be_->SwiGlu(View(g_, {m, s_.d_ff}), View(u_, {m, s_.d_ff}), View(g_, {m, s_.d_ff}));
    be_->Gemm(View(g_, {m, s_.d_ff}), L.down.view, {}, View(o_, {m, s_.d}));
    be_->Add(rows, View(o_, {m, s_.d}), rows);
  }

  Backend* be_;
  Shape s_;
  int max_rows_, max_seqs_;
  int64_t pages_per_seq_ = 0;
  std::vector<bf16_t> tile_;
  std::vector<float> host_logits_;
  Buf embed_, lm_head_, norm_;
  std::vector<Layer> layers_;
  Buf x_, xs_, a_, q_, k_, v_, att_, o_, g_, u_, score_, logits_, s_sel_;
  Buf ids_, pos_, slots_, row_seq_, row_kv_len_, idx_, page_table_;
};

// Device-to-device copy bandwidth (read + write bytes per second) of a 1 GiB buffer.
double CopyBandwidthGBs() {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0.0;
  cudaMemset(a, 1, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  float best_ms = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    cudaEventRecord(start);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    best_ms = std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (best_ms * 1e-3) / 1e9;
}

int Main() {
  auto created = CreateBackend(absl::GetFlag(FLAGS_backend));
  if (!created.ok()) {
    std::fprintf(stderr, "modserve-cuda-bench: %s\n", created.status().ToString().c_str());
    return 1;
  }
  Backend* be = created->get();
  const bool on_cuda = be->device() == Device::kCuda;
  const double copy_gbs = on_cuda ? CopyBandwidthGBs() : 0.0;
  const std::vector<int> batches = ParseInts(absl::GetFlag(FLAGS_batches));
  const std::vector<int> prompts = ParseInts(absl::GetFlag(FLAGS_prompts));
  const int ctx = absl::GetFlag(FLAGS_context), steps = absl::GetFlag(FLAGS_steps);
  const double capacity = absl::GetFlag(FLAGS_capacity);
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int max_prompt = *std::max_element(prompts.begin(), prompts.end());

  std::vector<std::string> rows;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',', absl::SkipEmpty())) {
    const Shape s = ShapeByName(std::string(name));
    Model model(be, s, std::max(max_batch, max_prompt), max_batch,
                std::max(ctx + 1, max_prompt));
    std::mt19937 rng(99);
    std::map<int, double> dense_tps, dense_ttft;  // by batch / prompt length
    for (const bool mod : {false, true}) {
      for (int batch : batches) {
        // Routing for each step: routed layers are the odd ones; each row enters with p=capacity.
        auto draw = [&]() {
          std::vector<std::vector<int32_t>> routed(s.n_layers);
          std::bernoulli_distribution enter(capacity);
          for (int64_t l = 1; l < s.n_layers; l += 2) {
            for (int b = 0; b < batch; ++b) {
              if (enter(rng)) routed[l].push_back(b);
            }
            if (routed[l].empty()) routed[l].push_back(-1);  // marker: nobody entered
          }
          return routed;
        };
        for (int w = 0; w < 3; ++w) {
          auto r = draw();
          model.DecodeStep(batch, ctx, mod ? &r : nullptr);
        }
        int64_t bytes = 0;
        double secs = 0.0;
        for (int i = 0; i < steps; ++i) {
          auto r = draw();  // drawn outside the timed region
          const auto t0 = Clock::now();
          bytes += model.DecodeStep(batch, ctx, mod ? &r : nullptr);
          secs += std::chrono::duration<double>(Clock::now() - t0).count();
        }
        const double tps = batch * steps / secs;
        const double gbs = bytes / secs / 1e9;
        if (!mod) dense_tps[batch] = tps;
        char line[512];
        std::snprintf(line, sizeof(line),
                      "| %s | %s | decode b=%d ctx=%d | %.1f tok/s | %.2f ms/step | %.0f GB/s | "
                      "%.0f%% | %s |",
                      s.name.c_str(), mod ? "mod" : "dense", batch, ctx, tps, 1e3 * secs / steps,
                      gbs, copy_gbs > 0 ? 100 * gbs / copy_gbs : 0.0,
                      mod ? std::to_string(tps / dense_tps[batch]).substr(0, 4).c_str() : "-");
        rows.push_back(line);
      }
      for (int p : prompts) {
        model.Prefill(p, mod, capacity);  // warm-up (cuBLAS heuristics, caches)
        double best = 1e30;
        for (int rep = 0; rep < 3; ++rep) {
          const auto t0 = Clock::now();
          model.Prefill(p, mod, capacity);
          best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
        }
        if (!mod) dense_ttft[p] = best;
        char line[512];
        std::snprintf(line, sizeof(line), "| %s | %s | prefill %d tokens | %.0f tok/s | TTFT %.1f ms "
                      "| - | - | %s |",
                      s.name.c_str(), mod ? "mod" : "dense", p, p / best, 1e3 * best,
                      mod ? std::to_string(dense_ttft[p] / best).substr(0, 4).c_str() : "-");
        rows.push_back(line);
      }
    }
    std::fprintf(stderr, "done: %s (%.2f GB of weights)\n", s.name.c_str(),
                 model.WeightBytes() / 1e9);
  }
  std::printf("\nmodserve-cuda-bench: backend %s, BF16 weights and KV, device-to-device copy "
              "%.0f GB/s (read+write)\n\n",
              std::string(be->name()).c_str(), copy_gbs);
  std::printf("| shape | variant | measurement | rate | time | weights+KV read | of copy BW | "
              "MoD speed-up |\n|---|---|---|---:|---:|---:|---:|---:|\n");
  for (const auto& r : rows) std::printf("%s\n", r.c_str());
  return 0;
}

}  // namespace
}  // namespace modserve::backend

int main(int argc, char** argv) {
  modserve::cli::SetUsage("modserve-cuda-bench: op-level decode/prefill of Llama shapes on the CUDA "
                          "backend", __FILE__);
  absl::ParseCommandLine(argc, argv);
  return modserve::backend::Main();
}
