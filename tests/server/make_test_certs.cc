// modserve-test-certs DIR: writes the test PKI of test_certs.h into DIR (for the Python and
// process tests). Test-only; the keys are unprotected and the certificates last a day.
#include <iostream>
#include <string_view>

#include "tests/server/test_certs.h"

int main(int argc, char** argv) {
  const std::string_view arg = argc == 2 ? argv[1] : "";
  if (arg == "--help" || arg == "-h") {
    std::cout << "usage: modserve-test-certs DIR\nwrites a test CA, server and client "
                 "certificates and keys into DIR (no flags)" << std::endl;
    return 0;
  }
  if (argc != 2) {
    std::cerr << "usage: modserve-test-certs DIR" << std::endl;
    return 2;
  }
  absl::StatusOr<modserve::server::testing::TestCerts> certs =
      modserve::server::testing::MakeTestCerts(argv[1]);
  if (!certs.ok()) {
    std::cerr << "modserve-test-certs: " << certs.status() << std::endl;
    return 1;
  }
  return 0;
}
