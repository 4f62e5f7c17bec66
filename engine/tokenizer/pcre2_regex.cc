// PCRE2 adapter. UCP makes \s, \w and \d Unicode-aware, as Oniguruma (which Hugging Face
// tokenizers uses) treats them; JIT is an optimisation only, so a failure to JIT is not an error.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/tokenizer/pcre2_regex.h"

#include <pcre2.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace modserve::engine {
namespace {

std::string Pcre2ErrorMessage(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return std::string(reinterpret_cast<const char*>(buffer));
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Pcre2Regex>> Pcre2Regex::Compile(std::string_view pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("regex '", std::string(pattern),
                                                   "' does not compile at offset ", error_offset,
                                                   ": ", Pcre2ErrorMessage(error_code)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Pcre2Regex>(new Pcre2Regex(code));
}

absl::StatusOr<std::unique_ptr<Pcre2Regex>> Pcre2Regex::CompileLiteral(std::string_view literal) {
  // \Q...\E quotes everything except a literal "\E", which is split out and escaped on its own.
  std::string pattern = "\\Q";
  for (size_t i = 0; i < literal.size(); ++i) {
    if (literal[i] == '\\' && i + 1 < literal.size() && literal[i + 1] == 'E') {
      pattern += "\\E\\\\E\\Q";
      ++i;
    } else {
      pattern += literal[i];
    }
  }
  pattern += "\\E";
  return Compile(pattern);
}

Pcre2Regex::~Pcre2Regex() { pcre2_code_free(code_); }

absl::Status Pcre2Regex::FindAll(std::string_view text,
                                 std::vector<std::pair<size_t, size_t>>* matches) const {
  matches->clear();
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
      pcre2_match_data_create_from_pattern(code_, nullptr));
  if (md == nullptr) return absl::ResourceExhaustedError("pcre2_match_data_create failed");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    // The input was validated once by the caller; rechecking UTF-8 per call would be quadratic.
    const int rc =
        pcre2_match(code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::InternalError(
          absl::StrCat("pcre2_match failed at byte ", pos, ": ", Pcre2ErrorMessage(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(md.get());
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (end > begin) {
      matches->emplace_back(begin, end);
      pos = end;
    } else {
      // Empty match: step over one whole character so the next search starts on a boundary.
      pos = begin + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  return absl::OkStatus();
}

bool Pcre2Regex::FullMatch(std::string_view text) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
      pcre2_match_data_create_from_pattern(code_, nullptr));
  if (md == nullptr) return false;
  const int rc =
      pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                  PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED | PCRE2_ENDANCHORED, md.get(), nullptr);
  return rc >= 0;
}

}  // namespace modserve::engine
