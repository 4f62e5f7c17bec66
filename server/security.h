// Transport and caller security of the gRPC edge: server TLS credentials (optionally requiring
// client certificates) and bearer tokens read from a file. It reads and checks files at start-up
// only; which methods need a token is call_gate.h's business, not this file's.
#ifndef MODSERVE_SERVER_SECURITY_H_
#define MODSERVE_SERVER_SECURITY_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/status.h"
#include "grpcpp/support/string_ref.h"

namespace modserve::server {

// The whole of a credential file named by `flag` (for the message). InvalidArgument naming the
// flag and the path when it cannot be opened or read, or is empty.
absl::StatusOr<std::string> ReadCredentialFile(absl::string_view flag, const std::string& path);

struct TlsOptions {
  std::string cert_file;       // PEM certificate chain of the server; empty = plaintext
  std::string key_file;        // PEM private key (unencrypted) of cert_file's first certificate
  std::string client_ca_file;  // PEM CA certificates; non-empty = require and verify client certs
};

// Plaintext credentials when cert_file is empty; else TLS credentials after checking that the
// files are readable, hold PEM of the right kind, and that the key belongs to the certificate.
// InvalidArgument naming the flag and the file otherwise (a key or CA without a certificate too).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& options);

// True iff a == b, in time that depends only on the lengths (no early exit at the first
// difference). Lengths that differ return false at once; callers compare fixed-size digests.
bool ConstantTimeEquals(absl::Span<const uint8_t> a, absl::Span<const uint8_t> b);

// Checks `authorization: Bearer <token>` metadata against a fixed set of tokens. Immutable after
// creation, so Check is safe from any thread.
class TokenAuthenticator {
 public:
  // One token per non-empty line, surrounding whitespace dropped (several lines let a token be
  // rotated without a gap). InvalidArgument naming the file when it is missing, unreadable, holds
  // no token, or a token has a byte outside printable ASCII (a header could not carry it).
  static absl::StatusOr<std::unique_ptr<TokenAuthenticator>> FromFile(const std::string& path);
  // The same rules for tokens given directly (tests).
  static absl::StatusOr<std::unique_ptr<TokenAuthenticator>> FromTokens(
      const std::vector<std::string>& tokens);

  // OK, or UNAUTHENTICATED when the metadata has no bearer token or none that matches. The message
  // says which, and never contains a presented or an accepted token.
  grpc::Status Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;
  // The same for the values of the HTTP Authorization header(s): OK or Unauthenticated.
  absl::Status CheckAuthorization(absl::Span<const absl::string_view> values) const;

 private:
  using Digest = std::array<uint8_t, 32>;  // SHA-256
  explicit TokenAuthenticator(std::vector<Digest> digests) : digests_(std::move(digests)) {}

  std::vector<Digest> digests_;  // of each accepted token
};

}  // namespace modserve::server

#endif  // MODSERVE_SERVER_SECURITY_H_
