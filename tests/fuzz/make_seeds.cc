// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/): small valid
// inputs, built with the project's own writers, from which the fuzzers mutate their way into
// the parsers. Regenerate with
//   bazel run //tests/fuzz:make_seeds -- $PWD/tests/fuzz/corpus
#include <png.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "common/tensor_frame.h"
#include "proto/ps.pb.h"
#include "worker/comm/ring_wire.h"
#include "worker/data/test_images.h"

namespace dptrain {
namespace {

std::string root;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string path = root + "/" + target + "/" + name;
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  if (!out) {
    std::cerr << "make_seeds: cannot write " << path << " (does the directory exist?)\n";
    std::exit(1);
  }
}

// The inverse of FuzzedDataProvider: what the fuzz targets read with ConsumeIntegral*,
// ConsumeBool and ConsumeRandomLengthString, in the order they read it. Integers come from
// the end of the input, strings from the front.
class ProviderInput {
 public:
  template <typename T>
  ProviderInput& Integral(T value, T min = std::numeric_limits<T>::min(),
                          T max = std::numeric_limits<T>::max()) {
    const uint64_t range = static_cast<uint64_t>(max) - static_cast<uint64_t>(min);
    uint64_t offset = static_cast<uint64_t>(value) - static_cast<uint64_t>(min);
    int bytes = 0;
    for (uint64_t r = range; r > 0 && bytes < static_cast<int>(sizeof(T)); r >>= 8) ++bytes;
    // The provider reads the last byte first, as the most significant one.
    for (int i = bytes - 1; i >= 0; --i) back_.push_back(static_cast<char>(offset >> (8 * i)));
    return *this;
  }
  ProviderInput& Bool(bool b) { return Integral<uint8_t>(b ? 1 : 0); }
  ProviderInput& String(const std::string& s) {
    for (char c : s) front_ += c == '\\' ? std::string("\\\\") : std::string(1, c);
    front_ += "\\x";  // Ends the string.
    return *this;
  }
  ProviderInput& Rest(const std::string& s) {
    front_ += s;
    return *this;
  }
  std::string Bytes() const { return front_ + std::string(back_.rbegin(), back_.rend()); }

 private:
  std::string front_, back_;
};

std::string Gzip(const std::string& raw) {
  std::vector<char> out(compressBound(raw.size()) + 64);
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // +16: a gzip wrapper.
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  z.avail_in = raw.size();
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = out.size();
  deflate(&z, Z_FINISH);
  const size_t n = z.total_out;
  deflateEnd(&z);
  return std::string(out.data(), n);
}

std::string BigEndian(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

void TensorFrameSeeds() {
  proto::FrameHeader h;
  h.mutable_caller()->set_job_id("job");
  h.mutable_caller()->set_rank(1);
  h.set_step(3);
  h.mutable_key()->set_tensor_id(2);
  h.mutable_key()->set_chunk_index(1);
  h.set_dtype(proto::FP32);
  h.set_overflow(true);
  const float payload[4] = {1.5f, -2.0f, 0.0f, 3.25f};
  int i = 0;
  for (const std::string& bytes :
       {std::string(reinterpret_cast<const char*>(payload), 16), std::string()}) {
    grpc::ByteBuffer frame = FrameReferencing(h, bytes);
    grpc::Slice whole;
    (void)frame.DumpToSingleSlice(&whole);
    const std::string raw(reinterpret_cast<const char*>(whole.begin()), whole.size());
    Write("tensor_frame_fuzzer", "frame" + std::to_string(i) + "_whole", std::string(1, 0) + raw);
    Write("tensor_frame_fuzzer", "frame" + std::to_string(i) + "_cut", std::string(1, 7) + raw);
    ++i;
  }
  proto::FrameHeader reply;
  reply.mutable_key()->set_tensor_id(0);
  reply.set_version(4);
  reply.set_staleness(2);
  grpc::ByteBuffer frame = FrameReferencing(reply, "abcd");
  grpc::Slice whole;
  (void)frame.DumpToSingleSlice(&whole);
  Write(
      "tensor_frame_fuzzer", "reply",
      std::string(1, 3) + std::string(reinterpret_cast<const char*>(whole.begin()), whole.size()));
}

void IdxSeeds() {
  const std::string images = BigEndian(0x803) + BigEndian(2) + BigEndian(2) + BigEndian(3) +
                             std::string("\x00\x10\x20\x30\x40\x50\xff\x5c\x01\x02\x03\x04", 12);
  const std::string labels = BigEndian(0x801) + BigEndian(2) + std::string("\x03\x09", 2);
  auto pair = [](const std::string& a, const std::string& b) {
    return ProviderInput().String(a).Rest(b).Bytes();
  };
  Write("idx_reader_fuzzer", "raw", pair(images, labels));
  Write("idx_reader_fuzzer", "gzip", pair(Gzip(images), Gzip(labels)));
  Write("idx_reader_fuzzer", "gzip_images_raw_labels", pair(Gzip(images), labels));
  Write("idx_reader_fuzzer", "empty_set",
        pair(BigEndian(0x803) + BigEndian(0) + BigEndian(28) + BigEndian(28),
             BigEndian(0x801) + BigEndian(0)));
  // Three images of the built-in models' 28x28 (the path reaches the first batch) and three
  // of 8x8 (refused by the shape check).
  for (int side : {28, 8}) {
    std::string pixels(3 * side * side, '\0');
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<char>(i * 7);
    const std::string images_n =
        BigEndian(0x803) + BigEndian(3) + BigEndian(side) + BigEndian(side) + pixels;
    const std::string labels_n = BigEndian(0x801) + BigEndian(3) + std::string("\x01\x02\x09", 3);
    Write("idx_reader_fuzzer", "images_" + std::to_string(side),
          pair(Gzip(images_n), Gzip(labels_n)));
  }
}

// A .npy file as np.save writes it (format 1.0): magic, version, header length, the dict padded
// with spaces and a newline to a multiple of 64 bytes, then `data`.
std::string Npy(const std::string& descr, const std::vector<int64_t>& shape,
                const std::string& data) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) dims += ",";
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\0';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + data;
}

