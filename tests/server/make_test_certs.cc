// modserve-test-certs DIR: writes the test PKI of test_certs.h into DIR (for the Python and
// process tests). Test-only; the keys are unprotected and the certificates last a day.
#include <iostream>

#include "tests/server/test_certs.h"

int main(int argc, char** argv) {
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
