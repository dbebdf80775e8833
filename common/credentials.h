// Who may talk to whom: the one place where a process's gRPC credentials are made, for every
// server it runs (ps service, tensor stream, health, rendezvous, master reducer) and every
// channel it opens. From --tls_cert, --tls_key, --tls_ca and --job_token_file
// (common/security_flags.h); tests build them from files directly.
//
// With TLS, servers require and verify a client certificate signed by the job's CA (mutual
// TLS), channels verify the server's certificate (its name or IP against the address dialled)
// with that CA as the only root. With a job token, every call a channel makes carries
// `authorization: Bearer <token>`, and every server checks it before the call reaches any
// service (grpc::AuthMetadataProcessor: no handler runs, no message is read) with a
// constant-time comparison; a missing or wrong token is UNAUTHENTICATED. gRPC runs that check
// only on TLS ports, so a token requires TLS (it would cross the network in clear anyway).
// The same token keys the ring's TCP handshake (worker/comm/ring_auth.h).
#ifndef DPTRAIN_COMMON_CREDENTIALS_H_
#define DPTRAIN_COMMON_CREDENTIALS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace dptrain {

// Paths as the flags give them; empty: not given.
struct SecurityOptions {
  std::string tls_cert;  // PEM certificate (chain) of this process, as server and as client.
  std::string tls_key;   // Its PEM private key.
  std::string tls_ca;    // PEM certificate(s) of the CA that signs every certificate of the job.
  std::string job_token_file;
};

class Credentials {
 public:
  // Reads and checks the files. One-line errors that name the flag and the file:
  // InvalidArgument when only some TLS flags are given, or a token without TLS, or a file is
  // not what its flag says (no PEM certificate/key, key not the certificate's, certificate not
  // signed by the CA or expired, bad token: common/job_token.h); the errno's code when a file
  // cannot be read.
  static absl::StatusOr<std::shared_ptr<const Credentials>> Load(const SecurityOptions& options);
  // Plaintext, no token: what a process without security flags uses, and tests.
  static std::shared_ptr<const Credentials> Plaintext();

  bool tls() const { return !cert_.empty(); }
  const std::string& job_token() const { return job_token_; }  // Empty: none.

  // One line saying what is not protected (no TLS, no token), or "" when both are on.
  std::string Warning() const;
  // One line per private file (--tls_key, --job_token_file) that users other than its owner
  // and group can read (as ssh warns): a copied folder would leak it. Empty when none.
  const std::vector<std::string>& FileWarnings() const { return file_warnings_; }

  // A fresh object per call (each server sets its own token check on it).
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;

 private:
  Credentials() = default;

  std::string cert_, key_, ca_;  // PEM text; all empty without TLS.
  std::string job_token_;
  std::vector<std::string> file_warnings_;
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_CREDENTIALS_H_
