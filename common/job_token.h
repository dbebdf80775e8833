// The job token: the one secret every process of a job shares (--job_token_file), and the
// primitives built on it (OpenSSL's libcrypto): HMAC-SHA256 for the ring's keyed handshake,
// SHA-256 and a constant-time comparison for the gRPC token check, random nonces.
#ifndef DPTRAIN_COMMON_JOB_TOKEN_H_
#define DPTRAIN_COMMON_JOB_TOKEN_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace dptrain {

// Shortest token accepted; tools/make_certs.sh writes 64 hex digits (256 random bits).
inline constexpr size_t kMinJobTokenChars = 16;

// The token in `path`: the file's text without surrounding whitespace (so a trailing newline
// does not count). Errors, each one line naming the path: NotFound / PermissionDenied /
// Unavailable (cannot read it), InvalidArgument (empty, shorter than kMinJobTokenChars, over
// 4096 bytes, or with a character that is not printable ASCII or is a space: the token travels
// in a gRPC header).
absl::StatusOr<std::string> ReadJobTokenFile(const std::string& path);

using Digest = std::array<uint8_t, 32>;

Digest Sha256(absl::string_view data);
Digest HmacSha256(absl::string_view key, absl::string_view message);

// Equal digests, compared in a time that does not depend on where they differ
// (OpenSSL's CRYPTO_memcmp).
bool DigestsEqual(const Digest& a, const Digest& b);

// Fills `out` from OpenSSL's CSPRNG. Internal if it has no entropy (never in practice).
absl::Status RandomBytes(absl::Span<uint8_t> out);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_JOB_TOKEN_H_
