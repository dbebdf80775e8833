// The security flags of ps_server, gpu_worker and health_probe (--tls_cert, --tls_key,
// --tls_ca, --job_token_file), defined once here and read only by each binary's main.
#ifndef DPTRAIN_COMMON_SECURITY_FLAGS_H_
#define DPTRAIN_COMMON_SECURITY_FLAGS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/credentials.h"

namespace dptrain {

// Credentials::Load of the flags (its errors name the flag and the file).
absl::StatusOr<std::shared_ptr<const Credentials>> CredentialsFromFlags();

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_SECURITY_FLAGS_H_
