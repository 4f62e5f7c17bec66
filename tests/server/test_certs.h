// Test-only PKI made at test time with OpenSSL: a CA, a server certificate for localhost and
// 127.0.0.1, a client certificate from the same CA and one from an unrelated CA. Keys are EC
// P-256, certificates last a day. Nothing here is fit for production use.
#ifndef MODSERVE_TESTS_SERVER_TEST_CERTS_H_
#define MODSERVE_TESTS_SERVER_TEST_CERTS_H_

#include <string>

#include "absl/status/statusor.h"

namespace modserve::server::testing {

struct PemFile {
  std::string path;  // under the directory given to MakeTestCerts
  std::string pem;
};

struct TestCerts {
  PemFile ca_cert;            // the CA that signed server_cert and client_cert
  PemFile server_cert;        // SAN DNS:localhost, IP:127.0.0.1
  PemFile server_key;
  PemFile client_cert;        // signed by ca_cert
  PemFile client_key;
  PemFile other_client_cert;  // signed by a CA the server does not trust
  PemFile other_client_key;
};

// Writes every file into `dir` (which must exist). Internal when OpenSSL fails.
absl::StatusOr<TestCerts> MakeTestCerts(const std::string& dir);

}  // namespace modserve::server::testing

#endif  // MODSERVE_TESTS_SERVER_TEST_CERTS_H_
