#include "common/job_token.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/small_file.h"

namespace dptrain {
namespace {

constexpr size_t kMaxTokenFileBytes = 4096;

}  // namespace

absl::StatusOr<std::string> ReadJobTokenFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSmallFile(path, kMaxTokenFileBytes);
  if (!text.ok()) return text.status();
  const std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is empty (tools/make_certs.sh writes a random job token)"));
  }
  if (token.size() < kMinJobTokenChars) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job token in '", path, "' has ", token.size(), " characters, fewer than ",
                     kMinJobTokenChars, " (tools/make_certs.sh writes 64 hex digits)"));
  }
  for (unsigned char c : token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          absl::StrCat("the job token in '", path,
                       "' must be printable ASCII without spaces (it travels in a gRPC header)"));
    }
  }
  return token;
}

Digest Sha256(absl::string_view data) {
  Digest out;
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), out.data(), &len, EVP_sha256(), nullptr);
  return out;
}

Digest HmacSha256(absl::string_view key, absl::string_view message) {
  Digest out;
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), out.data(), &len);
  return out;
}

bool DigestsEqual(const Digest& a, const Digest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::Status RandomBytes(absl::Span<uint8_t> out) {
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1) {
    return absl::InternalError("RAND_bytes failed: no random bytes for a nonce");
  }
  return absl::OkStatus();
}

}  // namespace dptrain
