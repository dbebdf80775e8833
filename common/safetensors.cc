#include "common/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this code copies it as is");

namespace dptrain {
namespace {

constexpr int64_t kMaxInt = int64_t{1} << 62;  // Any count or offset above this is corrupt.

absl::Status Corrupt(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("corrupt safetensors: ", what));
}

// A strict parser for the subset of JSON that a safetensors header uses. Methods return false
// after recording the first error in status().
class JsonParser {
 public:
  explicit JsonParser(absl::string_view s) : s_(s) {}

  const absl::Status& status() const { return status_; }
  bool Fail(absl::string_view what) {
    if (status_.ok()) status_ = Corrupt(absl::StrCat("header JSON: ", what, " at byte ", pos_));
    return false;
  }
  void SkipSpace() {
    while (pos_ < s_.size() && absl::string_view(" \t\n\r").find(s_[pos_]) != s_.npos) ++pos_;
  }
  bool Consume(char c) {
    SkipSpace();
    return pos_ < s_.size() && s_[pos_] == c ? (++pos_, true) : false;
  }
  bool Expect(char c) {
    return Consume(c) || Fail(absl::StrCat("expected '", std::string(1, c), "'"));
  }
  bool AtEnd() { return SkipSpace(), pos_ == s_.size(); }

  // Parses an object, calling `member(key)` to parse each member's value.
  template <typename F>
  bool Object(F member) {
    if (!Expect('{')) return false;
    if (Consume('}')) return true;
    do {
      std::string key;
      if (!String(key) || !Expect(':') || !member(key)) return false;
    } while (Consume(','));
    return Expect('}');
  }

  bool String(std::string& out) {
    if (!Expect('"')) return false;
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return Fail("control character in string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      const char e = pos_ < s_.size() ? s_[pos_++] : '\0';
      static constexpr absl::string_view kEscaped = "\"\\/bfnrt", kMeaning = "\"\\/\b\f\n\r\t";
      if (const size_t i = kEscaped.find(e); i != absl::string_view::npos) {
        out.push_back(kMeaning[i]);
        continue;
      }
      uint32_t code, low;
      if (e != 'u' || !Hex4(code)) return Fail("bad escape in string");
      if (code >= 0xDC00 && code <= 0xDFFF) return Fail("lone low surrogate");
      if (code >= 0xD800 && code <= 0xDBFF) {
        if (s_.substr(pos_, 2) != "\\u") return Fail("lone high surrogate");
        pos_ += 2;
        if (!Hex4(low) || low < 0xDC00 || low > 0xDFFF) return Fail("bad surrogate pair");
        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
      }
      AppendUtf8(code, out);
    }
    return Fail("unterminated string");
  }

  // [int, ...] of non-negative integers.
  bool IntArray(std::vector<int64_t>& out) {
    if (!Expect('[')) return false;
    if (Consume(']')) return true;
    do {
      SkipSpace();
      const size_t start = pos_;
      int64_t v = 0;
      while (pos_ < s_.size() && absl::ascii_isdigit(s_[pos_])) {
        if (v > kMaxInt / 10) return Fail("integer too large");
        v = v * 10 + (s_[pos_++] - '0');
      }
      if (pos_ == start) return Fail("expected a non-negative integer");
      if (s_[start] == '0' && pos_ - start > 1) return Fail("integer with a leading zero");
      out.push_back(v);
    } while (Consume(','));
    return Expect(']');
  }

 private:
  bool Hex4(uint32_t& v) {
    const absl::string_view h = s_.substr(pos_, 4);
    if (h.size() < 4 || !std::all_of(h.begin(), h.end(), absl::ascii_isxdigit)) return false;
    return absl::SimpleHexAtoi(h, &v) && (pos_ += 4, true);
  }
  static void AppendUtf8(uint32_t c, std::string& out) {
    const int extra = c < 0x80 ? 0 : c < 0x800 ? 1 : c < 0x10000 ? 2 : 3;
    static constexpr unsigned char kLead[] = {0x00, 0xC0, 0xE0, 0xF0};
    out.push_back(static_cast<char>(kLead[extra] | (c >> (6 * extra))));
    for (int i = extra - 1; i >= 0; --i)
      out.push_back(static_cast<char>(0x80 | ((c >> (6 * i)) & 0x3F)));
  }

