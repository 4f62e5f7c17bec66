// RequestQueue: a deque with a bound on new arrivals.
#include "engine/scheduler/request_queue.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace modserve::engine {

absl::Status RequestQueue::PushBack(const WaitingSequence& seq) {
  if (size() >= max_size_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the waiting queue is full (max_queue ", max_size_, "); retry later"));
  }
  queue_.push_back(seq);
  return absl::OkStatus();
}

void RequestQueue::PushFront(const WaitingSequence& seq) { queue_.push_front(seq); }

bool RequestQueue::Remove(SequenceId seq_id) {
  auto it = std::find_if(queue_.begin(), queue_.end(),
                         [seq_id](const WaitingSequence& s) { return s.seq_id == seq_id; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

}  // namespace modserve::engine
