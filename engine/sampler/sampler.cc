// Sampler: one pass of penalties over the few penalised ids, one pass of temperature over the
// vocabulary, then truncation on a candidate list so that sorting is avoided unless top-k or
// top-p needs it.
#include "engine/sampler/sampler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"
#include "engine/sampler/sum_exp.h"

namespace modserve::engine {
namespace {

// Logits that overflowed while being processed (a tiny repetition penalty or temperature) stay
// the largest finite float, so softmax still has a finite maximum; -inf stays masked.
void ClampPositiveInfinity(std::vector<float>& logits) {
  for (float& logit : logits) {
    if (logit == INFINITY) logit = FLT_MAX;
  }
}

// The entries of the row at or above `threshold` (finite: never -inf), in id order.
void CandidatesAtLeast(absl::Span<const float> row, float threshold, std::vector<Candidate>& out) {
  out.clear();
  for (TokenId id = 0; id < static_cast<TokenId>(row.size()); ++id) {
    if (row[id] >= threshold) out.push_back({id, row[id]});
  }
}

// The row's entries other than -inf (it holds no NaN or +inf), in id order.
void FiniteCandidates(absl::Span<const float> row, std::vector<Candidate>& out) {
  CandidatesAtLeast(row, -FLT_MAX, out);
}

// A threshold stepped down from `max` by gaps first_gap, first_gap * growth, ... until
// reaches(threshold) (or it is -FLT_MAX, below every finite entry), then bisected between it and
// the last one that fell short while too_loose(threshold, that one), so that a selection or a
// sort runs over the entries at or above it rather than over the whole row. `reaches` must be
// monotone (true at a threshold, true at every lower one).
template <typename Reaches, typename TooLoose>
float SearchThreshold(float max, float first_gap, float growth, Reaches&& reaches,
                      TooLoose&& too_loose) {
  float threshold = max, above = max;
  for (float below = first_gap; threshold > -FLT_MAX && !reaches(threshold); below *= growth) {
    above = threshold;
    threshold = max - below >= -FLT_MAX ? max - below : -FLT_MAX;
  }
  for (int step = 0; step < 24 && too_loose(threshold, above); ++step) {
    const float mid = threshold + (above - threshold) * 0.5f;
    if (mid <= threshold || mid >= above) break;
    (reaches(mid) ? threshold : above) = mid;
  }
  return threshold;
}

// CountAtLeast of the row, remembering the last two thresholds asked about: the searches below
// ask again about the threshold they just moved to.
class RowCounts {
 public:
  explicit RowCounts(absl::Span<const float> row) : row_(row) {}
  int64_t AtLeast(float t) {
    for (const Entry& e : memo_) {
      if (e.count >= 0 && e.t == t) return e.count;
    }
    memo_[next_] = {t, CountAtLeast(row_, t)};
    const int64_t count = memo_[next_].count;
    next_ ^= 1;
    return count;
  }