  absl::string_view s_;
  size_t pos_ = 0;
  absl::Status status_;
};

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(&out, "\\u00", absl::Hex(c, absl::kZeroPad2));
    } else {
      absl::StrAppend(&out, c == '"' || c == '\\' ? "\\" : "", absl::string_view(&c, 1));
    }
  }
  return out + "\"";
}

struct Entry {
  std::string name, dtype;
  std::vector<int64_t> shape, offsets;
};

// Parses {"dtype": .., "shape": [..], "data_offsets": [..]}, each key exactly once.
bool ParseEntry(JsonParser& p, Entry& e) {
  bool has_dtype = false, has_shape = false, has_offsets = false;
  const std::string t = absl::StrCat("tensor '", e.name, "'");
  return p.Object([&](const std::string& key) {
    bool* seen = key == "dtype"          ? &has_dtype
                 : key == "shape"        ? &has_shape
                 : key == "data_offsets" ? &has_offsets
                                         : nullptr;
    if (seen == nullptr) return p.Fail(absl::StrCat(t, ": unknown key '", key, "'"));
    if (*seen) return p.Fail(absl::StrCat(t, ": duplicate key '", key, "'"));
    *seen = true;
    return key == "dtype" ? p.String(e.dtype) : p.IntArray(key == "shape" ? e.shape : e.offsets);
  }) && ((has_dtype && has_shape && has_offsets) ||
         p.Fail(absl::StrCat(t, " lacks dtype, shape or data_offsets")));
}

}  // namespace

absl::Status SyncDirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open directory '", dir, "'"));
  const bool ok = fsync(fd) == 0;
  const int e = errno;
  close(fd);
  if (!ok) return absl::ErrnoToStatus(e, absl::StrCat("cannot sync directory '", dir, "'"));
  return absl::OkStatus();
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > kMaxInt / d)) return -1;
    n *= d;
  }
  return n;
}

absl::Status WithPath(const std::string& path, const absl::Status& s) {
  return s.ok() ? s : absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

const LoadedTensor* SafetensorsContents::Find(absl::string_view name) const {
  auto it = std::find_if(tensors.begin(), tensors.end(), [&](auto& t) { return t.name == name; });
  return it == tensors.end() ? nullptr : &*it;
}

absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<NamedTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  for (const auto& [key, value] : metadata) {
    absl::StrAppend(&header, header.size() > 1 ? "," : "\"__metadata__\":{", JsonString(key), ":",
                    JsonString(value));
  }
  if (!metadata.empty()) header += "}";
  std::set<std::string> names;
  int64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const int64_t n = NumElements(t.shape);
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second || n < 0 ||
        n > kMaxInt / 4 ||
        (n > 0 && t.data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': empty, reserved or repeated name, or bad shape or no data"));
    }
    absl::StrAppend(&header, header.size() > 1 ? "," : "", JsonString(t.name),
                    ":{\"dtype\":\"F32\",\"shape\":", ShapeString(t.shape), ",\"data_offsets\":[",
                    offset, ",", offset + 4 * n, "]}");
    offset += 4 * n;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t header_size = header.size();
  std::memcpy(out.data(), &header_size, 8);
  out += header;
  for (const NamedTensor& t : tensors) {
    out.append(reinterpret_cast<const char*>(t.data), 4 * NumElements(t.shape));
  }
  return out;
}

