// A compiled PCRE2 pattern (UTF + Unicode properties, JIT when the platform has it) for the
// pre-tokenizer splits. Match-all only; no captures, no replacement.
#ifndef MODSERVE_ENGINE_TOKENIZER_PCRE2_REGEX_H_
#define MODSERVE_ENGINE_TOKENIZER_PCRE2_REGEX_H_

#include <cstddef>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct pcre2_real_code_8;  // pcre2_code with PCRE2_CODE_UNIT_WIDTH 8; keeps pcre2.h out of here

namespace modserve::engine {

// Immutable after Compile(). Threads: FindAll() may run concurrently (each call allocates its own
// match data; the compiled code and JIT code are shared read-only).
class Pcre2Regex {
 public:
  // InvalidArgument: `pattern` does not compile (the message quotes PCRE2's error and offset).
  static absl::StatusOr<std::unique_ptr<Pcre2Regex>> Compile(std::string_view pattern);
  // Compiles `literal` so that it matches itself (metacharacters escaped).
  static absl::StatusOr<std::unique_ptr<Pcre2Regex>> CompileLiteral(std::string_view literal);
  ~Pcre2Regex();

  // Byte ranges [begin, end) of the successive leftmost non-overlapping matches in `text`, which
  // must be valid UTF-8 (not rechecked). Empty matches are skipped. Internal: PCRE2 failed to
  // match (e.g. its match limit was hit).
  absl::Status FindAll(std::string_view text,
                       std::vector<std::pair<size_t, size_t>>* matches) const;

  // Whether the whole of `text` (valid UTF-8) matches.
  bool FullMatch(std::string_view text) const;

 private:
  explicit Pcre2Regex(pcre2_real_code_8* code) : code_(code) {}
  pcre2_real_code_8* code_;  // owned
};

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_TOKENIZER_PCRE2_REGEX_H_
