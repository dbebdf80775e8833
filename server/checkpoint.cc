#include "server/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/json_number.h"
#include "common/safetensors.h"
#include "nlohmann/json.hpp"

namespace dptrain {
namespace {

constexpr int kFormatVersion = 1;
constexpr const char* kManifestKey = "dptrain_manifest";
constexpr const char* kCrcKey = "dptrain_crc32";
constexpr const char* kBuffersKey = "buffers";  // All-reduce mode: every rank's.

std::string TensorName(const ChunkCheckpoint& c, absl::string_view what) {
  return absl::StrCat("chunk/", c.tensor_id, "/", c.chunk_index, "/", what);
}

// The optimizer state vectors of a chunk, by name, in a fixed order.
std::vector<std::pair<const char*, std::vector<float>*>> StateVectors(OptimizerState& s) {
  return {{"momentum_buffer", &s.momentum_buffer},
          {"exp_avg", &s.exp_avg},
          {"exp_avg_sq", &s.exp_avg_sq}};
}

uint32_t Crc(uint32_t crc, const void* data, size_t n) {
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), n));
}

uint32_t ChecksumOf(const std::string& manifest, const std::vector<const std::vector<float>*>& data) {
  uint32_t crc = Crc(crc32_z(0, nullptr, 0), manifest.data(), manifest.size());
  for (const std::vector<float>* v : data) crc = Crc(crc, v->data(), v->size() * sizeof(float));
  return crc;
}

std::string FileName(int shard, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof(name), "shard-%d-step-%012" PRId64 ".safetensors", shard, step);
  return name;
}

}  // namespace

absl::StatusOr<std::string> SerializeCheckpoint(const ShardCheckpoint& cp) {
  nlohmann::json m;
  m["format_version"] = kFormatVersion;
  m["job_id"] = cp.job_id;
  m["shard"] = cp.shard;
  m["num_shards"] = cp.num_shards;
  m["init_fingerprint"] = absl::StrCat(cp.init_fingerprint);
  m["max_chunk_elements"] = cp.model.max_chunk_elements;
  m["model_num_shards"] = cp.model.num_shards;
  nlohmann::json tensors = nlohmann::json::array();
  for (const TensorInfo& t : cp.model.tensors) {
    tensors.push_back({{"name", t.name}, {"num_elements", t.num_elements}});
  }
  m["tensors"] = std::move(tensors);
  m["optimizer"] = cp.optimizer;
  m["policy"] = cp.policy;
  m["step"] = cp.step;
  nlohmann::json chunks = nlohmann::json::array();
  std::vector<NamedTensor> named;
  std::vector<const std::vector<float>*> data;
  for (const ChunkCheckpoint& c : cp.chunks) {
    nlohmann::json state = nlohmann::json::array();
    named.push_back({TensorName(c, "weights"), {static_cast<int64_t>(c.weights.size())},
                     c.weights.data()});
    data.push_back(&c.weights);
    for (auto& [name, v] : StateVectors(const_cast<OptimizerState&>(c.state))) {
      if (v->empty()) continue;
      if (v->size() != c.weights.size()) {
        return absl::InternalError(absl::StrCat("chunk ", c.tensor_id, "/", c.chunk_index,
                                                ": optimizer state '", name, "' has ", v->size(),
                                                " elements, the weights ", c.weights.size()));
      }
      named.push_back({TensorName(c, name), {static_cast<int64_t>(v->size())}, v->data()});
      data.push_back(v);
      state.push_back(name);
    }
    chunks.push_back({{"tensor_id", c.tensor_id},
                      {"chunk_index", c.chunk_index},
                      {"version", c.version},
                      {"optimizer_steps", c.state.steps},
                      {"state", std::move(state)}});
  }
  m["chunks"] = std::move(chunks);
  if (cp.world_size > 0) m["world_size"] = cp.world_size;
  if (!cp.buffers.empty()) {
    m["buffers"] = cp.buffers.size();
    named.push_back({kBuffersKey, {static_cast<int64_t>(cp.buffers.size())}, cp.buffers.data()});
    data.push_back(&cp.buffers);
  }
  const std::string manifest = m.dump();
  return SerializeSafetensors(
      named, {{kManifestKey, manifest}, {kCrcKey, absl::StrCat(ChecksumOf(manifest, data))}});
}

