// TLS files are parsed with OpenSSL (the library gRPC itself links) so a bad file fails at
// start-up naming the flag, instead of as a bare "cannot listen" from gRPC. Tokens are kept and
// compared as SHA-256 digests: equal-length inputs make the comparison independent of the length
// and content of what a caller sends.
#include "server/security.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/common/status_macros.h"

namespace modserve::server {
namespace {

absl::Status BadFile(absl::string_view flag, const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": '", path, "' ", what));
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyDeleter>;

BioPtr MemBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Refuses encrypted keys instead of letting OpenSSL prompt for a passphrase on the terminal.
int NoPassphrase(char*, int, int, void*) { return 0; }

X509Ptr FirstCertificate(const std::string& pem) {
  BioPtr bio = MemBio(pem);
  return X509Ptr(PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr));
}

}  // namespace

absl::StatusOr<std::string> ReadCredentialFile(absl::string_view flag, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return BadFile(flag, path, absl::StrCat("cannot be opened: ", strerror(errno)));
  std::string data;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) data.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  const int read_errno = errno;
  std::fclose(f);
  if (failed) return BadFile(flag, path, absl::StrCat("cannot be read: ", strerror(read_errno)));
  if (data.empty()) return BadFile(flag, path, "is empty");
  return data;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& options) {
  if (options.cert_file.empty()) {
    if (!options.key_file.empty() || !options.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls_key_file and --tls_client_ca_file need --tls_cert_file");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert_file needs --tls_key_file");
  }
  MODSERVE_ASSIGN_OR_RETURN(std::string cert_pem,
                            ReadCredentialFile("--tls_cert_file", options.cert_file));
  MODSERVE_ASSIGN_OR_RETURN(std::string key_pem,
                            ReadCredentialFile("--tls_key_file", options.key_file));
  X509Ptr cert = FirstCertificate(cert_pem);
  PkeyPtr key;
  {
    BioPtr bio = MemBio(key_pem);
    key.reset(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  }
  const bool matches = cert != nullptr && key != nullptr && X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();  // leave OpenSSL's thread-local error queue clean for gRPC's own use
  if (cert == nullptr) return BadFile("--tls_cert_file", options.cert_file, "holds no PEM certificate");
  if (key == nullptr) {
    return BadFile("--tls_key_file", options.key_file, "holds no unencrypted PEM private key");
  }
  if (!matches) {
    return BadFile("--tls_key_file", options.key_file,
                   absl::StrCat("is not the key of the certificate in --tls_cert_file '",
                                options.cert_file, "'"));
  }

  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({std::move(key_pem), std::move(cert_pem)});
  if (!options.client_ca_file.empty()) {
    MODSERVE_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                              ReadCredentialFile("--tls_client_ca_file", options.client_ca_file));
    const bool has_ca = FirstCertificate(ssl.pem_root_certs) != nullptr;
    ERR_clear_error();
    if (!has_ca) {
      return BadFile("--tls_client_ca_file", options.client_ca_file, "holds no PEM certificate");
    }
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

bool ConstantTimeEquals(absl::Span<const uint8_t> a, absl::Span<const uint8_t> b) {
  if (a.size() != b.size()) return false;
  // volatile keeps the compiler from turning the loop into an early-exit memcmp.
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = diff | (a[i] ^ b[i]);
  return diff == 0;
}

absl::StatusOr<std::unique_ptr<TokenAuthenticator>> TokenAuthenticator::FromFile(
    const std::string& path) {
  MODSERVE_ASSIGN_OR_RETURN(std::string data, ReadCredentialFile("--auth_token_file", path));
  std::vector<std::string> tokens;
  for (absl::string_view line : absl::StrSplit(data, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty()) tokens.emplace_back(line);
  }
  absl::StatusOr<std::unique_ptr<TokenAuthenticator>> auth = FromTokens(tokens);
  if (!auth.ok()) return BadFile("--auth_token_file", path, auth.status().message());
  return auth;
}

absl::StatusOr<std::unique_ptr<TokenAuthenticator>> TokenAuthenticator::FromTokens(
    const std::vector<std::string>& tokens) {
  if (tokens.empty()) return absl::InvalidArgumentError("holds no token");
  std::vector<Digest> digests;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    if (t.empty()) return absl::InvalidArgumentError(absl::StrCat("token ", i + 1, " is empty"));
    for (char c : t) {
      // Printable ASCII without spaces: what "Bearer <token>" can carry. The message names the
      // token's position, never its bytes.
      if (c <= 0x20 || c >= 0x7f) {
        return absl::InvalidArgumentError(
            absl::StrCat("token ", i + 1, " has a byte outside printable ASCII or a space"));
      }
    }
    Digest d;
    unsigned int size = 0;
    if (EVP_Digest(t.data(), t.size(), d.data(), &size, EVP_sha256(), nullptr) != 1 ||
        size != d.size()) {
      ERR_clear_error();
      return absl::InternalError("SHA-256 of a token failed");
    }
    digests.push_back(d);
  }
  return std::unique_ptr<TokenAuthenticator>(new TokenAuthenticator(std::move(digests)));
}

absl::Status TokenAuthenticator::CheckAuthorization(
    absl::Span<const absl::string_view> values) const {
  constexpr absl::string_view kScheme = "bearer ";
  bool any_bearer = false;
  bool matched = false;
  for (absl::string_view value : values) {
    // RFC 6750: the scheme is case-insensitive; one or more spaces precede the token.
    if (value.size() <= kScheme.size() ||
        !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
      continue;
    }
    any_bearer = true;
    const absl::string_view token = absl::StripLeadingAsciiWhitespace(value.substr(kScheme.size()));
    Digest d;
    unsigned int size = 0;
    if (EVP_Digest(token.data(), token.size(), d.data(), &size, EVP_sha256(), nullptr) != 1) {
      ERR_clear_error();
      continue;
    }
    // Every accepted token is compared, whether or not an earlier one matched.
    for (const Digest& want : digests_) matched |= ConstantTimeEquals(d, want);
  }
  if (matched) return absl::OkStatus();
  return absl::UnauthenticatedError(any_bearer ? "the bearer token is not valid"
                                               : "missing 'authorization: Bearer <token>'");
}

grpc::Status TokenAuthenticator::Check(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  std::vector<absl::string_view> values;
  const auto [begin, end] = metadata.equal_range("authorization");
  for (auto it = begin; it != end; ++it) values.emplace_back(it->second.data(), it->second.size());
  const absl::Status s = CheckAuthorization(values);
  if (s.ok()) return grpc::Status::OK;
  // gRPC carries the header as metadata; say so.
  std::string message(s.message());
  if (absl::StartsWith(message, "missing")) message += " metadata";
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, message);
}

}  // namespace modserve::server
