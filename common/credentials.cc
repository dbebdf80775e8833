#include "common/credentials.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <sys/stat.h>

#include <cstdio>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_token.h"
#include "common/small_file.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace dptrain {
namespace {

constexpr size_t kMaxPemBytes = size_t{1} << 20;
constexpr char kTokenHeader[] = "authorization";
constexpr char kBearer[] = "Bearer ";

absl::Status Named(absl::string_view flag, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("--", flag, ": ", s.message()));
}

// The warning for a private file that everyone may read, or "".
std::string ReadableByOthers(absl::string_view flag, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || (st.st_mode & S_IROTH) == 0) return "";
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return absl::StrCat("--", flag, "=", path, " is readable by every user (mode ", mode,
                      "): chmod 600 it (tools/make_certs.sh writes keys and tokens so)");
}

absl::Status Invalid(absl::string_view flag, const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": ", what));
}

// ---- PEM checks with libcrypto, so that a wrong file is one clear line at start rather
// than a server that does not start or a handshake that fails later.

struct OpenSslFree {
  void operator()(BIO* b) const { BIO_free(b); }
  void operator()(X509* x) const { X509_free(x); }
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
  void operator()(STACK_OF(X509) * s) const { sk_X509_free(s); }
};
template <typename T>
using Owned = std::unique_ptr<T, OpenSslFree>;

Owned<BIO> MemoryBio(const std::string& pem) {
  return Owned<BIO>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

std::vector<Owned<X509>> Certificates(const std::string& pem) {
  Owned<BIO> bio = MemoryBio(pem);
  std::vector<Owned<X509>> out;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) out.emplace_back(x);
  ERR_clear_error();  // The end of the text reads as an error.
  return out;
}

// An encrypted key is not unlocked: a server cannot ask for a passphrase.
int NoPassphrase(char*, int, int, void*) { return -1; }

absl::Status CheckTlsFiles(const SecurityOptions& o, const std::string& cert_pem,
                           const std::string& key_pem, const std::string& ca_pem) {
  std::vector<Owned<X509>> chain = Certificates(cert_pem);
  if (chain.empty()) return Invalid("tls_cert", o.tls_cert, "no PEM certificate in it");
  Owned<EVP_PKEY> key(
      PEM_read_bio_PrivateKey(MemoryBio(key_pem).get(), nullptr, &NoPassphrase, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return Invalid("tls_key", o.tls_key, "no unencrypted PEM private key in it");
  }
  if (X509_check_private_key(chain[0].get(), key.get()) != 1) {
    ERR_clear_error();
    return Invalid("tls_key", o.tls_key,
                   absl::StrCat("not the private key of --tls_cert=", o.tls_cert));
  }
  std::vector<Owned<X509>> cas = Certificates(ca_pem);
  if (cas.empty()) return Invalid("tls_ca", o.tls_ca, "no PEM certificate in it");
  Owned<X509_STORE> store(X509_STORE_new());
  for (const auto& ca : cas) X509_STORE_add_cert(store.get(), ca.get());
  Owned<STACK_OF(X509)> intermediates(sk_X509_new_null());
  for (size_t i = 1; i < chain.size(); ++i) sk_X509_push(intermediates.get(), chain[i].get());
  Owned<X509_STORE_CTX> context(X509_STORE_CTX_new());
  X509_STORE_CTX_init(context.get(), store.get(), chain[0].get(), intermediates.get());
  if (X509_verify_cert(context.get()) != 1) {
    const int error = X509_STORE_CTX_get_error(context.get());
    ERR_clear_error();
    return Invalid("tls_cert", o.tls_cert,
                   absl::StrCat("not accepted by --tls_ca=", o.tls_ca, ": ",
                                X509_verify_cert_error_string(error)));
  }
  return absl::OkStatus();
}

// ---- The job token on the wire.

// Server side: runs on every call of a TLS port before the call is dispatched to a service.
class JobTokenCheck final : public grpc::AuthMetadataProcessor {
 public:
  explicit JobTokenCheck(const std::string& token)
      : expected_(Sha256(absl::StrCat(kBearer, token))) {}

  bool IsBlocking() const override { return false; }  // A hash and a compare.

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext*, OutputMetadata* consumed,
                       OutputMetadata*) override {
    const auto found = metadata.find(kTokenHeader);
    // Hashing both sides makes the comparison's time independent of the lengths too.
    if (found == metadata.end() ||
        !DigestsEqual(Sha256(absl::string_view(found->second.data(), found->second.size())),
                      expected_)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "UNAUTHENTICATED: missing or wrong job token (every process of a "
                          "job needs the same --job_token_file)");
    }
    // Services never see the token.
    consumed->emplace(kTokenHeader, std::string(found->second.data(), found->second.size()));
    return grpc::Status::OK;
  }

 private:
  const Digest expected_;
};