template <typename T>
std::string Raw(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

void NpySeeds() {
  const std::string labels2 = Npy("<i8", {2}, Raw<int64_t>({1, 0}));
  const std::string labels3 = Npy("<i8", {3}, Raw<int64_t>({2, 0, 299}));
  auto seed = [](const std::string& name, bool stream, const std::string& samples,
                 const std::string& labels) {
    Write("npy_reader_fuzzer", name,
          ProviderInput()
              .Bool(stream)
              .Integral<int>(0, 0, 3)    // Layout: LoadNpyPair.
              .Integral<int>(0, 0, 300)  // num_classes: from the labels.
              .String(samples)
              .Rest(labels)
              .Bytes());
  };
  const std::string bytes12("\x00\x10\x20\x30\x40\x50\xff\x5c\x01\x02\x03\x04", 12);
  seed("uint8_nhw", false, Npy("|u1", {2, 2, 3}, bytes12), labels2);
  seed("uint8_nhw_stream", true, Npy("|u1", {2, 2, 3}, bytes12), labels2);
  seed("uint8_nhwc", false, Npy("|u1", {2, 2, 1, 3}, bytes12), labels2);
  seed("float32_nchw", false,
       Npy("<f4", {2, 1, 2, 3}, Raw<float>({0, 0.5f, 1, -1, 2, 3, 4, 5, 6, 7, 8, 9})), labels2);
  seed("float64_features", false,
       Npy("<f8", {3, 4}, Raw<double>({0.5, -2, 1e-3, 3, 0, 1, 2, 3, 4, 5, 6, 7})), labels3);
  seed("int64_ids", false, Npy("<i8", {3, 2}, Raw<int64_t>({1, 2, 0, 16777215, 5, 0})), labels3);
  seed("uint16_ids", false, Npy("<u2", {2, 3}, Raw<uint16_t>({1, 2, 3, 4, 5, 65535})), labels2);
  // Through LoadNpy: a directory whose file names say what they hold.
  auto named = [](const std::string& name, int layout, int classes, const std::string& samples,
                  const std::string& labels) {
    Write("npy_reader_fuzzer", name,
          ProviderInput()
              .Bool(false)
              .Integral<int>(layout, 0, 3)
              .Integral<int>(classes, 0, 300)
              .String(samples)
              .Rest(labels)
              .Bytes());
  };
  named("dir_ids", 1, 300, Npy("<i8", {3, 2}, Raw<int64_t>({1, 2, 0, 7, 5, 0})), labels3);
  named("dir_features", 2, 0, Npy("<f4", {2, 3}, Raw<float>({0.5f, 1, 2, 3, 4, 5})), labels2);
  named("dir_images_nhwc", 3, 10, Npy("|u1", {2, 2, 1, 3}, bytes12), labels2);
  // Regression targets: float labels, one or two per sample.
  seed("float64_targets", false,
       Npy("<f8", {3, 4}, Raw<double>({0.5, -2, 1e-3, 3, 0, 1, 2, 3, 4, 5, 6, 7})),
       Npy("<f8", {3}, Raw<double>({0.25, -1e3, 7})));
  named("dir_features_targets", 2, 0, Npy("<f4", {2, 3}, Raw<float>({0.5f, 1, 2, 3, 4, 5})),
        Npy("<f4", {2, 2}, Raw<float>({1, -2, 3.5f, 0})));
}

void SafetensorsSeeds() {
  const float w[6] = {1, 2, 3, 4, 5, 6}, b[2] = {-1, 0.5f}, scalar = 7;
  auto write = [](const std::string& name, const std::vector<NamedTensor>& tensors,
                  const std::map<std::string, std::string>& metadata) {
    absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors, metadata);
    if (!bytes.ok()) {
      std::cerr << "make_seeds: " << bytes.status() << "\n";
      std::exit(1);
    }
    Write("safetensors_fuzzer", name, *bytes);
  };
  write("two_tensors", {{"0.weight", {2, 3}, w}, {"0.bias", {2}, b}},
        {{"format", "pt"}, {"model", "mlp"}});
  write("scalar_and_empty", {{"s", {}, &scalar}, {"e\\u \"q\"", {0, 4}, nullptr}}, {});
  write("no_tensors", {}, {{"k", "v"}});
}

