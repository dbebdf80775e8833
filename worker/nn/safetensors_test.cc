#include "worker/nn/safetensors.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/graph/builtin_models.h"

namespace dptrain {
namespace nn {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}
#define EXPECT_HAS(text, part) EXPECT_PRED2(Contains, text, part)

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// A file with the given header JSON (unpadded) and `data_bytes` zero bytes of data.
std::string RawFile(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data_bytes, '\0');
}

std::string ErrorOf(const std::string& bytes) {
  auto parsed = ParseSafetensors(bytes);
  EXPECT_FALSE(parsed.ok());
  return parsed.ok() ? "" : std::string(parsed.status().message());
}

TEST(SafetensorsTest, RoundTrip) {
  const std::vector<float> a = {1.5f, -2.f, 3.25f, 0.f, 1e-30f, 7.f};
  const float b = 42.f;
  const std::string path = TmpPath("roundtrip.safetensors");
  ASSERT_TRUE(SaveSafetensors(path,
                              {{"layer.0.weight", {2, 3}, a.data()},
                               {"scalar", {}, &b},
                               {"empty", {0, 4}, nullptr},
                               {"odd \"name\"\n\\", {1}, &b}},
                              {{"format", "pt"}, {"note", "tab\there \xc3\xa9"}})
                  .ok());
  auto loaded = LoadSafetensors(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->tensors.size(), 4u);
  const LoadedTensor* t = loaded->Find("layer.0.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->data, a);
  ASSERT_NE(loaded->Find("scalar"), nullptr);
  EXPECT_TRUE(loaded->Find("scalar")->shape.empty());
  EXPECT_EQ(loaded->Find("scalar")->data, std::vector<float>{42.f});
  ASSERT_NE(loaded->Find("empty"), nullptr);
  EXPECT_TRUE(loaded->Find("empty")->data.empty());
  EXPECT_NE(loaded->Find("odd \"name\"\n\\"), nullptr);
  EXPECT_EQ(loaded->metadata.at("note"), "tab\there \xc3\xa9");
  EXPECT_EQ(loaded->metadata.at("format"), "pt");

  // The header is padded to a multiple of 8; no temporary file is left behind.
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_FALSE(std::ifstream(absl::StrCat(path, ".tmp.", getpid())).good());
}

TEST(SafetensorsTest, AcceptsJsonEscapesWhitespaceAndAnyOrder) {
  // Tensors listed out of offset order, \u escapes (with a surrogate pair), spaces and newlines.
  const std::string header =
      "{ \"b\\u00e9\" : {\"shape\":[1],\"dtype\":\"F32\",\"data_offsets\":[4,8]},\n"
      "  \"a\\/\\ud83d\\ude00\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
      "\"__metadata__\":{}}   ";
  auto parsed = ParseSafetensors(RawFile(header, 8));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tensors.size(), 2u);
  EXPECT_EQ(parsed->tensors[0].name, "a/\xf0\x9f\x98\x80");
  EXPECT_EQ(parsed->tensors[1].name, "b\xc3\xa9");
}

TEST(SafetensorsTest, RejectsTruncatedFiles) {
  EXPECT_HAS(ErrorOf(""), "truncated: 0 bytes");
  EXPECT_HAS(ErrorOf("\x10\0\0"), "truncated");
  std::string good = *SerializeSafetensors({{"w", {4}, std::vector<float>(4).data()}});
  EXPECT_HAS(ErrorOf(good.substr(0, 20)), "truncated: header says");
  // Data cut short: the tensor's offsets point past the end.
  EXPECT_HAS(ErrorOf(good.substr(0, good.size() - 1)),
             "tensor 'w' has data_offsets [0,16] out of range of the data section of 15 bytes");
}

TEST(SafetensorsTest, RejectsHugeHeader) {
  std::string bytes(16, ' ');
  const uint64_t n = uint64_t{1} << 40;
  std::memcpy(bytes.data(), &n, 8);
  EXPECT_HAS(ErrorOf(bytes), "over the limit");
}

TEST(SafetensorsTest, RejectsMalformedJson) {
  const char* bad[] = {
      "[1]",
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}",      // No closing brace.
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},}",    // Trailing comma.
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",    // Negative.
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}",   // Not an integer.
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}",    // Leading zero.
      "{\"w\\x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",  // Bad escape.
      "{\"\\ud800\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",  // Lone surrogate.
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x",      // Trailing junk.
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}",
      "{\"__metadata__\":{\"k\":1},\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
  };
  for (const char* header : bad) {
    EXPECT_HAS(ErrorOf(RawFile(header, 4)), "corrupt safetensors") << header;
  }
}

