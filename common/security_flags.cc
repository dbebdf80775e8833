#include "common/security_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate of this process (tools/make_certs.sh makes one per process), used "
          "as server and as client. With --tls_key and --tls_ca: mutual TLS on every gRPC "
          "server and channel of the process. None of the three: plaintext, with a warning.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM certificate of the job's CA: peers must present a certificate it signed.");
ABSL_FLAG(std::string, job_token_file, "",
          "File holding the job's secret token (needs the --tls_* flags): every gRPC call "
          "carries it and every server checks it (UNAUTHENTICATED otherwise); the ring's TCP "
          "links prove it with an HMAC challenge-response before any tensor byte.");

namespace dptrain {

absl::StatusOr<std::shared_ptr<const Credentials>> CredentialsFromFlags() {
  SecurityOptions o;
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  o.job_token_file = absl::GetFlag(FLAGS_job_token_file);
  return Credentials::Load(o);
}

}  // namespace dptrain