void ModelDescriptionSeeds() {
  // LeNet-like: 4 tensors in 2 shards, chunks of 1024 elements, the default limits.
  ProviderInput lenet;
  lenet.Bool(false).Integral<int>(2).Integral<int64_t>(1024).Integral<int>(4, 0, 256);
  for (auto [name, n] : std::vector<std::pair<std::string, int64_t>>{
           {"0.weight", 150}, {"0.bias", 6}, {"3.weight", 2400}, {"3.bias", 16}}) {
    lenet.String(name).Integral<int64_t>(n);
  }
  Write("model_description_fuzzer", "lenet_like", lenet.Bytes());
  // Small limits: 1 MiB, 64 chunks, chunks of at most 4096 elements.
  ProviderInput tight;
  tight.Bool(true)
      .Integral<int64_t>(1 << 20)
      .Integral<int64_t>(64, 0, 1 << 16)
      .Integral<int64_t>(4096)
      .Integral<int>(3)
      .Integral<int64_t>(1000)
      .Integral<int>(2, 0, 256);
  tight.String("a").Integral<int64_t>(5000).String("b").Integral<int64_t>(7);
  Write("model_description_fuzzer", "tight_limits", tight.Bytes());
}

std::string InitSeed(uint8_t config, const proto::InitRequest& init,
                     const proto::PushPullRequest& push) {
  const std::string a = init.SerializeAsString(), b = push.SerializeAsString();
  return std::string(1, static_cast<char>(config)) + static_cast<char>(a.size() & 0xff) +
         static_cast<char>(a.size() >> 8) + a + b;
}

void InitRequestSeeds() {
  // One tensor of 6 elements in chunks of at most 4: chunks (0,0) and (0,1) of 3 elements.
  // With 2 shards, shard 0 owns (0,0) and shard 1 (the fuzzer's shard) owns (0,1).
  auto chunk = [](auto* message, int index, float scale) {
    proto::Chunk* c = message->add_chunks();
    c->mutable_key()->set_tensor_id(0);
    c->mutable_key()->set_chunk_index(index);
    c->set_dtype(proto::FP32);
    const float v[3] = {scale, 2 * scale, -scale};
    c->set_data(reinterpret_cast<const char*>(v), sizeof(v));
  };
  for (int shards : {1, 2}) {
    proto::InitRequest init;
    init.mutable_caller()->set_job_id("job");
    init.set_num_shards(shards);
    init.set_max_chunk_elements(4);
    proto::TensorSpec* t = init.add_tensors();
    t->set_name("w");
    t->set_num_elements(6);
    proto::PushPullRequest push;
    *push.mutable_caller() = init.caller();
    push.set_step(0);
    for (int index = shards == 1 ? 0 : 1; index < 2; ++index) {
      chunk(&init, index, 1.0f);
      chunk(&push, index, 0.25f);
    }
    const uint8_t two = shards == 2 ? 6 : 0;             // config / 6 % 2 picks the shard count.
    for (uint8_t policy_and_optimizer : {0, 1, 2, 3}) {  // bsp, ssp, async; sgd / adam.
      Write("init_request_fuzzer",
            "shards" + std::to_string(shards) + "_config" + std::to_string(policy_and_optimizer),
            InitSeed(two + policy_and_optimizer, init, push));
    }
    push.set_overflow(true);
    Write("init_request_fuzzer", "shards" + std::to_string(shards) + "_overflow",
          InitSeed(two, init, push));
  }
}

