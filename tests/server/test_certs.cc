// MakeTestCerts with OpenSSL 3's C API, so the tests need no `openssl` executable.
#include "tests/server/test_certs.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <fstream>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace modserve::server::testing {
namespace {

struct Deleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
  void operator()(X509* x) const { X509_free(x); }
  void operator()(BIO* b) const { BIO_free(b); }
};
using Key = std::unique_ptr<EVP_PKEY, Deleter>;
using Cert = std::unique_ptr<X509, Deleter>;

absl::Status OpenSslError(absl::string_view what) {
  const unsigned long e = ERR_get_error();
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return absl::InternalError(absl::StrCat(what, ": ", buf));
}

Key NewKey() { return Key(EVP_EC_gen("P-256")); }

bool AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return false;
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// A certificate for `key` named `cn`, signed by issuer_key (self-signed when issuer is null).
absl::StatusOr<Cert> NewCert(EVP_PKEY* key, const std::string& cn, X509* issuer,
                             EVP_PKEY* issuer_key, long serial,
                             const std::vector<std::pair<int, const char*>>& extensions) {
  Cert cert(X509_new());
  if (cert == nullptr) return OpenSslError("X509_new");
  X509_set_version(cert.get(), 2);  // v3
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 24 * 3600);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert.get(), issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509* effective_issuer = issuer != nullptr ? issuer : cert.get();
  for (const auto& [nid, value] : extensions) {
    if (!AddExtension(cert.get(), effective_issuer, nid, value)) {
      return OpenSslError(absl::StrCat("extension ", value));
    }
  }
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0) return OpenSslError("X509_sign");
  return cert;
}

template <typename WriteFn>
absl::StatusOr<std::string> ToPem(WriteFn write) {
  std::unique_ptr<BIO, Deleter> bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || write(bio.get()) != 1) return OpenSslError("PEM write");
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<PemFile> WriteCert(const std::string& dir, const char* name, X509* cert) {
  absl::StatusOr<std::string> pem = ToPem([&](BIO* b) { return PEM_write_bio_X509(b, cert); });
  if (!pem.ok()) return pem.status();
  PemFile f{absl::StrCat(dir, "/", name), *std::move(pem)};
  std::ofstream(f.path, std::ios::binary) << f.pem;
  return f;
}

absl::StatusOr<PemFile> WriteKey(const std::string& dir, const char* name, EVP_PKEY* key) {
  absl::StatusOr<std::string> pem = ToPem([&](BIO* b) {
    return PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr, nullptr);
  });
  if (!pem.ok()) return pem.status();
  PemFile f{absl::StrCat(dir, "/", name), *std::move(pem)};
  std::ofstream(f.path, std::ios::binary) << f.pem;
  return f;
}

}  // namespace

absl::StatusOr<TestCerts> MakeTestCerts(const std::string& dir) {
  const std::vector<std::pair<int, const char*>> ca_ext = {
      {NID_basic_constraints, "critical,CA:TRUE"},
      {NID_key_usage, "critical,keyCertSign,cRLSign"},
      {NID_subject_key_identifier, "hash"}};
  const std::vector<std::pair<int, const char*>> server_ext = {
      {NID_basic_constraints, "critical,CA:FALSE"},
      {NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1"},
      {NID_ext_key_usage, "serverAuth"},
      {NID_authority_key_identifier, "keyid"}};
  const std::vector<std::pair<int, const char*>> client_ext = {
      {NID_basic_constraints, "critical,CA:FALSE"},
      {NID_ext_key_usage, "clientAuth"},
      {NID_authority_key_identifier, "keyid"}};

  Key ca_key = NewKey(), server_key = NewKey(), client_key = NewKey();
  Key other_ca_key = NewKey(), other_client_key = NewKey();
  if (!ca_key || !server_key || !client_key || !other_ca_key || !other_client_key) {
    return OpenSslError("EC key generation");
  }
  absl::StatusOr<Cert> ca = NewCert(ca_key.get(), "modserve test CA", nullptr, ca_key.get(), 1,
                                    ca_ext);
  if (!ca.ok()) return ca.status();
  absl::StatusOr<Cert> other_ca = NewCert(other_ca_key.get(), "unrelated test CA", nullptr,
                                          other_ca_key.get(), 1, ca_ext);
  if (!other_ca.ok()) return other_ca.status();
  absl::StatusOr<Cert> server = NewCert(server_key.get(), "localhost", ca->get(), ca_key.get(),
                                        2, server_ext);
  if (!server.ok()) return server.status();
  absl::StatusOr<Cert> client = NewCert(client_key.get(), "modserve test client", ca->get(),
                                        ca_key.get(), 3, client_ext);
  if (!client.ok()) return client.status();
  absl::StatusOr<Cert> other_client =
      NewCert(other_client_key.get(), "unrelated test client", other_ca->get(),
              other_ca_key.get(), 2, client_ext);
  if (!other_client.ok()) return other_client.status();

  TestCerts out;
  struct Job {
    PemFile* out;
    const char* name;
    X509* cert;
    EVP_PKEY* key;
  };
  for (const Job& j : {Job{&out.ca_cert, "ca.crt", ca->get(), nullptr},
                       Job{&out.server_cert, "server.crt", server->get(), nullptr},
                       Job{&out.server_key, "server.key", nullptr, server_key.get()},
                       Job{&out.client_cert, "client.crt", client->get(), nullptr},
                       Job{&out.client_key, "client.key", nullptr, client_key.get()},
                       Job{&out.other_client_cert, "other_client.crt", other_client->get(),
                           nullptr},
                       Job{&out.other_client_key, "other_client.key", nullptr,
                           other_client_key.get()}}) {
    absl::StatusOr<PemFile> f =
        j.cert != nullptr ? WriteCert(dir, j.name, j.cert) : WriteKey(dir, j.name, j.key);
    if (!f.ok()) return f.status();
    *j.out = *std::move(f);
  }
  return out;
}

}  // namespace modserve::server::testing
