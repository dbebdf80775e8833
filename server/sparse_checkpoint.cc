#include "server/sparse_checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/json_number.h"
#include "nlohmann/json.hpp"

namespace dptrain {
namespace {

constexpr char kMagic[] = "DPTSPRS1";  // 8 bytes, no terminator written.
constexpr int kFormatVersion = 1;
constexpr char kSuffix[] = ".dptsparse";

template <typename T>
void Append(std::string& out, const std::vector<T>& v) {
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Reads `n` values of T at `at` (advancing it); false when the bytes run out.
template <typename T>
bool Take(absl::string_view bytes, size_t& at, size_t n, std::vector<T>& out) {
  if (n > (bytes.size() - at) / sizeof(T)) return false;
  out.resize(n);
  if (n > 0) std::memcpy(out.data(), bytes.data() + at, n * sizeof(T));
  at += n * sizeof(T);
  return true;
}

uint32_t Crc32(absl::string_view bytes) {
  return static_cast<uint32_t>(
      crc32_z(crc32_z(0, nullptr, 0), reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

std::string Prefix(int shard) { return absl::StrCat("shard-", shard, "-sparse-"); }

std::string FileName(int shard, const std::string& table, int64_t step) {
  char digits[32];
  std::snprintf(digits, sizeof(digits), "%012" PRId64, step);
  return absl::StrCat(Prefix(shard), table, "-step-", digits, kSuffix);
}

}  // namespace

std::string SerializeSparseCheckpoint(const SparseTableCheckpoint& cp) {
  nlohmann::json m;
  m["format_version"] = kFormatVersion;
  m["job_id"] = cp.job_id;
  m["shard"] = cp.shard;
  m["num_shards"] = cp.num_shards;
  m["step"] = cp.step;
  m["rows_held"] = cp.ids.size();
  const SparseTableSpec& s = cp.spec;
  m["table"] = {{"name", s.name},           {"rows", s.rows},   {"dim", s.dim},
                {"optimizer", s.optimizer}, {"lr", s.lr},       {"eps", s.eps},
                {"beta1", s.beta1},         {"beta2", s.beta2}, {"seed", s.seed}};
  const std::string manifest = m.dump();
  std::string out(kMagic, 8);
  const uint64_t length = manifest.size();
  out.append(reinterpret_cast<const char*>(&length), sizeof(length));
  out += manifest;
  Append(out, cp.ids);
  Append(out, cp.weights);
  Append(out, cp.state_a);
  Append(out, cp.state_b);
  Append(out, cp.state_steps);
  const uint32_t crc = Crc32(out);
  out.append(reinterpret_cast<const char*>(&crc), sizeof(crc));
  return out;
}

absl::StatusOr<SparseTableCheckpoint> ParseSparseCheckpoint(absl::string_view bytes) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("not a sparse table checkpoint: ", what));
  };
  if (bytes.size() < 8 + 8 + 4) return absl::DataLossError("sparse checkpoint: truncated");
  if (bytes.substr(0, 8) != absl::string_view(kMagic, 8)) return bad("no DPTSPRS1 magic");
  uint32_t crc = 0;
  std::memcpy(&crc, bytes.data() + bytes.size() - 4, 4);
  const absl::string_view body = bytes.substr(0, bytes.size() - 4);
  if (Crc32(body) != crc) {
    return absl::DataLossError("sparse checkpoint: checksum mismatch (truncated or corrupted)");
  }
  uint64_t length = 0;
  std::memcpy(&length, body.data() + 8, 8);
  if (length > body.size() - 16) return bad("the manifest runs past the end");
  nlohmann::json m = nlohmann::json::parse(body.substr(16, length), nullptr, false);
  if (m.is_discarded() || !m.is_object()) return bad("the manifest is not a JSON object");
  SparseTableCheckpoint cp;
  uint64_t held = 0;
  try {
    if (JsonNumber<int>(m.at("format_version")) != kFormatVersion)
      return bad("unknown format version");
    cp.job_id = m.at("job_id").get<std::string>();
    cp.shard = JsonNumber<int>(m.at("shard"));
    cp.num_shards = JsonNumber<int>(m.at("num_shards"));
    cp.step = JsonNumber<int64_t>(m.at("step"));
    held = JsonNumber<uint64_t>(m.at("rows_held"));
    const nlohmann::json& t = m.at("table");
    SparseTableSpec& s = cp.spec;
    s.name = t.at("name").get<std::string>();
    s.rows = JsonNumber<int64_t>(t.at("rows"));
    s.dim = JsonNumber<int>(t.at("dim"));
    s.optimizer = t.at("optimizer").get<std::string>();
    s.lr = JsonNumber<float>(t.at("lr"));
    s.eps = JsonNumber<double>(t.at("eps"));
    s.beta1 = JsonNumber<double>(t.at("beta1"));
    s.beta2 = JsonNumber<double>(t.at("beta2"));
    s.seed = JsonNumber<uint64_t>(t.at("seed"));
  } catch (const nlohmann::json::exception& e) {
    return bad(absl::StrCat("manifest: ", e.what()));
  }
  if (auto s = ValidateSparseTableSpec(cp.spec); !s.ok()) return bad(s.message());
  if (cp.step < 0 || cp.shard < 0 || cp.num_shards < 1 || cp.shard >= cp.num_shards) {
    return bad("step, shard or shard count out of range");
  }
  const uint64_t dim = static_cast<uint64_t>(cp.spec.dim);
  if (held > static_cast<uint64_t>(cp.spec.rows) || held > (body.size() / 8)) {
    return bad("more rows than the file or the table can hold");
  }
  const bool adagrad = cp.spec.optimizer == "adagrad", adam = cp.spec.optimizer == "adam";
  size_t at = 16 + length;
  if (!Take(body, at, held, cp.ids) || !Take(body, at, held * dim, cp.weights) ||
      !Take(body, at, (adagrad || adam) ? held * dim : 0, cp.state_a) ||
      !Take(body, at, adam ? held * dim : 0, cp.state_b) ||
      !Take(body, at, adam ? held : 0, cp.state_steps)) {
    return bad("the rows run past the end");
  }
  if (at != body.size()) return bad("bytes after the rows");
  for (size_t i = 0; i < cp.ids.size(); ++i) {
    if (cp.ids[i] < 0 || cp.ids[i] >= cp.spec.rows || (i > 0 && cp.ids[i] <= cp.ids[i - 1])) {
      return bad(absl::StrCat("row id ", cp.ids[i], " out of range or order"));
    }
  }
  return cp;
}

absl::StatusOr<SparseCheckpointDir> SparseCheckpointDir::Open(const std::string& dir, int shard,
                                                              int keep, FileSystem* fs,
                                                              LogSink log) {
  if (dir.empty() || fs == nullptr || keep < 1) {
    return absl::InvalidArgumentError("sparse checkpoints: no directory, file system or keep");
  }
  if (auto s = fs->CreateDir(dir); !s.ok()) return s;
  auto names = fs->ListDir(dir);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    if (absl::StartsWith(name, Prefix(shard)) && absl::EndsWith(name, ".tmp")) {
      (void)fs->Remove(absl::StrCat(dir, "/", name));
    }
  }
  return SparseCheckpointDir(dir, shard, keep, fs, std::move(log));
}

std::string SparseCheckpointDir::PathOf(const std::string& table, int64_t step) const {
  return absl::StrCat(dir_, "/", FileName(shard_, table, step));
}

absl::Status SparseCheckpointDir::Write(const SparseTableCheckpoint& cp) {
  const std::string path = PathOf(cp.spec.name, cp.step), tmp = path + ".tmp";
  if (auto s = fs_->WriteFile(tmp, SerializeSparseCheckpoint(cp)); !s.ok()) {
    (void)fs_->Remove(tmp);
    return s;
  }
  if (auto s = fs_->Rename(tmp, path); !s.ok()) {
    (void)fs_->Remove(tmp);
    return s;
  }
  if (auto s = fs_->SyncDir(dir_); !s.ok()) return s;
  auto tables = Tables();
  if (!tables.ok()) return tables.status();
  const std::vector<int64_t>& steps = (*tables)[cp.spec.name];
  for (size_t i = keep_; i < steps.size(); ++i) {
    if (auto s = fs_->Remove(PathOf(cp.spec.name, steps[i])); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::vector<int64_t>>> SparseCheckpointDir::Tables() {
  auto names = fs_->ListDir(dir_);
  if (!names.ok()) return names.status();
  std::map<std::string, std::vector<int64_t>> tables;
  for (const std::string& name : *names) {
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, Prefix(shard_)) || !absl::ConsumeSuffix(&rest, kSuffix)) {
      continue;
    }
    const size_t at = rest.rfind("-step-");
    int64_t step = 0;
    if (at == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(at + 6), &step) ||
        step < 0) {
      continue;
    }
    const std::string table(rest.substr(0, at));
    if (FileName(shard_, table, step) == name) tables[table].push_back(step);
  }
  for (auto& [table, steps] : tables) std::sort(steps.rbegin(), steps.rend());
  return tables;
}

absl::StatusOr<SparseTableCheckpoint> SparseCheckpointDir::Read(const std::string& table,
                                                                int64_t step) {
  const std::string path = PathOf(table, step);
  auto bytes = fs_->ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  auto cp = ParseSparseCheckpoint(*bytes);
  if (!cp.ok())
    return absl::Status(cp.status().code(), absl::StrCat(path, ": ", cp.status().message()));
  if (cp->step != step || cp->shard != shard_ || cp->spec.name != table) {
    return absl::DataLossError(absl::StrCat(path, ": holds shard ", cp->shard, " table '",
                                            cp->spec.name, "' step ", cp->step,
                                            ", not what its name says"));
  }
  return cp;
}

absl::StatusOr<SparseTableCheckpoint> SparseCheckpointDir::LoadNewest(const std::string& table) {
  auto tables = Tables();
  if (!tables.ok()) return tables.status();
  for (int64_t step : (*tables)[table]) {
    auto cp = Read(table, step);
    if (cp.ok()) return cp;
    log_(absl::StrCat("ps shard ", shard_, ": skipping sparse table '", table,
                      "' checkpoint of step ", step, ": ", cp.status().ToString()));
  }
  return absl::NotFoundError(absl::StrCat("no valid checkpoint of sparse table '", table,
                                          "' of shard ", shard_, " in '", dir_, "'"));
}

absl::StatusOr<SparseTableCheckpoint> SparseCheckpointDir::Load(const std::string& table,
                                                                int64_t step) {
  auto tables = Tables();
  if (!tables.ok()) return tables.status();
  const std::vector<int64_t>& steps = (*tables)[table];
  if (std::find(steps.begin(), steps.end(), step) == steps.end()) {
    return absl::NotFoundError(absl::StrCat(
        "shard ", shard_, " has no checkpoint of sparse table '", table, "' of step ", step,
        " in '", dir_, "' (it has: ", steps.empty() ? "none" : absl::StrJoin(steps, ","), ")"));
  }
  return Read(table, step);
}

}  // namespace dptrain