void RingWireSeeds() {
  const uint64_t job = ring_auth::HashJob("fuzz");
  auto frame = [](uint64_t tag, const std::string& payload) {
    char header[kRingFrameHeaderBytes];
    EncodeRingFrameHeader({tag, payload.size()}, header);
    return std::string(header, sizeof(header)) + payload;
  };
  const std::string four_floats(16, '\x3f'), two_floats(8, '\x40');
  // world 4, max payload 64, no job token; expect tag 1 (4 floats, copied), tag 2 (2 floats,
  // added), tag 3.
  ProviderInput in;
  in.Integral<int>(4, 0, 8).Integral<uint64_t>(64, 0, 1024).Bool(false);
  in.Integral<uint64_t>(1, 0, 3).Integral<size_t>(4, 0, 16).Bool(false);
  in.Integral<uint64_t>(2, 0, 3).Integral<size_t>(2, 0, 16).Bool(true);
  in.Integral<uint64_t>(3, 0, 3).Integral<size_t>(1, 0, 16).Bool(false);
  ProviderInput expected_and_not = in;
  expected_and_not.Rest(EncodeRingHello(1, job, false) + frame(1, four_floats) +
                        frame(2, two_floats) + frame(0, two_floats) + frame(3, four_floats));
  Write("ring_wire_fuzzer", "expected_and_unexpected", expected_and_not.Bytes());
  ProviderInput truncated = in;
  truncated.Rest(EncodeRingHello(3, job, false) + frame(1, four_floats).substr(0, 20));
  Write("ring_wire_fuzzer", "truncated", truncated.Bytes());
  ProviderInput oversized = in;
  oversized.Rest(EncodeRingHello(2, job, false) + frame(1, std::string(80, 'x')));
  Write("ring_wire_fuzzer", "oversized", oversized.Bytes());
  // The same, read by a rank with a job token (a keyed hello; the proof is not fuzzed).
  ProviderInput keyed;
  keyed.Integral<int>(4, 0, 8).Integral<uint64_t>(64, 0, 1024).Bool(true);
  keyed.Integral<uint64_t>(1, 0, 3).Integral<size_t>(4, 0, 16).Bool(false);
  keyed.Integral<uint64_t>(2, 0, 3).Integral<size_t>(2, 0, 16).Bool(true);
  keyed.Integral<uint64_t>(3, 0, 3).Integral<size_t>(1, 0, 16).Bool(false);
  keyed.Rest(EncodeRingHello(1, job, true) + frame(1, four_floats) + frame(2, two_floats));
  Write("ring_wire_fuzzer", "keyed", keyed.Bytes());
}

// Small images of every kind the decoders take (and two they refuse), for image_decode_fuzzer.
void ImageSeeds() {
  using testing_images::EncodeJpeg;
  using testing_images::EncodePng;
  using testing_images::EncodePng8;
  std::vector<uint8_t> rgb(5 * 3 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 17);
  const std::string png = EncodePng8(5, 3, 3, rgb);
  Write("image_decode_fuzzer", "rgb.png", png);
  Write("image_decode_fuzzer", "gray.png", EncodePng8(4, 2, 1, {0, 50, 100, 150, 200, 250, 1, 2}));
  Write("image_decode_fuzzer", "gray_alpha.png",
        EncodePng(2, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 8, {77, 0, 200, 255}));
  Write("image_decode_fuzzer", "rgba.png",
        EncodePng(2, 1, PNG_COLOR_TYPE_RGB_ALPHA, 8, {1, 2, 3, 0, 250, 128, 0, 99}));
  Write("image_decode_fuzzer", "palette_trns.png",
        EncodePng(3, 1, PNG_COLOR_TYPE_PALETTE, 8, {2, 0, 1}, {255, 0, 0, 0, 255, 0, 10, 20, 30},
                  {0, 128, 255}));
  Write("image_decode_fuzzer", "gray16.png",
        EncodePng(2, 1, PNG_COLOR_TYPE_GRAY, 16, {0x12, 0x34, 0xFF, 0xFF}));
  Write("image_decode_fuzzer", "gray1.png", EncodePng(3, 1, PNG_COLOR_TYPE_GRAY, 1, {0xA0}));
  Write("image_decode_fuzzer", "truncated.png", png.substr(0, png.size() / 2));
  Write("image_decode_fuzzer", "rgb.jpg", EncodeJpeg(9, 6, 3, std::vector<uint8_t>(162, 90)));
  Write("image_decode_fuzzer", "gray.jpg", EncodeJpeg(8, 8, 1, std::vector<uint8_t>(64, 30)));
  Write("image_decode_fuzzer", "cmyk.jpg", EncodeJpeg(8, 8, 4, std::vector<uint8_t>(256, 50)));
}

}  // namespace
}  // namespace dptrain

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_seeds CORPUS_DIR (with one existing folder per fuzz target)\n";
    return 2;
  }
  dptrain::root = argv[1];
  dptrain::TensorFrameSeeds();
  dptrain::IdxSeeds();
  dptrain::NpySeeds();
  dptrain::SafetensorsSeeds();
  dptrain::ModelDescriptionSeeds();
  dptrain::InitRequestSeeds();
  dptrain::RingWireSeeds();
  dptrain::ImageSeeds();
  return 0;
}