 private:
  struct Entry {
    float t = 0.0f;
    int64_t count = -1;
  };
  absl::Span<const float> row_;
  Entry memo_[2];
  int next_ = 0;
};

// The k best entries of the row (-inf never; k > 0), sorted in canonical order: KeepTopK over
// the entries at or above a threshold that at least k of them reach, which keeps the k a
// selection over the whole row keeps. Counting passes are cheap; a selection over a whole
// vocabulary is not, so the threshold is bisected until at most max(4k, 256) entries pass.
void TopKOfRow(absl::Span<const float> row, float max, int64_t k, std::vector<Candidate>& out) {
  float threshold = -FLT_MAX;  // every finite entry
  RowCounts counts(row);
  if (k < counts.AtLeast(-FLT_MAX)) {
    const int64_t enough = std::max<int64_t>(4 * k, 256);
    threshold = SearchThreshold(
        max, 1.0f, 4.0f, [&](float t) { return counts.AtLeast(t) >= k; },
        [&](float t, float) { return counts.AtLeast(t) > enough; });
  }
  CandidatesAtLeast(row, threshold, out);
  KeepTopK(out, static_cast<int32_t>(std::min<int64_t>(k, INT32_MAX)));
}

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The entries of the row at or above a threshold whose mass reaches top_p of the row's, sorted
// in canonical order, into `out` (so the top-p cut lies inside them); returns the mass of the
// rest, sum(exp(logit - max)). The masses are f32 exps summed in f64 (SumExpShiftedAtLeast, one
// vector pass each), with a margin of 1e-6 over their relative error so that TopPCount's f64
// sums over the prefix find the cut inside it too; the threshold steps down from the maximum by
// gaps of 1/4, 1/2, 1, 2, ...: a peaked distribution keeps a handful of entries, a flat one
// thousands (a selection over the whole vocabulary cost more than either).
double NucleusPrefixOfRow(absl::Span<const float> row, float max, float top_p,
                          std::vector<Candidate>& out) {
  const double total = SumExpShifted(row, max);
  const double want = static_cast<double>(top_p) * (1.0 + 1e-6) * total;
  // A gap can take in far more entries than the cut needs (a maximum far above the rest, or a
  // dense band of logits below it): bisected while the prefix would hold over twice the entries
  // above the last threshold that fell short, plus 1024.
  RowCounts counts(row);
  const float threshold = SearchThreshold(
      max, 0.25f, 2.0f, [&](float t) { return SumExpShiftedAtLeast(row, max, t) >= want; },
      [&](float t, float above) { return counts.AtLeast(t) > 2 * counts.AtLeast(above) + 1024; });
  CandidatesAtLeast(row, threshold, out);
  std::sort(out.begin(), out.end(), kCandidateOrder);
  return std::max(total - SumExpShiftedAtLeast(row, max, threshold), 0.0);
}

absl::Status FieldError(const std::string& field, auto value, const std::string& range) {
  return absl::InvalidArgumentError(
      absl::StrCat("sampling: ", field, "=", value, " outside allowed range ", range));
}

}  // namespace

absl::Status Validate(const SamplingParams& params) {
  if (!std::isfinite(params.temperature) || params.temperature < 0.0f) {
    return FieldError("temperature", params.temperature, "[0, inf) finite");
  }
  if (params.top_k < 0) return FieldError("top_k", params.top_k, "[0, inf), 0 = off");
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    return FieldError("top_p", params.top_p, "(0, 1]");
  }
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f)) {
    return FieldError("min_p", params.min_p, "[0, 1]");
  }
  if (!std::isfinite(params.repetition_penalty) || params.repetition_penalty <= 0.0f) {
    return FieldError("repetition_penalty", params.repetition_penalty, "(0, inf) finite");
  }
  if (!std::isfinite(params.presence_penalty)) {
    return FieldError("presence_penalty", params.presence_penalty, "finite");
  }
  if (!std::isfinite(params.frequency_penalty)) {
    return FieldError("frequency_penalty", params.frequency_penalty, "finite");
  }
  if (params.top_logprobs < 0 || params.top_logprobs > kMaxTopLogprobs) {
    return FieldError("top_logprobs", params.top_logprobs,
                      absl::StrCat("[0, ", kMaxTopLogprobs, "]"));
  }
  if (params.max_new_tokens < 1) {
    return FieldError("max_new_tokens", params.max_new_tokens, "[1, inf)");
  }
  if (params.stop_token_ids.size() > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: stop_token_ids has ",
                                                   params.stop_token_ids.size(),
                                                   " ids; at most ", kMaxStopTokenIds));
  }
  for (size_t i = 0; i < params.stop_token_ids.size(); ++i) {
    if (params.stop_token_ids[i] < 0) {
      return FieldError(absl::StrCat("stop_token_ids[", i, "]"), params.stop_token_ids[i],
                        "[0, vocab_size)");
    }
  }
  for (size_t i = 0; i < params.stop_strings.size(); ++i) {
    if (params.stop_strings[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling: stop_strings[", i, "] is empty; stop strings need >= 1 byte"));
    }
  }
  return absl::OkStatus();
}

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
  constexpr uint64_t kM0 = 0xD2511F53u;
  constexpr uint64_t kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u;
  constexpr uint32_t kW1 = 0xBB67AE85u;
  std::array<uint32_t, 4> c = counter;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kW0;
      key[1] += kW1;
    }
    const uint64_t p0 = kM0 * c[0];
    const uint64_t p1 = kM1 * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ key[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ key[1], static_cast<uint32_t>(p0)};
  }
  return c;
}