absl::StatusOr<ShardCheckpoint> ParseCheckpoint(absl::string_view bytes,
                                                const ParseCheckpointOptions& options) {
  auto contents = ParseSafetensors(bytes);
  if (!contents.ok()) return absl::DataLossError(contents.status().message());
  const auto manifest_it = contents->metadata.find(kManifestKey);
  const auto crc_it = contents->metadata.find(kCrcKey);
  if (manifest_it == contents->metadata.end() || crc_it == contents->metadata.end()) {
    return absl::InvalidArgumentError("not a dptrain shard checkpoint (no manifest)");
  }
  if (options.verify_checksum) {
    std::vector<const std::vector<float>*> data;
    for (const LoadedTensor& t : contents->tensors) data.push_back(&t.data);
    uint32_t stored = 0;
    if (!absl::SimpleAtoi(crc_it->second, &stored) ||
        stored != ChecksumOf(manifest_it->second, data)) {
      return absl::DataLossError("checksum mismatch: the checkpoint is corrupted");
    }
  }
  const nlohmann::json m = nlohmann::json::parse(manifest_it->second, nullptr, false);
  if (m.is_discarded() || !m.is_object()) {
    return absl::InvalidArgumentError("manifest is not a JSON object");
  }
  ShardCheckpoint cp;
  try {
    if (JsonNumber<int>(m.at("format_version")) != kFormatVersion) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint format version ",
                                                     m.at("format_version").dump(),
                                                     " is not ", kFormatVersion));
    }
    cp.job_id = m.at("job_id").get<std::string>();
    cp.shard = JsonNumber<int>(m.at("shard"));
    cp.num_shards = JsonNumber<int>(m.at("num_shards"));
    if (!absl::SimpleAtoi(m.at("init_fingerprint").get<std::string>(), &cp.init_fingerprint)) {
      return absl::InvalidArgumentError("manifest: init_fingerprint is not a number");
    }
    cp.model.max_chunk_elements = JsonNumber<int64_t>(m.at("max_chunk_elements"));
    cp.model.num_shards = JsonNumber<int>(m.at("model_num_shards"));
    for (const nlohmann::json& t : m.at("tensors")) {
      cp.model.tensors.push_back(
          {t.at("name").get<std::string>(), JsonNumber<int64_t>(t.at("num_elements"))});
    }
    cp.optimizer = m.at("optimizer").get<std::string>();
    cp.policy = m.at("policy").get<std::string>();
    cp.step = JsonNumber<int64_t>(m.at("step"));
    for (const nlohmann::json& j : m.at("chunks")) {
      ChunkCheckpoint& c = cp.chunks.emplace_back();
      c.tensor_id = JsonNumber<int>(j.at("tensor_id"));
      c.chunk_index = JsonNumber<int>(j.at("chunk_index"));
      c.version = JsonNumber<int64_t>(j.at("version"));
      c.state.steps = JsonNumber<int64_t>(j.at("optimizer_steps"));
      const LoadedTensor* w = contents->Find(TensorName(c, "weights"));
      if (w == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("no tensor ", TensorName(c, "weights"), " for a chunk in the manifest"));
      }
      c.weights = w->data;
      std::map<std::string, std::vector<float>*> vectors;
      for (auto& [name, v] : StateVectors(c.state)) vectors[name] = v;
      for (const nlohmann::json& s : j.at("state")) {
        const std::string name = s.get<std::string>();
        auto it = vectors.find(name);
        const LoadedTensor* t = contents->Find(TensorName(c, name));
        if (it == vectors.end() || t == nullptr || t->data.size() != c.weights.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("optimizer state '", name, "' of chunk ", c.tensor_id, "/",
                           c.chunk_index, " is unknown, missing or of the wrong size"));
        }
        *it->second = t->data;
      }
    }
    if (m.contains("world_size")) cp.world_size = JsonNumber<int>(m.at("world_size"));
    if (m.contains("buffers")) {
      const LoadedTensor* b = contents->Find(kBuffersKey);
      if (b == nullptr ||
          static_cast<int64_t>(b->data.size()) != JsonNumber<int64_t>(m.at("buffers"))) {
        return absl::InvalidArgumentError("buffers missing or of the wrong size");
      }
      cp.buffers = b->data;
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("manifest: ", e.what()));
  }
  return cp;
}