absl::StatusOr<SafetensorsContents> ParseSafetensors(absl::string_view bytes) {
  if (bytes.size() < 8) {
    return Corrupt(absl::StrCat("truncated: ", bytes.size(), " bytes, need at least 8"));
  }
  uint64_t header_size;
  std::memcpy(&header_size, bytes.data(), 8);
  if (header_size > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes)) {
    return Corrupt(absl::StrCat("header of ", header_size, " bytes is over the limit of ",
                                kMaxSafetensorsHeaderBytes));
  }
  if (header_size > bytes.size() - 8) {
    return Corrupt(absl::StrCat("truncated: header says ", header_size, " bytes but only ",
                                bytes.size() - 8, " follow"));
  }
  const absl::string_view header = bytes.substr(8, header_size);
  const absl::string_view data = bytes.substr(8 + header_size);
  if (header.empty() || header[0] != '{') return Corrupt("header does not start with '{'");

  SafetensorsContents contents;
  std::vector<Entry> entries;
  std::set<std::string> names;
  JsonParser p(header);
  const bool parsed = p.Object([&](const std::string& key) {
    if (!names.insert(key).second) return p.Fail(absl::StrCat("duplicate name '", key, "'"));
    if (key != "__metadata__") {
      entries.emplace_back().name = key;
      return ParseEntry(p, entries.back());
    }
    return p.Object([&](const std::string& k) {
      std::string v;
      return p.String(v) && (contents.metadata.emplace(k, v).second ||
                             p.Fail(absl::StrCat("duplicate metadata key '", k, "'")));
    });
  });
  if (parsed && !p.AtEnd()) p.Fail("trailing characters after the header object");
  if (!p.status().ok()) return p.status();

  for (const Entry& e : entries) {
    const std::string t = absl::StrCat("tensor '", e.name, "'");
    if (e.dtype != "F32") {
      return absl::InvalidArgumentError(absl::StrCat(
          t, " has dtype ", e.dtype, ": only F32 is supported (convert with .float())"));
    }
    const int64_t n = NumElements(e.shape);
    // Its byte size 4 * n must fit as well: n up to kMaxInt overflowed int64 (UBSan in
    // tests/fuzz/safetensors_fuzzer on regressions/safetensors_fuzzer/byte_size_overflow).
    if (n < 0 || n > kMaxInt / 4) {
      return Corrupt(absl::StrCat(t, " has a too large shape ", ShapeString(e.shape)));
    }
    if (e.offsets.size() != 2 || e.offsets[0] > e.offsets[1] ||
        e.offsets[1] > static_cast<int64_t>(data.size())) {
      return Corrupt(absl::StrCat(t, " has data_offsets ", ShapeString(e.offsets),
                                  " out of range of the data section of ", data.size(), " bytes"));
    }
    if (e.offsets[1] - e.offsets[0] != 4 * n) {
      return Corrupt(absl::StrCat(t, " has ", e.offsets[1] - e.offsets[0], " bytes but its shape ",
                                  ShapeString(e.shape), " needs ", 4 * n));
    }
  }
  std::sort(entries.begin(), entries.end(), [](auto& a, auto& b) { return a.offsets < b.offsets; });
  int64_t end = 0;  // Of the previous tensor.
  for (const Entry& e : entries) {
    if (e.offsets[0] != end) {
      return Corrupt(absl::StrCat("tensor '", e.name, "' starts at byte ", e.offsets[0],
                                  " but the one before it ends at ", end,
                                  e.offsets[0] < end ? ": they overlap" : ": a hole"));
    }
    end = e.offsets[1];
  }
  if (end != static_cast<int64_t>(data.size())) {
    return Corrupt(absl::StrCat(data.size() - end, " unused bytes after the last tensor"));
  }
  for (Entry& e : entries) {
    const int64_t size = e.offsets[1] - e.offsets[0];
    LoadedTensor& t = contents.tensors.emplace_back(
        LoadedTensor{std::move(e.name), std::move(e.shape), std::vector<float>(size / 4)});
    // A tensor with no elements has no buffer: memcpy from or to null is undefined even
    // for 0 bytes (found by tests/fuzz/safetensors_fuzzer).
    if (size > 0) std::memcpy(t.data.data(), data.data() + e.offsets[0], size);
  }
  return contents;
}

absl::Status SaveSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  auto bytes = SerializeSafetensors(tensors, metadata);
  if (!bytes.ok()) return bytes.status();
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid()),
                    what = "cannot write '" + path + "'";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return absl::ErrnoToStatus(errno, what);
  bool ok = std::fwrite(bytes->data(), 1, bytes->size(), f) == bytes->size();
  ok = std::fflush(f) == 0 && ok;
  ok = fsync(fileno(f)) == 0 && ok;
  const int write_errno = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = ok ? errno : write_errno;
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(e, what);
  }
  return SyncDirectoryOf(path);
}

absl::StatusOr<SafetensorsContents> LoadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) return absl::ErrnoToStatus(errno, absl::StrCat("cannot read '", path, "'"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read '", path, "'"));
  auto contents = ParseSafetensors(buffer.str());
  if (!contents.ok()) return WithPath(path, contents.status());
  return contents;
}

}  // namespace dptrain