double UniformDraw(uint64_t seed, uint64_t step) { return UniformDraw(seed, step, 0); }

double UniformDraw(uint64_t seed, uint64_t step, uint32_t stream) {
  const std::array<uint32_t, 4> out =
      Philox4x32({static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32), stream, 0},
                 {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const uint64_t bits = (uint64_t{out[0]} << 32 | out[1]) >> 11;
  return static_cast<double>(bits) * 0x1.0p-53;
}

SamplingState::SamplingState(uint64_t seed, absl::Span<const TokenId> prompt) : seed_(seed) {
  for (TokenId token : prompt) See(token);
}

void SamplingState::Accept(TokenId token) {
  See(token);
  auto [it, inserted] = output_index_.try_emplace(token, output_counts_.size());
  if (inserted) {
    output_counts_.emplace_back(token, 1);
  } else {
    ++output_counts_[it->second].second;
  }
  ++num_generated_;
}

void SamplingState::See(TokenId token) {
  if (seen_set_.insert(token).second) seen_list_.push_back(token);
}

Sampler::Sampler(uint64_t engine_seed) : seed_generator_(engine_seed) {}

class Sampler::ScratchLease {
 public:
  explicit ScratchLease(Sampler* sampler) : sampler_(sampler) {
    absl::MutexLock lock(&sampler_->mu_);
    if (!sampler_->spare_.empty()) {
      scratch_ = std::move(sampler_->spare_.back());
      sampler_->spare_.pop_back();
    }
    if (scratch_ == nullptr) scratch_ = std::make_unique<Scratch>();
  }
  ~ScratchLease() {
    absl::MutexLock lock(&sampler_->mu_);
    sampler_->spare_.push_back(std::move(scratch_));
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  Scratch& operator*() { return *scratch_; }
  Scratch* operator->() { return scratch_.get(); }

 private:
  Sampler* sampler_;
  std::unique_ptr<Scratch> scratch_;
};

uint64_t Sampler::RequestSeed(const SamplingParams& params) {
  return params.seed.has_value() ? *params.seed : SplitMix64(seed_generator_);
}

SamplingState Sampler::NewState(const SamplingParams& params, absl::Span<const TokenId> prompt) {
  return SamplingState(RequestSeed(params), prompt);
}

absl::StatusOr<SampleResult> Sampler::Sample(absl::Span<const float> logits,
                                             const SamplingParams& params, SamplingState* state) {
  ScratchLease scratch(this);
  bool sorted = false;
  if (absl::Status st = Process(logits, params, *state, &sorted, *scratch); !st.ok()) return st;
  absl::StatusOr<SampleResult> result = SampleImpl(params, *state, sorted, *scratch);
  if (result.ok()) state->Accept(result->token);
  return result;
}

absl::StatusOr<std::vector<TokenLogprob>> Sampler::Distribution(absl::Span<const float> logits,
                                                                const SamplingParams& params,
                                                                const SamplingState& state) {
  ScratchLease scratch(this);
  std::vector<TokenLogprob> dist;
  bool sorted = false;
  if (absl::Status st = Process(logits, params, state, &sorted, *scratch); !st.ok()) return st;
  if (params.temperature < kGreedyTemperature) {
    MODSERVE_ASSIGN_OR_RETURN(SampleResult r, SampleImpl(params, state, sorted, *scratch));
    dist.push_back({r.token, 0.0f});
    return dist;
  }
  std::vector<Candidate>& candidates = scratch->candidates;
  double lse = 0.0;
  if (scratch->whole_row) {
    const float max = scratch->processed[scratch->best];
    lse = max + std::log(SumExpShifted(scratch->processed, max));
    FiniteCandidates(scratch->processed, candidates);
  } else {
    lse = LogSumExp(candidates);
  }
  dist.reserve(candidates.size());
  for (const Candidate& c : candidates) {
    dist.push_back({c.id, static_cast<float>(c.logit - lse)});
  }
  return dist;
}

absl::Status Sampler::Process(absl::Span<const float> logits, const SamplingParams& params,
                              const SamplingState& state, bool* sorted, Scratch& scratch) {
  std::vector<float>& work = scratch.work;
  std::vector<Candidate>& candidates = scratch.candidates;
  const auto vocab = static_cast<TokenId>(logits.size());
  if (vocab == 0) return absl::InternalError("sampler: empty logits row");
  scratch.whole_row = false;
  // One vector pass finds the argmax and whether any logit is NaN or +inf; the scalar walk that
  // names the first such token runs only then.
  size_t best = 0;
  if (!ArgMaxBelowInfinity(logits, &best)) {
    for (TokenId id = 0; id < vocab; ++id) {
      if (std::isnan(logits[id]) || logits[id] == INFINITY) {
        return absl::InternalError(
            absl::StrCat("sampler: logit of token ", id, " is ", logits[id]));
      }
    }
  }
  for (TokenId id : state.seen_tokens()) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampler: token id ", id, " outside vocabulary of ", vocab));
    }
  }
  *sorted = false;
  const bool greedy = params.temperature < kGreedyTemperature;
  const bool penalised = params.repetition_penalty != 1.0f || params.presence_penalty != 0.0f ||
                         params.frequency_penalty != 0.0f;
  if (greedy && !penalised) {  // the row as it is: no copy
    scratch.processed = logits;
    scratch.best = best;
    return absl::OkStatus();
  }
  work.assign(logits.begin(), logits.end());
  if (params.repetition_penalty != 1.0f) {
    ApplyRepetitionPenalty(absl::MakeSpan(work), state.seen_tokens(), params.repetition_penalty);
  }
  if (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) {
    ApplyPresenceFrequencyPenalties(absl::MakeSpan(work), state.output_counts(),
                                    params.presence_penalty, params.frequency_penalty);
  }
  if (!greedy) ApplyTemperature(absl::MakeSpan(work), params.temperature);
  ClampPositiveInfinity(work);
  // Dividing by a positive temperature and the clamp both round monotonically, so they keep the
  // entries' order: the position the check found still holds the maximum, unless a penalty
  // moved it (greedy with a penalty lands here too, and needs the first maximum anyway).
  if (penalised) ArgMaxBelowInfinity(work, &best);  // no NaN or +inf left: always true
  scratch.processed = work;
  scratch.best = best;
  if (greedy) return absl::OkStatus();  // the argmax needs no temperature and no candidates
  const float max = work[best];
  if (max == -INFINITY) {
    return absl::InternalError(absl::StrCat("sampler: all ", vocab, " logits are -inf"));
  }
  // Nothing truncates (the OpenAI API's default): the draw walks the row itself.
  if ((params.top_k <= 0 || params.top_k >= vocab) && params.top_p >= 1.0f &&
      params.min_p <= 0.0f) {
    scratch.whole_row = true;
    return absl::OkStatus();
  }
  double tail_weight = 0.0;  // of the entries top-p's prefix leaves out
  if (params.top_k > 0 && params.top_k < CountAtLeast(work, -FLT_MAX)) {  // finite entries
    TopKOfRow(work, max, params.top_k, candidates);
    *sorted = true;
  } else if (params.top_p < 1.0f) {
    tail_weight = NucleusPrefixOfRow(work, max, params.top_p, candidates);
    *sorted = true;
  } else {
    FiniteCandidates(work, candidates);
  }
  if (params.top_p < 1.0f) {
    candidates.resize(TopPCount(candidates, params.top_p, tail_weight));
  }
  KeepMinP(candidates, params.min_p);
  return absl::OkStatus();
}

