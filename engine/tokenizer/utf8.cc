// UTF-8 helpers. The ranges follow the Unicode Standard's Table 3-7 (well-formed byte sequences),
// which is also what defines the "maximal subpart" each U+FFFD replaces.
#include "engine/tokenizer/utf8.h"

#include <cstdint>

namespace modserve::engine {
namespace {

// Result of looking at the sequence that starts at one offset.
struct SequenceScan {
  size_t length;   // bytes consumed: the whole character, or the maximal ill-formed subpart
  bool valid;      // a complete well-formed character
  bool truncated;  // ill-formed only because the input ended inside it
};

// Expected number of bytes for lead byte `b` (0 if it can never start a character) and the
// allowed range of the second byte, which carries the overlong/surrogate/range restrictions.
int SequenceLength(uint8_t b, uint8_t* lo, uint8_t* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (b < 0x80) return 1;
  if (b < 0xC2) return 0;
  if (b < 0xE0) return 2;
  if (b == 0xE0) *lo = 0xA0;
  if (b == 0xED) *hi = 0x9F;
  if (b < 0xF0) return 3;
  if (b == 0xF0) *lo = 0x90;
  if (b == 0xF4) *hi = 0x8F;
  if (b < 0xF5) return 4;
  return 0;
}

SequenceScan Scan(std::string_view s, size_t pos) {
  const auto b = static_cast<uint8_t>(s[pos]);
  uint8_t lo, hi;
  const int need = SequenceLength(b, &lo, &hi);
  if (need == 0) return {1, false, false};
  if (need == 1) return {1, true, false};
  for (int k = 1; k < need; ++k) {
    if (pos + k >= s.size()) return {static_cast<size_t>(k), false, true};
    const auto c = static_cast<uint8_t>(s[pos + k]);
    const uint8_t klo = k == 1 ? lo : 0x80;
    const uint8_t khi = k == 1 ? hi : 0xBF;
    if (c < klo || c > khi) return {static_cast<size_t>(k), false, false};
  }
  return {static_cast<size_t>(need), true, false};
}

}  // namespace

size_t FirstInvalidUtf8Offset(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    // ASCII fast path: most tokenizer input is ASCII.
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const SequenceScan scan = Scan(text, pos);
    if (!scan.valid) return pos;
    pos += scan.length;
  }
  return text.size();
}

bool IsValidUtf8(std::string_view text) { return FirstInvalidUtf8Offset(text) == text.size(); }

std::string ReplaceInvalidUtf8(std::string_view bytes) {
  size_t bad = FirstInvalidUtf8Offset(bytes);
  if (bad == bytes.size()) return std::string(bytes);
  std::string out(bytes.substr(0, bad));
  size_t pos = bad;
  while (pos < bytes.size()) {
    const SequenceScan scan = Scan(bytes, pos);
    if (scan.valid) {
      out.append(bytes.substr(pos, scan.length));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    pos += scan.length;
  }
  return out;
}

size_t IncompleteUtf8SuffixLength(std::string_view bytes) {
  // A truncated character is at most 3 bytes long, so its start is among the last 3 bytes.
  const size_t first = bytes.size() > 3 ? bytes.size() - 3 : 0;
  for (size_t start = first; start < bytes.size(); ++start) {
    const SequenceScan scan = Scan(bytes, start);
    if (scan.truncated && start + scan.length == bytes.size()) return bytes.size() - start;
  }
  return 0;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace modserve::engine
