// The name -> target table shared by the libFuzzer mains and the corpus replay test. The names
// are the corpus folder names under tests/fuzz/corpus/ and the fuzzer binaries' suffixes.
#include "tests/fuzz/fuzz_targets.h"

namespace modserve::fuzz {

FuzzFn FindTarget(std::string_view name) {
  struct Entry {
    std::string_view name;
    FuzzFn fn;
  };
  static constexpr Entry kTargets[] = {
      {"checkpoint", FuzzCheckpoint},
      {"gguf", FuzzGguf},
      {"config", FuzzConfig},
      {"bpe_json", FuzzBpeJson},
      {"tokenizer_encode", FuzzTokenizerEncode},
      {"tokenizer_decode", FuzzTokenizerDecode},
      {"detokenizer", FuzzDetokenizer},
      {"request", FuzzRequest},
      {"openai_request", FuzzOpenAiRequest},
      {"jinja", FuzzJinja},
      {"http_request", FuzzHttpRequest},
  };
  for (const Entry& e : kTargets) {
    if (e.name == name) return e.fn;
  }
  return nullptr;
}

}  // namespace modserve::fuzz
