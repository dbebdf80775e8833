#include "common/wire_link.h"

#include <cstring>
#include <vector>

#include "common/wire_dtype.h"

namespace dptrain {
namespace {

int64_t PackedWords(int64_t n) { return (n + 1) / 2; }

}  // namespace

absl::Status NarrowingLink::Send(int peer, uint64_t tag, absl::Span<const float> data) {
  std::vector<uint16_t> narrow(2 * PackedWords(static_cast<int64_t>(data.size())), 0);
  Narrow(wire_, data, absl::MakeSpan(narrow).first(data.size()));
  std::vector<float> words(narrow.size() / 2);
  std::memcpy(words.data(), narrow.data(), words.size() * sizeof(float));
  return inner_.Send(peer, tag, words);
}

absl::Status NarrowingLink::Receive(int peer, uint64_t tag, int64_t n, std::vector<float>& out) {
  std::vector<float> words(PackedWords(n));
  if (absl::Status s = inner_.Recv(peer, tag, absl::MakeSpan(words)); !s.ok()) return s;
  const absl::string_view bytes(reinterpret_cast<const char*>(words.data()),
                                static_cast<size_t>(n) * 2);
  return Widen(wire_, bytes, out);
}

absl::Status NarrowingLink::Recv(int peer, uint64_t tag, absl::Span<float> out) {
  std::vector<float> wide;
  if (absl::Status s = Receive(peer, tag, static_cast<int64_t>(out.size()), wide); !s.ok()) {
    return s;
  }
  std::copy(wide.begin(), wide.end(), out.begin());
  return absl::OkStatus();
}

absl::Status NarrowingLink::RecvAdd(int peer, uint64_t tag, absl::Span<float> inout, float scale) {
  std::vector<float> wide;
  if (absl::Status s = Receive(peer, tag, static_cast<int64_t>(inout.size()), wide); !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < inout.size(); ++i) inout[i] = (inout[i] + wide[i]) * scale;
  return absl::OkStatus();
}

void RoundToWire(DType wire, absl::Span<float> values) {
  if (wire == DType::kBf16) {
    for (float& v : values) v = Bf16BitsToFloat(FloatToBf16Bits(v));
  } else if (wire == DType::kFp16) {
    for (float& v : values) v = Fp16BitsToFloat(FloatToFp16Bits(v));
  }
}

}  // namespace dptrain
