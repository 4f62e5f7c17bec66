// --help for the project's binaries: the usage line and every flag its main file defines. Abseil
// lists by default only the flags of a source file named like the program ("modserve-client"
// would need modserve-client.cc, "modserve" modserve.cc), which ours are not, so --help printed
// "No flags matched". It only configures Abseil's usage output; parsing stays Abseil's.
#ifndef MODSERVE_TOOLS_CLI_USAGE_H_
#define MODSERVE_TOOLS_CLI_USAGE_H_

#include <string>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace modserve::cli {

// Call before absl::ParseCommandLine, with __FILE__ of the file that holds the ABSL_FLAGs:
//   modserve::cli::SetUsage("modserve-client [flags] generate|stream|...", __FILE__);
// --help and --helpshort then print `usage` and those flags (with their defaults);
// --helpfull adds Abseil's own.
inline void SetUsage(absl::string_view usage, absl::string_view main_file) {
  absl::SetProgramUsageMessage(usage);
  // Abseil hands the filter its normalized name of the file (leading '/' dropped), so the
  // test is a suffix test against the compiler's __FILE__.
  const std::string file(main_file);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [file](absl::string_view flag_file) {
    return !flag_file.empty() && absl::EndsWith(file, flag_file);
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace modserve::cli

#endif  // MODSERVE_TOOLS_CLI_USAGE_H_