TEST(SafetensorsTest, RejectsBadEntries) {
  auto error = [](const std::string& entries, size_t data) {
    return ErrorOf(RawFile("{" + entries + "}", data));
  };
  const std::string w = "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}";
  EXPECT_HAS(error(w + "," + w, 4), "duplicate name 'w'");
  EXPECT_HAS(error("\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"dtype\":\"F32\",\"data_offsets\":[0,4]}",
                   4),
             "tensor 'w': duplicate key 'dtype'");
  EXPECT_HAS(error("\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}," + w, 4),
             "duplicate metadata key 'k'");
  EXPECT_HAS(error(w + " x", 4), "parse error at line 1");
  EXPECT_HAS(error("\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}", 4),
             "tensor 'w' has dtype F16: only F32 is supported");
  EXPECT_HAS(error("\"w\":{\"dtype\":\"F32\",\"shape\":[1]}", 4),
             "tensor 'w' lacks dtype, shape or data_offsets");
  EXPECT_HAS(error("\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":[]}", 4),
             "tensor 'w': unknown key 'x'");
  EXPECT_HAS(error("\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}", 4),
             "tensor 'w' has 4 bytes but its shape [2] needs 8");
  // 2^61 elements: the element count fits in int64, its byte size does not (it overflowed
  // before; tests/fuzz/regressions/safetensors_fuzzer/byte_size_overflow).
  EXPECT_HAS(error("\"w\":{\"dtype\":\"F32\",\"shape\":[2305843009213693952],"
                   "\"data_offsets\":[0,0]}",
                   0),
             "tensor 'w' has a too large shape [2305843009213693952]");
  EXPECT_HAS(error("\"w\":{\"dtype\":\"F32\",\"shape\":[1073741824,1073741824,4],"
                   "\"data_offsets\":[0,0]}",
                   0),
             "tensor 'w' has a too large shape");
  EXPECT_HAS(error("\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}", 4),
             "tensor 'w' has data_offsets [4,0] out of range");
  EXPECT_HAS(error("\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}", 4),
             "tensor 'w' has data_offsets [8,12] out of range");
}

TEST(SafetensorsTest, RejectsOverlapsHolesAndTrailingBytes) {
  auto entry = [](const std::string& name, int begin) {
    return absl::StrCat("\"", name, "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[", begin,
                        ",", begin + 4, "]}");
  };
  EXPECT_HAS(ErrorOf(RawFile("{" + entry("a", 0) + "," + entry("b", 2) + "}", 8)),
             "tensor 'b' starts at byte 2 but the one before it ends at 4: they overlap");
  EXPECT_HAS(ErrorOf(RawFile("{" + entry("a", 0) + "," + entry("b", 8) + "}", 12)),
             "tensor 'b' starts at byte 8 but the one before it ends at 4: a hole");
  EXPECT_HAS(ErrorOf(RawFile("{" + entry("a", 0) + "}", 8)),
             "4 unused bytes after the last tensor");
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  const float x = 1;
  EXPECT_FALSE(SerializeSafetensors({{"a", {1}, &x}, {"a", {1}, &x}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"", {1}, &x}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"__metadata__", {1}, &x}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"a", {-1}, &x}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"a", {2}, nullptr}}).ok());
}

