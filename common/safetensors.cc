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

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this code copies it as is");

namespace dptrain {
namespace {

constexpr int64_t kMaxInt = int64_t{1} << 62;  // Any count or offset above this is corrupt.

absl::Status Corrupt(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("corrupt safetensors: ", what));
}

using Json = nlohmann::json;

// Parses `header` with nlohmann::json. JSON objects keep one value per key, so a key that
// repeats within one object is caught while parsing (the parser callback sees every key) and
// reported by where it is: a tensor name, a tensor's key, a metadata key.
absl::StatusOr<Json> ParseHeaderJson(absl::string_view header) {
  struct Level {
    std::set<std::string> keys;
    std::string owner;  // The key of this object in its parent ("" at the top).
  };
  std::vector<Level> levels;
  std::string last_key, duplicate;
  auto on_event = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      levels.push_back({{}, levels.empty() ? "" : last_key});
    } else if (event == Json::parse_event_t::object_end) {
      levels.pop_back();
    } else if (event == Json::parse_event_t::key) {
      last_key = parsed.get<std::string>();
      if (!levels.back().keys.insert(last_key).second && duplicate.empty()) {
        const std::string& owner = levels.back().owner;
        duplicate = levels.size() == 1           ? absl::StrCat("duplicate name '", last_key, "'")
                    : owner == "__metadata__" ? absl::StrCat("duplicate metadata key '", last_key, "'")
                                              : absl::StrCat("tensor '", owner, "': duplicate key '",
                                                             last_key, "'");
      }
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(header.begin(), header.end(), on_event);
  } catch (const Json::exception& e) {
    return Corrupt(absl::StrCat("header JSON: ", e.what()));
  }
  if (!duplicate.empty()) return Corrupt(absl::StrCat("header JSON: ", duplicate));
  if (!j.is_object()) return Corrupt("header JSON: not an object");
  return j;
}

// [int, ...] of integers in [0, kMaxInt].
absl::Status IntArray(const Json& j, const std::string& what, std::vector<int64_t>& out) {
  if (!j.is_array()) return Corrupt(absl::StrCat("header JSON: ", what, " is not an array"));
  for (const Json& v : j) {
    if (!v.is_number_unsigned()) {
      return Corrupt(absl::StrCat("header JSON: ", what, " holds ", v.dump(),
                                  ", not a non-negative integer"));
    }
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(kMaxInt)) {
      return Corrupt(absl::StrCat("header JSON: ", what, ": integer too large"));
    }
    out.push_back(static_cast<int64_t>(u));
  }
  return absl::OkStatus();
}

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

// Reads {"dtype": .., "shape": [..], "data_offsets": [..]}: these keys and no others.
absl::Status ParseEntry(const Json& j, Entry& e) {
  const std::string t = absl::StrCat("tensor '", e.name, "'");
  if (!j.is_object()) return Corrupt(absl::StrCat("header JSON: ", t, " is not an object"));
  for (const auto& [key, value] : j.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return Corrupt(absl::StrCat("header JSON: ", t, ": unknown key '", key, "'"));
    }
  }
  if (!j.contains("dtype") || !j.contains("shape") || !j.contains("data_offsets")) {
    return Corrupt(absl::StrCat("header JSON: ", t, " lacks dtype, shape or data_offsets"));
  }
  if (!j["dtype"].is_string()) {
    return Corrupt(absl::StrCat("header JSON: ", t, ": dtype is not a string"));
  }
  e.dtype = j["dtype"].get<std::string>();
  absl::Status s = IntArray(j["shape"], t + " shape", e.shape);
  if (s.ok()) s = IntArray(j["data_offsets"], t + " data_offsets", e.offsets);
  return s;
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
  auto json = ParseHeaderJson(header);
  if (!json.ok()) return json.status();
  for (const auto& [key, value] : json->items()) {
    if (key != "__metadata__") {
      entries.emplace_back().name = key;
      if (absl::Status s = ParseEntry(value, entries.back()); !s.ok()) return s;
      continue;
    }
    if (!value.is_object()) return Corrupt("header JSON: __metadata__ is not an object");
    for (const auto& [k, v] : value.items()) {
      if (!v.is_string()) {
        return Corrupt(absl::StrCat("header JSON: metadata '", k, "' is not a string"));
      }
      contents.metadata.emplace(k, v.get<std::string>());
    }
  }

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