// Client side: adds the token to every call of a channel.
class JobTokenPlugin final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit JobTokenPlugin(const std::string& token) : header_(absl::StrCat(kBearer, token)) {}
  bool IsBlocking() const override { return false; }
  const char* GetType() const override { return "dptrain-job-token"; }
  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<std::string, std::string>* metadata) override {
    metadata->emplace(kTokenHeader, header_);
    return grpc::Status::OK;
  }

 private:
  const std::string header_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Credentials>> Credentials::Load(const SecurityOptions& o) {
  const bool cert = !o.tls_cert.empty(), key = !o.tls_key.empty(), ca = !o.tls_ca.empty();
  if ((cert || key || ca) && !(cert && key && ca)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_cert, --tls_key and --tls_ca go together (mutual TLS); missing:",
                     cert ? "" : " --tls_cert", key ? "" : " --tls_key", ca ? "" : " --tls_ca"));
  }
  if (!o.job_token_file.empty() && !cert) {
    return absl::InvalidArgumentError(
        "--job_token_file needs --tls_cert, --tls_key and --tls_ca: without TLS the token "
        "would cross the network in clear (tools/make_certs.sh makes both)");
  }
  std::shared_ptr<Credentials> c(new Credentials());
  if (cert) {
    const std::pair<const char*, const std::string*> files[] = {
        {"tls_cert", &o.tls_cert}, {"tls_key", &o.tls_key}, {"tls_ca", &o.tls_ca}};
    std::string* into[] = {&c->cert_, &c->key_, &c->ca_};
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<std::string> pem = ReadSmallFile(*files[i].second, kMaxPemBytes);
      if (!pem.ok()) return Named(files[i].first, pem.status());
      *into[i] = *std::move(pem);
    }
    if (auto s = CheckTlsFiles(o, c->cert_, c->key_, c->ca_); !s.ok()) return s;
  }
  if (!o.job_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadJobTokenFile(o.job_token_file);
    if (!token.ok()) return Named("job_token_file", token.status());
    c->job_token_ = *std::move(token);
  }
  const std::pair<const char*, const std::string*> secrets[] = {
      {"tls_key", &o.tls_key}, {"job_token_file", &o.job_token_file}};
  for (const auto& [flag, path] : secrets) {
    if (path->empty()) continue;
    if (std::string warning = ReadableByOthers(flag, *path); !warning.empty()) {
      c->file_warnings_.push_back(std::move(warning));
    }
  }
  return std::shared_ptr<const Credentials>(std::move(c));
}

std::shared_ptr<const Credentials> Credentials::Plaintext() {
  return std::shared_ptr<const Credentials>(new Credentials());
}

std::string Credentials::Warning() const {
  if (!tls()) {
    return "security off: plaintext gRPC, no job token, unauthenticated ring links: anyone "
           "who can reach this job's ports can read its traffic and act as any of its "
           "processes (secure run: tools/make_certs.sh, then --tls_cert, --tls_key, --tls_ca "
           "and --job_token_file)";
  }
  if (job_token_.empty()) {
    return "no --job_token_file: any holder of a certificate from --tls_ca can act as any "
           "process of this job, and the ring's TCP links (allreduce mode) are "
           "unauthenticated";
  }
  return "";
}

std::shared_ptr<grpc::ServerCredentials> Credentials::ServerCredentials() const {
  if (!tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = ca_;
  options.pem_key_cert_pairs.push_back({key_, cert_});
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(options);
  if (!job_token_.empty()) {
    credentials->SetAuthMetadataProcessor(std::make_shared<JobTokenCheck>(job_token_));
  }
  return credentials;
}

std::shared_ptr<grpc::ChannelCredentials> Credentials::ChannelCredentials() const {
  if (!tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ca_;
  options.pem_private_key = key_;
  options.pem_cert_chain = cert_;
  std::shared_ptr<grpc::ChannelCredentials> channel = grpc::SslCredentials(options);
  if (job_token_.empty()) return channel;
  return grpc::CompositeChannelCredentials(
      channel, grpc::MetadataCredentialsFromPlugin(std::make_unique<JobTokenPlugin>(job_token_)));
}

}  // namespace dptrain
