// The bounded FIFO of sequences waiting for admission. Preempted sequences go back to the front
// (they were admitted before anything still waiting). No threads, no admission policy here.
#ifndef MODSERVE_ENGINE_SCHEDULER_REQUEST_QUEUE_H_
#define MODSERVE_ENGINE_SCHEDULER_REQUEST_QUEUE_H_

#include <cstdint>
#include <deque>
#include <optional>

#include "absl/status/status.h"
#include "engine/kv_cache/kv_cache_manager.h"

namespace modserve::engine {

// What admission needs to know about a sequence.
struct WaitingSequence {
  SequenceId seq_id = 0;
  int32_t num_tokens = 0;      // tokens to feed on admission (prompt, plus output if preempted)
  int32_t max_new_tokens = 0;  // as requested; bounds the final length
  int32_t num_generated = 0;   // output tokens already sampled (non-zero after preemption)
  // Routing tau the sequence runs with; unset = the checkpoint's default (or a dense model).
  std::optional<double> threshold;
  // Tokens drafted per decode step (speculative decoding; Engine::SpeculativeTokens); 0 = none.
  int32_t speculative_tokens = 0;
};

// Thread contract: engine thread only.
class RequestQueue {
 public:
  // max_size bounds PushBack (new requests); PushFront (preempted ones) is always accepted,
  // since those were admitted once and are owed a place.
  explicit RequestQueue(int32_t max_size) : max_size_(max_size) {}

  // ResourceExhausted naming the limit when max_size sequences already wait.
  absl::Status PushBack(const WaitingSequence& seq);
  void PushFront(const WaitingSequence& seq);
  // Precondition: !empty().
  const WaitingSequence& front() const { return queue_.front(); }
  void PopFront() { queue_.pop_front(); }
  // Removes `seq_id` if it waits; returns whether it did.
  bool Remove(SequenceId seq_id);

  bool empty() const { return queue_.empty(); }
  int32_t size() const { return static_cast<int32_t>(queue_.size()); }
  int32_t max_size() const { return max_size_; }

 private:
  int32_t max_size_;
  std::deque<WaitingSequence> queue_;
};

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_SCHEDULER_REQUEST_QUEUE_H_