absl::StatusOr<SampleResult> Sampler::SampleImpl(const SamplingParams& params,
                                                 const SamplingState& state, bool sorted,
                                                 Scratch& scratch) {
  std::vector<Candidate>& candidates = scratch.candidates;
  const bool greedy = params.temperature < kGreedyTemperature;
  const size_t num_alternatives = static_cast<size_t>(params.top_logprobs);
  SampleResult result;
  if (greedy) {
    // Ties resolve to the lowest id (ArgMaxBelowInfinity).
    const absl::Span<const float> work = scratch.processed;
    const auto vocab = static_cast<TokenId>(work.size());
    const auto best = static_cast<TokenId>(scratch.best);
    if (work[best] == -INFINITY) {
      return absl::InternalError(absl::StrCat("sampler: all ", vocab, " logits are -inf"));
    }
    const double lse = work[best] + std::log(SumExpShifted(work, work[best]));
    result.token = best;
    result.logprob = static_cast<float>(work[best] - lse);
    if (num_alternatives > 0) {
      TopKOfRow(work, work[best], static_cast<int64_t>(num_alternatives), candidates);
      for (const Candidate& c : candidates) {
        result.top_logprobs.push_back({c.id, static_cast<float>(c.logit - lse)});
      }
    }
    return result;
  }

  if (scratch.whole_row) {
    // Inverse CDF of the row's softmax at the request's own counter: the first id whose running
    // sum of exps (f64, ascending ids) passes target times their total.
    const absl::Span<const float> work = scratch.processed;
    const float max = work[scratch.best];
    const double total = SumExpShifted(work, max);
    const double lse = max + std::log(total);
    const double target = UniformDraw(state.seed(), static_cast<uint64_t>(state.num_generated()));
    size_t chosen = FirstIndexPastMass(work, max, target * total);
    if (chosen == work.size()) {  // rounding can leave the mass just above the walk's sum
      chosen = work.size() - 1;
      while (work[chosen] == -INFINITY) --chosen;  // stops at the maximum at the latest
    }
    result.token = static_cast<TokenId>(chosen);
    result.logprob = static_cast<float>(work[chosen] - lse);
    if (num_alternatives > 0) {
      TopKOfRow(work, max, static_cast<int64_t>(num_alternatives), candidates);
      for (const Candidate& c : candidates) {
        result.top_logprobs.push_back({c.id, static_cast<float>(c.logit - lse)});
      }
    }
    return result;
  }

  // Inverse CDF of the survivors' softmax, in double, at the request's own counter.
  const double lse = LogSumExp(candidates);
  const double target = UniformDraw(state.seed(), static_cast<uint64_t>(state.num_generated()));
  double cumulative = 0.0;
  size_t chosen = candidates.size() - 1;  // rounding can leave target just above the total
  for (size_t i = 0; i < candidates.size(); ++i) {
    cumulative += std::exp(candidates[i].logit - lse);
    if (target < cumulative) {
      chosen = i;
      break;
    }
  }
  result.token = candidates[chosen].id;
  result.logprob = static_cast<float>(candidates[chosen].logit - lse);
  if (num_alternatives > 0) {
    if (!sorted) {
      const size_t n = std::min(num_alternatives, candidates.size());
      std::partial_sort(candidates.begin(), candidates.begin() + static_cast<ptrdiff_t>(n),
                        candidates.end(), kCandidateOrder);
    }
    const size_t n = std::min(num_alternatives, candidates.size());
    for (size_t i = 0; i < n; ++i) {
      result.top_logprobs.push_back(
          {candidates[i].id, static_cast<float>(candidates[i].logit - lse)});
    }
  }
  return result;
}

}  // namespace modserve::engine
