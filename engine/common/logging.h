// Invariant checks and plain stderr logging. CHECK is for our own bugs only (a corrupt block table,
// a refcount underflow), never for client- or file-controlled data: those return absl::Status.
#ifndef MODSERVE_ENGINE_COMMON_LOGGING_H_
#define MODSERVE_ENGINE_COMMON_LOGGING_H_

#include <cstdlib>
#include <iostream>
#include <sstream>

namespace modserve::internal {

// Collects a message and aborts when destroyed: the tail of a failed CHECK.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond) {
    stream_ << file << ":" << line << ": CHECK failed: " << cond << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::cerr << stream_.str() << std::endl;
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// One log line, written to stderr in one piece when destroyed.
class LogLine {
 public:
  LogLine(const char* level, const char* file, int line) {
    stream_ << level << " " << file << ":" << line << "] ";
  }
  ~LogLine() {
    stream_ << "\n";
    std::cerr << stream_.str() << std::flush;
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace modserve::internal

#define MODSERVE_CHECK(cond) \
  if (__builtin_expect(!!(cond), 1)) {} else ::modserve::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()

#define MODSERVE_CHECK_EQ(a, b) MODSERVE_CHECK((a) == (b)) << "(" << (a) << " vs " << (b) << ") "
#define MODSERVE_CHECK_LT(a, b) MODSERVE_CHECK((a) < (b)) << "(" << (a) << " vs " << (b) << ") "
#define MODSERVE_CHECK_LE(a, b) MODSERVE_CHECK((a) <= (b)) << "(" << (a) << " vs " << (b) << ") "

#ifdef NDEBUG
#define MODSERVE_DCHECK(cond) \
  if (true) {} else ::modserve::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()
#else
#define MODSERVE_DCHECK(cond) MODSERVE_CHECK(cond)
#endif

#define MODSERVE_LOG(level) ::modserve::internal::LogLine(#level, __FILE__, __LINE__).stream()

#endif  // MODSERVE_ENGINE_COMMON_LOGGING_H_