absl::StatusOr<CheckpointDir> CheckpointDir::Open(const CheckpointDirOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("no checkpoint directory");
  if (options.fs == nullptr) return absl::InvalidArgumentError("no file system");
  if (options.keep < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoints to keep must be >= 1, got ", options.keep));
  }
  if (auto s = options.fs->CreateDir(options.dir); !s.ok()) return s;
  auto names = options.fs->ListDir(options.dir);
  if (!names.ok()) return names.status();
  const std::string prefix = absl::StrCat("shard-", options.shard, "-step-");
  for (const std::string& name : *names) {
    if (absl::StartsWith(name, prefix) && absl::EndsWith(name, ".tmp")) {
      (void)options.fs->Remove(absl::StrCat(options.dir, "/", name));
    }
  }
  return CheckpointDir(options);
}

std::string CheckpointDir::PathOf(int64_t step) const {
  return absl::StrCat(options_.dir, "/", FileName(options_.shard, step));
}

absl::Status CheckpointDir::Write(const ShardCheckpoint& checkpoint) {
  auto bytes = SerializeCheckpoint(checkpoint);
  if (!bytes.ok()) return bytes.status();
  const std::string path = PathOf(checkpoint.step), tmp = path + ".tmp";
  if (auto s = options_.fs->WriteFile(tmp, *bytes); !s.ok()) {
    (void)options_.fs->Remove(tmp);
    return s;
  }
  if (auto s = options_.fs->Rename(tmp, path); !s.ok()) {
    (void)options_.fs->Remove(tmp);
    return s;
  }
  if (auto s = options_.fs->SyncDir(options_.dir); !s.ok()) return s;
  auto steps = Steps();
  if (!steps.ok()) return steps.status();
  for (size_t i = options_.keep; i < steps->size(); ++i) {
    if (auto s = options_.fs->Remove(PathOf((*steps)[i])); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> CheckpointDir::Steps() {
  auto names = options_.fs->ListDir(options_.dir);
  if (!names.ok()) return names.status();
  std::vector<int64_t> steps;
  const std::string prefix = absl::StrCat("shard-", options_.shard, "-step-");
  for (const std::string& name : *names) {
    absl::string_view rest = name;
    int64_t step = 0;
    if (absl::ConsumePrefix(&rest, prefix) && absl::ConsumeSuffix(&rest, ".safetensors") &&
        absl::SimpleAtoi(rest, &step) && step >= 0 && FileName(options_.shard, step) == name) {
      steps.push_back(step);
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

absl::StatusOr<ShardCheckpoint> CheckpointDir::Read(int64_t step) {
  const std::string path = PathOf(step);
  auto bytes = options_.fs->ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  auto cp = ParseCheckpoint(*bytes);
  if (!cp.ok()) return WithPath(path, cp.status());
  if (cp->step != step || cp->shard != options_.shard) {
    return absl::DataLossError(absl::StrCat(path, ": holds shard ", cp->shard, " step ",
                                            cp->step, ", not what its name says"));
  }
  return cp;
}

absl::StatusOr<ShardCheckpoint> CheckpointDir::LoadNewest() {
  auto steps = Steps();
  if (!steps.ok()) return steps.status();
  for (int64_t step : *steps) {
    auto cp = Read(step);
    if (cp.ok()) return cp;
    options_.log(absl::StrCat("ps shard ", options_.shard, ": skipping checkpoint of step ", step,
                              ": ", cp.status().ToString()));
  }
  return absl::NotFoundError(absl::StrCat("no valid checkpoint of shard ", options_.shard,
                                          " in '", options_.dir, "'"));
}

absl::StatusOr<ShardCheckpoint> CheckpointDir::Load(int64_t step) {
  auto steps = Steps();
  if (!steps.ok()) return steps.status();
  if (std::find(steps->begin(), steps->end(), step) == steps->end()) {
    return absl::NotFoundError(absl::StrCat("shard ", options_.shard, " has no checkpoint of step ",
                                            step, " in '", options_.dir, "' (it has: ",
                                            steps->empty() ? "none" : absl::StrJoin(*steps, ","),
                                            ")"));
  }
  return Read(step);
}

}  // namespace dptrain