TEST(SafetensorsTest, FileErrorsNameThePath) {
  auto missing = LoadSafetensors(TmpPath("no_such.safetensors"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_HAS(std::string(missing.status().message()), "no_such.safetensors");

  const std::string path = TmpPath("corrupt.safetensors");
  WriteFile(path, "garbage");
  auto corrupt = LoadSafetensors(path);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_HAS(std::string(corrupt.status().message()), path + ": corrupt safetensors: truncated");

  const float x = 1;
  EXPECT_FALSE(SaveSafetensors(TmpPath("no_dir/x.safetensors"), {{"a", {1}, &x}}).ok());
}

std::unique_ptr<Model> MakeModel(const std::string& name, uint64_t seed) {
  auto model = graph::CreateBuiltinModel({name, seed, 0});
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

TEST(SafetensorsTest, ModelRoundTrip) {
  for (const std::string name : {"mlp", "lenet"}) {
    auto a = MakeModel(name, 1), b = MakeModel(name, 2);
    ASSERT_NE(a->weights(), b->weights());
    const std::string path = TmpPath(name + ".safetensors");
    ASSERT_TRUE(SaveModel(*a, path).ok());
    ASSERT_TRUE(LoadModel(path, *b).ok());
    EXPECT_EQ(a->weights(), b->weights()) << name;
    auto contents = LoadSafetensors(path);
    ASSERT_TRUE(contents.ok());
    EXPECT_EQ(contents->metadata.at("model"), name);
    EXPECT_EQ(contents->tensors.size(), a->params().size());
    EXPECT_EQ(contents->tensors[0].name, a->params()[0].name);
  }
}

TEST(SafetensorsTest, LoadModelErrorsNameTheTensor) {
  auto lenet = MakeModel("lenet", 1);
  const std::vector<float> before = lenet->weights();
  const std::string path = TmpPath("mlp_for_lenet.safetensors");
  auto mlp = MakeModel("mlp", 1);
  ASSERT_TRUE(SaveModel(*mlp, path).ok());
  absl::Status s = LoadModel(path, *lenet);
  EXPECT_HAS(std::string(s.message()),
             "tensor '0.weight' of model lenet is missing (the file was saved from model 'mlp')");
  // A model of another name with the same tensors loads (as load_state_dict: e.g. a copy of
  // the same ONNX file under another name).
  auto other = MakeModel("mlp", 2);
  std::vector<NamedTensor> tensors;
  for (const ParamInfo& p : other->params()) {
    tensors.push_back({p.name, p.shape, other->weights().data() + p.offset});
  }
  ASSERT_TRUE(SaveSafetensors(path, tensors, {{"model", "mlp_copy"}}).ok());
  ASSERT_TRUE(LoadModel(path, *mlp).ok());
  EXPECT_EQ(mlp->weights(), other->weights());

  // Without the metadata: the first parameter lenet lacks is named.
  const std::vector<float> w(6 * 25);
  ASSERT_TRUE(SaveSafetensors(path, {{"0.weight", {6, 1, 5, 5}, w.data()}}).ok());
  s = LoadModel(path, *lenet);
  EXPECT_HAS(std::string(s.message()), path + ": tensor '0.bias' of model lenet is missing");
  ASSERT_TRUE(SaveSafetensors(path, {{"0.weight", {6, 25}, w.data()}}).ok());
  s = LoadModel(path, *lenet);
  EXPECT_HAS(std::string(s.message()),
             "tensor '0.weight' has shape [6,25] but model lenet expects [6,1,5,5]");
  EXPECT_EQ(lenet->weights(), before);  // Unchanged by the failed loads.
}

// A model with batch-norm-like buffers beside its parameters.
class FakeModel : public Model {
 public:
  FakeModel() : weights_(5), buffer_values_(4) {}
  const std::vector<ParamInfo>& params() const override { return params_; }
  std::vector<float>& weights() override { return weights_; }
  absl::Span<const float> grads() const override { return weights_; }
  absl::Span<float> gradient_exchange() override { return absl::MakeSpan(weights_); }
  absl::Status ApplyUpdate(float) override { return absl::UnimplementedError("fake"); }
  const std::vector<ParamInfo>& buffers() const override { return buffers_; }
  std::vector<float>& buffer_values() override { return buffer_values_; }
  absl::StatusOr<BatchResult> TrainStep(const float*, Targets, int) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<BatchResult> Evaluate(const float*, Targets, int) override {
    return absl::UnimplementedError("fake");
  }
  std::string name() const override { return "fake"; }
  Dims input_dims() const override { return {1, 28, 28}; }
  int num_classes() const override { return 10; }

 private:
  std::vector<ParamInfo> params_ = {{"0.weight", {2, 2}, 0, 4}, {"0.bias", {1}, 4, 1}};
  std::vector<ParamInfo> buffers_ = {{"1.running_mean", {3}, 0, 3},
                                     {"1.num_batches_tracked", {}, 3, 1}};
  std::vector<float> weights_, buffer_values_;
};

TEST(SafetensorsTest, ModelBuffersRoundTrip) {
  FakeModel a, b;
  a.weights() = {1, 2, 3, 4, 5};
  a.buffer_values() = {0.5f, 0.25f, 0.125f, 7};
  const std::string path = TmpPath("fake.safetensors");
  ASSERT_TRUE(SaveModel(a, path).ok());
  auto contents = LoadSafetensors(path);
  ASSERT_TRUE(contents.ok());
  ASSERT_NE(contents->Find("1.num_batches_tracked"), nullptr);
  EXPECT_TRUE(contents->Find("1.num_batches_tracked")->shape.empty());
  ASSERT_TRUE(LoadModel(path, b).ok());
  EXPECT_EQ(b.weights(), a.weights());
  EXPECT_EQ(b.buffer_values(), a.buffer_values());

  // A checkpoint without the buffers is refused, naming the first missing one.
  const std::vector<float> w = {9, 9, 9, 9}, bias = {9};
  ASSERT_TRUE(
      SaveSafetensors(path, {{"0.weight", {2, 2}, w.data()}, {"0.bias", {1}, bias.data()}}).ok());
  EXPECT_HAS(std::string(LoadModel(path, b).message()),
             "tensor '1.running_mean' of model fake is missing");
  EXPECT_EQ(b.weights(), a.weights());
}

// A file written by tools/make_fixtures.py (Python struct + json, from PyTorch tensors) loads.
TEST(SafetensorsTest, ReadsPythonWrittenFixture) {
  auto contents = LoadSafetensors("worker/nn/testdata/lenet_fixture.safetensors");
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_EQ(contents->metadata.at("format"), "pt");
  EXPECT_EQ(contents->metadata.at("model"), "lenet");
  const LoadedTensor* input = contents->Find("input");
  ASSERT_NE(input, nullptr);
  EXPECT_EQ(input->shape, (std::vector<int64_t>{4, 1, 28, 28}));
  ASSERT_NE(contents->Find("grad.11.bias"), nullptr);
  auto model = MakeModel("lenet", 0);
  EXPECT_TRUE(SetModelWeights(*contents, *model).ok());
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
