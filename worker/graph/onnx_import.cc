#include "worker/graph/onnx_import.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "onnx/onnx_pb.h"
#include "worker/graph/constant_folding.h"
#include "worker/graph/graph_rewrites.h"
#include "worker/graph/shape_arithmetic.h"

namespace dptrain {
namespace graph {
namespace {

absl::Status Invalid(absl::string_view what) { return absl::InvalidArgumentError(what); }

// `count` little-endian values of type From from `raw` (the host is little-endian, as x86 and
// ARM Linux are), converted to To.
template <typename From, typename To>
std::vector<To> FromRaw(const std::string& raw, int64_t count) {
  std::vector<To> out(count);
  for (int64_t i = 0; i < count; ++i) {
    From v;
    std::memcpy(&v, raw.data() + i * sizeof(From), sizeof(From));
    out[i] = static_cast<To>(v);
  }
  return out;
}

// A TensorProto as a Tensor: float for FLOAT and DOUBLE, int64 for INT64, INT32 and BOOL.
absl::StatusOr<Tensor> ToTensor(const onnx::TensorProto& t, absl::string_view what) {
  auto refuse = [&](absl::string_view why) {
    return Invalid(absl::StrCat(what, " '", t.name(), "': ", why));
  };
  if (t.data_location() == onnx::TensorProto_DataLocation_EXTERNAL) {
    return refuse("stored outside the file (external data) unsupported");
  }
  if (t.has_segment()) return refuse("segmented tensors unsupported");
  Tensor out;
  int64_t count = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || (d > 0 && count > std::numeric_limits<int32_t>::max() / d)) {
      return refuse("invalid or too large shape");
    }
    out.shape.push_back(d);
    count *= d;
  }
  const std::string& raw = t.raw_data();
  const bool has_raw = t.has_raw_data();
  auto check = [&](int64_t held, size_t width) -> absl::Status {
    if (has_raw ? raw.size() != count * width : held != count) {
      return refuse(absl::StrCat("holds ",
                                 has_raw ? static_cast<int64_t>(raw.size() / width) : held,
                                 " values for shape of ", count));
    }
    return absl::OkStatus();
  };
  switch (t.data_type()) {
    case onnx::TensorProto_DataType_FLOAT:
      out.type = Tensor::Type::kFloat;
      DPTRAIN_RETURN_IF_ERROR(check(t.float_data_size(), 4));
      out.floats = has_raw ? FromRaw<float, float>(raw, count)
                           : std::vector<float>(t.float_data().begin(), t.float_data().end());
      return out;
    case onnx::TensorProto_DataType_DOUBLE:
      out.type = Tensor::Type::kFloat;
      DPTRAIN_RETURN_IF_ERROR(check(t.double_data_size(), 8));
      out.floats = has_raw ? FromRaw<double, float>(raw, count)
                           : std::vector<float>(t.double_data().begin(), t.double_data().end());
      return out;
    case onnx::TensorProto_DataType_INT64:
      out.type = Tensor::Type::kInt64;
      DPTRAIN_RETURN_IF_ERROR(check(t.int64_data_size(), 8));
      out.ints = has_raw ? FromRaw<int64_t, int64_t>(raw, count)
                         : std::vector<int64_t>(t.int64_data().begin(), t.int64_data().end());
      return out;
    case onnx::TensorProto_DataType_INT32:
      out.type = Tensor::Type::kInt64;
      DPTRAIN_RETURN_IF_ERROR(check(t.int32_data_size(), 4));
      out.ints = has_raw ? FromRaw<int32_t, int64_t>(raw, count)
                         : std::vector<int64_t>(t.int32_data().begin(), t.int32_data().end());
      return out;
    case onnx::TensorProto_DataType_BOOL:
      out.type = Tensor::Type::kInt64;
      DPTRAIN_RETURN_IF_ERROR(check(t.int32_data_size(), 1));
      out.ints = has_raw ? FromRaw<uint8_t, int64_t>(raw, count)
                         : std::vector<int64_t>(t.int32_data().begin(), t.int32_data().end());
      return out;
    default:
      return refuse(absl::StrCat(
          "data type ",
          onnx::TensorProto_DataType_Name(static_cast<onnx::TensorProto_DataType>(t.data_type())),
          " unsupported"));
  }
}

// The node's attributes (TENSOR ones only for Constant, which the caller handles).
absl::Status ReadAttributes(const onnx::NodeProto& proto, Node& node) {
  for (const onnx::AttributeProto& a : proto.attribute()) {
    switch (a.type()) {
      case onnx::AttributeProto_AttributeType_INT:
        node.attributes[a.name()] = static_cast<int64_t>(a.i());
        break;
      case onnx::AttributeProto_AttributeType_FLOAT:
        node.attributes[a.name()] = a.f();
        break;
      case onnx::AttributeProto_AttributeType_STRING:
        node.attributes[a.name()] = a.s();
        break;
      case onnx::AttributeProto_AttributeType_INTS:
        node.attributes[a.name()] = std::vector<int64_t>(a.ints().begin(), a.ints().end());
        break;
      case onnx::AttributeProto_AttributeType_FLOATS:
        node.attributes[a.name()] = std::vector<float>(a.floats().begin(), a.floats().end());
        break;
      default:
        return Invalid(absl::StrCat("node '", node.name, "' (", node.op, "): attribute '", a.name(),
                                    "' of type ", onnx::AttributeProto_AttributeType_Name(a.type()),
                                    " unsupported"));
    }
  }
  return absl::OkStatus();
}

// nn.EmbeddingBag(mode) of a 2-D input as torch.onnx.export writes it: a Loop over the bags
// whose body slices the flattened ids between two offsets, gathers the table's rows and reduces
// them (sum, mean or max) -> `node` as op Loop with attribute embedding_bag (the mode) and
// inputs [trip count, condition, table, flattened ids, offsets, ends] (the body's values of
// the graph); FuseEmbeddingBag (graph_rewrites.h) checks the rest and replaces it. nullopt for
// any other body.
std::optional<Node> EmbeddingBagLoop(const onnx::NodeProto& proto, const Graph& graph, Node node) {
  if (proto.attribute_size() != 1 || proto.attribute(0).name() != "body" ||
      proto.attribute(0).type() != onnx::AttributeProto_AttributeType_GRAPH ||
      proto.input_size() != 2 || proto.output_size() != 1) {
    return std::nullopt;
  }
  const onnx::GraphProto& body = proto.attribute(0).g();
  if (body.input_size() != 2 || body.output_size() != 2) return std::nullopt;
  // The body's int64 constants, and its other nodes in order.
  std::map<std::string, std::vector<int64_t>> ints;
  std::vector<const onnx::NodeProto*> ops;
  for (const onnx::NodeProto& n : body.node()) {
    if (n.op_type() != "Constant") {
      ops.push_back(&n);
      continue;
    }
    if (n.output_size() != 1 || n.attribute_size() != 1 || !n.attribute(0).has_t()) {
      return std::nullopt;
    }
    absl::StatusOr<Tensor> t = ToTensor(n.attribute(0).t(), "constant");
    if (!t.ok() || t->type != Tensor::Type::kInt64) return std::nullopt;
    ints[n.output(0)] = t->ints;
  }
  static const char* const kOps[] = {"Gather", "Gather", "Unsqueeze", "Unsqueeze",
                                     "Slice",  "Gather", "",          "Cast"};
  if (ops.size() != 8) return std::nullopt;
  // Inputs per op: Gather 2, Unsqueeze 1 or 2 (axes), Slice 4 (no steps), Reduce 1 or 2, Cast 1.
  static const int kInputs[][2] = {{2, 2}, {2, 2}, {1, 2}, {1, 2}, {4, 4}, {2, 2}, {1, 2}, {1, 1}};
  for (size_t k = 0; k < ops.size(); ++k) {
    if (*kOps[k] != '\0' && ops[k]->op_type() != kOps[k]) return std::nullopt;
    if (ops[k]->output_size() != 1 || ops[k]->input_size() < kInputs[k][0] ||
        ops[k]->input_size() > kInputs[k][1]) {
      return std::nullopt;
    }
    if (ops[k]->op_type() == "Gather") {  // Along axis 0 only.
      for (const onnx::AttributeProto& a : ops[k]->attribute()) {
        if (a.name() == "axis" && a.i() != 0) return std::nullopt;
      }
    }
  }
  // An int64 constant [0] of the body or of the graph around it.
  auto is_zero = [&](const std::string& name) {
    const auto it = ints.find(name);
    if (it != ints.end()) return it->second == std::vector<int64_t>{0};
    const Tensor* t = graph.FindConstant(name);
    return t != nullptr && t->type == Tensor::Type::kInt64 && t->ints == std::vector<int64_t>{0};
  };
  auto zero = [&](const onnx::NodeProto& n, int input, const char* attribute) {
    for (const onnx::AttributeProto& a : n.attribute()) {
      if (a.name() == attribute) return a.ints_size() == 1 && a.ints(0) == 0;
    }
    return input < n.input_size() && is_zero(n.input(input));
  };
  const std::string& iter = body.input(0).name();
  const onnx::NodeProto &start = *ops[0], &end = *ops[1], &u_start = *ops[2], &u_end = *ops[3],
                        &slice = *ops[4], &rows = *ops[5], &reduce = *ops[6];
  const std::string mode = reduce.op_type() == "ReduceSum"    ? "sum"
                           : reduce.op_type() == "ReduceMean" ? "mean"
                           : reduce.op_type() == "ReduceMax"  ? "max"
                                                              : "";
  bool keepdims_zero = false;
  for (const onnx::AttributeProto& a : reduce.attribute()) {
    if (a.name() == "keepdims") keepdims_zero = a.i() == 0;
  }
  const bool matched =
      !mode.empty() && keepdims_zero && zero(reduce, 1, "axes") && start.input(1) == iter &&
      end.input(1) == iter && u_start.input(0) == start.output(0) && zero(u_start, 1, "axes") &&
      u_end.input(0) == end.output(0) && zero(u_end, 1, "axes") &&
      slice.input(1) == u_start.output(0) && slice.input(2) == u_end.output(0) &&
      is_zero(slice.input(3)) && rows.input(1) == slice.output(0) &&
      reduce.input(0) == rows.output(0) && body.output(1).name() == reduce.output(0) &&
      body.output(0).name() == ops[7]->output(0);
  if (!matched) return std::nullopt;
  node.attributes["embedding_bag"] = mode;
  node.inputs = {proto.input(0), proto.input(1), rows.input(0),
                 slice.input(0), start.input(0), end.input(0)};
  node.outputs = {proto.output(0)};
  return node;
}

// The value of a Constant node.
absl::StatusOr<Tensor> ConstantValue(const onnx::NodeProto& proto, const std::string& name) {
  if (proto.attribute_size() != 1) {
    return Invalid(absl::StrCat("node '", name, "' (Constant): expected one attribute"));
  }
  const onnx::AttributeProto& a = proto.attribute(0);
  Tensor t;
  if (a.name() == "value" && a.type() == onnx::AttributeProto_AttributeType_TENSOR) {
    return ToTensor(a.t(), absl::StrCat("node '", name, "' (Constant) value"));
  } else if (a.name() == "value_float") {
    t.floats = {a.f()};
  } else if (a.name() == "value_floats") {
    t.floats.assign(a.floats().begin(), a.floats().end());
    t.shape = {a.floats_size()};
  } else if (a.name() == "value_int") {
    t.type = Tensor::Type::kInt64;
    t.ints = {a.i()};
  } else if (a.name() == "value_ints") {
    t.type = Tensor::Type::kInt64;
    t.ints.assign(a.ints().begin(), a.ints().end());
    t.shape = {a.ints_size()};
  } else {
    return Invalid(
        absl::StrCat("node '", name, "' (Constant): attribute '", a.name(), "' unsupported"));
  }
  return t;
}

// Per-sample dims of a graph input's or output's [batch, ...] type.
absl::StatusOr<nn::Dims> SampleDims(const onnx::ValueInfoProto& v) {
  auto refuse = [&](absl::string_view why) {
    return Invalid(absl::StrCat("graph input '", v.name(), "': ", why));
  };
  if (!v.type().has_tensor_type()) return refuse("not a tensor");
  const onnx::TypeProto_Tensor& t = v.type().tensor_type();
  const int type = t.elem_type();
  if (type != onnx::TensorProto_DataType_FLOAT && type != onnx::TensorProto_DataType_INT64 &&
      type != onnx::TensorProto_DataType_INT32) {
    return refuse("neither float (images, features) nor int64/int32 (token ids)");
  }
  const int rank = t.shape().dim_size();
  if (type != onnx::TensorProto_DataType_FLOAT && rank != 2) {
    return refuse(absl::StrCat("integer ids of rank ", rank, " unsupported ([batch, L] only)"));
  }
  if (rank < 2 || rank > 4) {
    return refuse(absl::StrCat("rank ", rank,
                               " unsupported ([batch, C, H, W], [batch, C, L] or "
                               "[batch, F])"));
  }
  int dims[3] = {1, 1, 1};
  for (int i = 1; i < rank; ++i) {
    const onnx::TensorShapeProto_Dimension& d = t.shape().dim(i);
    if (!d.has_dim_value() || d.dim_value() < 1 || d.dim_value() > (1 << 30)) {
      return refuse(absl::StrCat("dimension ", i, " is not a fixed positive size"));
    }
    dims[i - 1] = static_cast<int>(d.dim_value());
  }
  return nn::Dims{dims[0], dims[1], dims[2]};
}

std::string BaseName(const std::string& path) {
  std::string base = path.substr(path.find_last_of('/') + 1);
  if (absl::EndsWith(base, ".onnx")) base.resize(base.size() - 5);
  return base;
}

// The bytes of `path` (errors name it). protobuf refuses messages of 2 GiB or more, so larger
// files are refused before they are read whole.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (file == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat("cannot read '", path, "'"));
  std::string bytes;
  char chunk[1 << 16];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof(chunk), file.get())) > 0) {
    bytes.append(chunk, n);
    if (bytes.size() >= static_cast<size_t>(std::numeric_limits<int>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' is 2 GiB or more: ONNX files with external data unsupported"));
    }
  }
  if (std::ferror(file.get())) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot read '", path, "'"));
  }
  return bytes;
}

absl::Status WithPath(const std::string& path, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

}  // namespace

absl::Status CheckExportedForTraining(const Graph& graph) {
  constexpr absl::string_view kHow =
      "; export it with torch.onnx.export(model, x, FILE, "
      "training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)";
  for (const Node& node : graph.nodes) {
    if (node.op == "BatchNormalization") {
      absl::StatusOr<int64_t> training = IntAttribute(node, "training_mode", 0);
      if (training.ok() && *training != 1 && node.outputs.size() < 2) {
        return Invalid(absl::StrCat(
            "node '", node.name,
            "' (BatchNormalization) was exported for evaluation (no training_mode, no running "
            "statistics outputs): the file holds the model in eval mode, whose Dropout is gone",
            kHow));
      }
    }
    const bool weighted = node.op == "Conv" || node.op == "Gemm" || node.op == "MatMul" ||
                          node.op == "BatchNormalization" || node.op == "LayerNormalization";
    if (!weighted || node.inputs.size() < 2) continue;
    const std::string& weight = node.inputs[1];
    const Tensor* constant = graph.FindConstant(weight);
    if (constant != nullptr && constant->type == Tensor::Type::kFloat &&
        absl::StartsWith(weight, "onnx::")) {
      return Invalid(absl::StrCat(
          "the weight of node '", node.name, "' (", node.op, ") is '", weight,
          "', not a state_dict name: the file was exported with constant folding (in eval mode "
          "torch.onnx.export folds BatchNorm into Conv and drops Dropout), so it would train "
          "another network whose saved weights do not load into the PyTorch model",
          kHow));
    }
  }
  return absl::OkStatus();
}

// InvalidArgument naming `what` (escaped) if `text` holds a control character: names and
// strings from the file go into error messages, which are one line.
absl::Status CheckPrintable(absl::string_view text, absl::string_view what) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
      return Invalid(
          absl::StrCat(what, " '", absl::CHexEscape(text), "' holds a control character"));
    }
  }
  return absl::OkStatus();
}

// Every name and string of `g` that an error message may quote, printable (CheckPrintable).
absl::Status CheckGraphStrings(const onnx::GraphProto& g) {
  for (const onnx::TensorProto& t : g.initializer()) {
    DPTRAIN_RETURN_IF_ERROR(CheckPrintable(t.name(), "initializer name"));
  }
  for (const auto* values : {&g.input(), &g.output(), &g.value_info()}) {
    for (const onnx::ValueInfoProto& v : *values) {
      DPTRAIN_RETURN_IF_ERROR(CheckPrintable(v.name(), "value name"));
    }
  }
  for (const onnx::NodeProto& n : g.node()) {
    DPTRAIN_RETURN_IF_ERROR(CheckPrintable(n.name(), "node name"));
    DPTRAIN_RETURN_IF_ERROR(CheckPrintable(n.op_type(), "op type"));
    DPTRAIN_RETURN_IF_ERROR(CheckPrintable(n.domain(), "op domain"));
    for (const std::string& v : n.input()) DPTRAIN_RETURN_IF_ERROR(CheckPrintable(v, "value name"));
    for (const std::string& v : n.output()) {
      DPTRAIN_RETURN_IF_ERROR(CheckPrintable(v, "value name"));
    }
    for (const onnx::AttributeProto& a : n.attribute()) {
      DPTRAIN_RETURN_IF_ERROR(CheckPrintable(a.name(), "attribute name"));
      if (a.has_g()) DPTRAIN_RETURN_IF_ERROR(CheckGraphStrings(a.g()));  // A Loop's body.
      DPTRAIN_RETURN_IF_ERROR(CheckPrintable(a.s(), "attribute string"));
      for (const std::string& v : a.strings()) {
        DPTRAIN_RETURN_IF_ERROR(CheckPrintable(v, "attribute string"));
      }
      if (a.has_t()) DPTRAIN_RETURN_IF_ERROR(CheckPrintable(a.t().name(), "tensor name"));
    }
  }
  return absl::OkStatus();
}

namespace {

// A graph of several inputs, each [batch, n] (ids, masks, features), takes their concatenation
// along axis 1, in the graph's order, as its one input (kMultiInput), and a Slice per input
// (constant starts, ends, axes) gives each its own value again: the data holds the columns
// side by side. The input holds ids where every input is an integer one; else floats (integer
// values among them are exact below 2^24, and lookups check them at run time). Returns the
// Slice nodes (to run first) and adds their constants to `graph`.
absl::StatusOr<std::vector<Node>> ConcatenateInputs(
    const std::vector<const onnx::ValueInfoProto*>& inputs, Graph& graph) {
  std::vector<Node> slices;
  int64_t columns = 0;
  bool all_ids = true;
  for (const onnx::ValueInfoProto* v : inputs) {
    const onnx::TensorShapeProto& shape = v->type().tensor_type().shape();
    if (shape.dim_size() != 2) {
      std::string text = "[batch";
      for (int i = 1; i < shape.dim_size(); ++i)
        absl::StrAppend(&text, ", ", shape.dim(i).dim_value());
      return Invalid(absl::StrCat(
          "graph input '", v->name(), "' is ", text,
          "]: a model of several inputs takes [batch, n] ones (ids, masks, features), read side "
          "by side from one array"));
    }
    DPTRAIN_ASSIGN_OR_RETURN(const nn::Dims dims, SampleDims(*v));
    Node slice;
    slice.name = absl::StrCat("dptrain_input_", v->name());
    slice.op = "Slice";
    slice.inputs = {kMultiInput};
    for (const auto& [what, value] : {std::pair<const char*, int64_t>{"starts", columns},
                                      {"ends", columns + dims.c},
                                      {"axes", 1}}) {
      Tensor t;
      t.type = Tensor::Type::kInt64;
      t.shape = {1};
      t.ints = {value};
      const std::string constant = absl::StrCat(slice.name, "_", what);
      graph.constants.push_back({constant, std::move(t)});
      slice.inputs.push_back(constant);
    }
    slice.outputs = {v->name()};
    slices.push_back(std::move(slice));
    columns += dims.c;
    all_ids &= v->type().tensor_type().elem_type() != onnx::TensorProto_DataType_FLOAT;
  }
  if (columns > (1 << 30)) return Invalid("the graph inputs hold more than 2^30 values per sample");
  graph.input = kMultiInput;
  graph.input_dims = nn::Dims{static_cast<int>(columns), 1, 1};
  graph.input_rank = 2;
  graph.input_ids = all_ids;
  return slices;
}

}  // namespace

std::vector<InputColumns> ConcatenatedInputs(const Graph& graph) {
  std::vector<InputColumns> out;
  if (graph.input != kMultiInput) return out;
  auto first_int = [&](const std::string& name) -> int64_t {
    for (const NamedConstant& c : graph.constants) {
      if (c.name == name && !c.value.ints.empty()) return c.value.ints[0];
    }
    return -1;
  };
  for (const Node& n : graph.nodes) {
    if (n.op != "Slice" || n.inputs.size() < 3 || n.inputs[0] != kMultiInput) continue;
    out.push_back({n.outputs[0], first_int(n.inputs[1]), first_int(n.inputs[2])});
  }
  return out;
}

absl::StatusOr<Graph> ParseOnnxGraph(absl::string_view bytes, const std::string& name) {
  onnx::ModelProto model;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Invalid("not an ONNX model (the protobuf does not parse; truncated or another format?)");
  }
  if (!model.has_graph()) return Invalid("not an ONNX model (no graph)");
  DPTRAIN_RETURN_IF_ERROR(CheckGraphStrings(model.graph()));
  for (const onnx::OperatorSetIdProto& opset : model.opset_import()) {
    if ((opset.domain().empty() || opset.domain() == "ai.onnx") && opset.version() < 9) {
      return Invalid(absl::StrCat("opset ", opset.version(), " unsupported (9 or later)"));
    }
  }
  const onnx::GraphProto& g = model.graph();
  // The names the import gives the input of several inputs and its slices.
  auto reserved = [](const std::string& n) { return absl::StartsWith(n, "dptrain_input"); };
  std::vector<std::string> all_names;
  for (const onnx::ValueInfoProto& v : g.input()) all_names.push_back(v.name());
  for (const onnx::TensorProto& t : g.initializer()) all_names.push_back(t.name());
  for (const onnx::NodeProto& n : g.node()) {
    all_names.push_back(n.name());
    all_names.insert(all_names.end(), n.output().begin(), n.output().end());
  }
  for (const std::string& n : all_names) {
    if (reserved(n)) {
      return Invalid(absl::StrCat("the name '", n,
                                  "' is reserved (names beginning with "
                                  "'dptrain_input' are the importer's); rename it"));
    }
  }
  Graph graph;
  graph.name = name;

  std::set<std::string> initializer_names;
  for (const onnx::TensorProto& t : g.initializer()) {
    DPTRAIN_ASSIGN_OR_RETURN(Tensor value, ToTensor(t, "initializer"));
    if (!initializer_names.insert(t.name()).second) {
      return Invalid(absl::StrCat("initializer '", t.name(), "' appears twice"));
    }
    // "onnx::..." names are the exporter's own constants, not state_dict entries.
    const bool state = !absl::StartsWith(t.name(), "onnx::");
    graph.constants.push_back({t.name(), std::move(value), state});
  }
  if (g.sparse_initializer_size() > 0) return Invalid("sparse initializers unsupported");

  std::vector<const onnx::ValueInfoProto*> inputs;
  for (const onnx::ValueInfoProto& v : g.input()) {
    if (initializer_names.count(v.name()) == 0) inputs.push_back(&v);
  }
  if (inputs.empty()) return Invalid("no graph input (besides initializers)");
  std::vector<Node> input_slices;  // Several inputs: their slices of the one input.
  if (inputs.size() == 1) {
    graph.input = inputs[0]->name();
    DPTRAIN_ASSIGN_OR_RETURN(graph.input_dims, SampleDims(*inputs[0]));
    graph.input_rank = inputs[0]->type().tensor_type().shape().dim_size();
    graph.input_ids =
        inputs[0]->type().tensor_type().elem_type() != onnx::TensorProto_DataType_FLOAT;
  } else {
    DPTRAIN_ASSIGN_OR_RETURN(input_slices, ConcatenateInputs(inputs, graph));
  }
  if (g.output_size() != 1) {
    return Invalid(absl::StrCat("expected one graph output (the logits), found ", g.output_size()));
  }
  graph.output = g.output(0).name();

  graph.nodes = std::move(input_slices);
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& proto = g.node(i);
    Node node;
    node.name = proto.name().empty() ? absl::StrCat(proto.op_type(), "_", i) : proto.name();
    node.op = proto.domain().empty() || proto.domain() == "ai.onnx"
                  ? proto.op_type()
                  : absl::StrCat(proto.domain(), ".", proto.op_type());
    // The rewrites below read every node's first output.
    if (proto.output_size() < 1 || proto.output(0).empty()) {
      return Invalid(absl::StrCat("node '", node.name, "' (", node.op, "): no output"));
    }
    if (node.op == "Constant") {
      if (proto.output_size() != 1) {
        return Invalid(absl::StrCat("node '", node.name, "' (Constant): expected one output"));
      }
      DPTRAIN_ASSIGN_OR_RETURN(Tensor value, ConstantValue(proto, node.name));
      graph.constants.push_back({proto.output(0), std::move(value)});
      continue;
    }
    if (node.op == "ConstantOfShape") {
      // Its value is a one-element TENSOR attribute: kept as an int64 (shape arithmetic) or a
      // float attribute.
      onnx::NodeProto rest = proto;
      rest.clear_attribute();
      for (const onnx::AttributeProto& a : proto.attribute()) {
        if (a.name() != "value" || a.type() != onnx::AttributeProto_AttributeType_TENSOR) {
          *rest.add_attribute() = a;
          continue;
        }
        DPTRAIN_ASSIGN_OR_RETURN(Tensor value, ToTensor(a.t(), "ConstantOfShape value"));
        if (value.num_elements() != 1) {
          return Invalid(absl::StrCat("node '", node.name, "' (ConstantOfShape): value is ",
                                      value.ToString(), ", expected one element"));
        }
        if (value.type == Tensor::Type::kInt64) {
          node.attributes["value_int"] = value.ints[0];
        } else {
          node.attributes["value_float"] = value.floats[0];
        }
      }
      DPTRAIN_RETURN_IF_ERROR(ReadAttributes(rest, node));
    } else if (node.op == "Loop") {
      std::optional<Node> bag = EmbeddingBagLoop(proto, graph, node);
      if (!bag.has_value()) {
        return Invalid(absl::StrCat("node '", node.name,
                                    "' (Loop): control flow is unsupported (a Loop other than "
                                    "nn.EmbeddingBag's of a 2-D input)"));
      }
      graph.nodes.push_back(*std::move(bag));
      continue;
    } else {
      DPTRAIN_RETURN_IF_ERROR(ReadAttributes(proto, node));
    }
    node.inputs.assign(proto.input().begin(), proto.input().end());
    node.outputs.assign(proto.output().begin(), proto.output().end());
    graph.nodes.push_back(std::move(node));
  }
  DPTRAIN_RETURN_IF_ERROR(FoldShapeConstants(graph));
  FuseEmbeddingBag(graph);
  UnsortPackedSequences(graph);
  FuseTorchRecurrent(graph);
  FuseLinear(graph);
  ViewStateOperands(graph);
  SinkChannelsLast(graph);
  FuseChannelShuffle(graph);
  FuseLayerNorm(graph);
  SplitToSlices(graph);
  EinsumToMatMul(graph);
  DPTRAIN_RETURN_IF_ERROR(CheckExportedForTraining(graph));
  MarkPaddingRows(graph);
  return graph;
}

absl::Status MarkBuffers(Graph& graph, const std::vector<std::string>& names) {
  // The ops that read a tensor of the model as a plain operand (learned unless a buffer); a
  // layer's weight (Conv, Gemm, BatchNormalization, ...) is its parameter whatever the flag.
  static const std::set<std::string> kPlainReaders = {
      "Add", "Sub",  "Mul", "Div",    "PRelu", "InstanceNormalization",
      "Pow", "Clip", "Pad", "Dropout"};
  std::set<std::string> read;
  for (const Node& node : graph.nodes) {
    if (kPlainReaders.count(node.op) == 0) continue;
    for (const std::string& input : node.inputs) read.insert(input);
  }
  std::vector<NamedConstant*> marked;
  for (const std::string& name : names) {
    bool found = false;
    for (NamedConstant& c : graph.constants) {
      if (c.name != name || !c.state) continue;
      marked.push_back(&c);
      found = true;
    }
    if (!found) {
      return Invalid(absl::StrCat("'", name,
                                  "' is not an initializer of the model (a tensor "
                                  "of its state_dict), so it cannot be marked as a buffer"));
    }
    if (read.count(name) == 0) {
      return Invalid(absl::StrCat("'", name,
                                  "' is read by no Add, Sub, Mul, Div, PRelu or "
                                  "InstanceNormalization (a layer's weight is its parameter): "
                                  "marking it as a buffer would change nothing"));
    }
  }
  for (NamedConstant* c : marked) c->fixed = true;  // All valid: nothing half done.
  return absl::OkStatus();
}

std::vector<std::string> MarkPaddingRows(Graph& graph) {
  for (Node& node : graph.nodes) {
    if (node.op != "Gather" || node.inputs.size() != 2 || node.attributes.count("padding_idx") ||
        graph.FindConstant(node.inputs[1]) != nullptr) {
      continue;
    }
    const NamedConstant* table = graph.FindNamedConstant(node.inputs[0]);
    if (table == nullptr || !table->state || table->value.type != Tensor::Type::kFloat ||
        table->value.shape.size() != 2 || table->value.shape[1] < 1) {
      continue;
    }
    const int64_t rows = table->value.shape[0], width = table->value.shape[1];
    int64_t zero_row = -1, zero_rows = 0;
    for (int64_t r = 0; r < rows && zero_rows < 2; ++r) {
      const float* row = table->value.floats.data() + r * width;
      if (std::all_of(row, row + width, [](float v) { return v == 0.0f; })) {
        zero_row = r;
        ++zero_rows;
      }
    }
    if (zero_rows == 1) node.attributes["padding_idx"] = zero_row;
  }
  return PaddingRows(graph);
}

std::vector<std::string> PaddingRows(const Graph& graph) {
  std::set<std::string> marked;
  for (const Node& node : graph.nodes) {
    const auto it = node.attributes.find("padding_idx");
    if (node.op != "Gather" || it == node.attributes.end() || node.inputs.empty()) continue;
    marked.insert(absl::StrCat(node.inputs[0], " (row ", std::get<int64_t>(it->second), ")"));
  }
  return std::vector<std::string>(marked.begin(), marked.end());
}

void ClearPaddingRows(Graph& graph) {
  for (Node& node : graph.nodes) {
    if (node.op == "Gather") node.attributes.erase("padding_idx");
  }
}

std::vector<std::string> LearnedOperands(const Graph& graph) {
  std::set<std::string> read;
  for (const Node& node : graph.nodes) {
    if (node.op != "Add" && node.op != "Sub" && node.op != "Mul" && node.op != "Div") continue;
    for (const std::string& input : node.inputs) read.insert(input);
  }
  std::vector<std::string> learned;
  for (const NamedConstant& c : graph.constants) {
    if (c.state && !c.fixed && c.value.type == Tensor::Type::kFloat && read.count(c.name) > 0) {
      learned.push_back(c.name);
    }
  }
  return learned;
}

absl::Status CheckOpsSupported(const Graph& graph, const OpRegistry& registry) {
  for (const Node& node : graph.nodes) {
    // Evaluated when the model is built where their inputs are constants (else refused then).
    if (node.op == "Shape" || IsShapeArithmetic(node.op) || IsFoldableOnConstants(node.op)) {
      continue;
    }
    DPTRAIN_RETURN_IF_ERROR(CheckOpSupported(registry, node));
  }
  return absl::OkStatus();
}

absl::StatusOr<Graph> ReadOnnxGraph(const std::string& path, const OpRegistry& registry) {
  absl::StatusOr<std::string> bytes = ReadWholeFile(path);
  if (!bytes.ok()) return bytes.status();  // Names the path already.
  absl::StatusOr<Graph> graph = ParseOnnxGraph(*bytes, BaseName(path));
  if (!graph.ok()) return WithPath(path, graph.status());
  if (absl::Status s = CheckOpsSupported(*graph, registry); !s.ok()) return WithPath(path, s);
  return graph;
}

absl::StatusOr<std::unique_ptr<nn::Model>> LoadOnnxModel(const std::string& path,
                                                         const OnnxModelOptions& options) {
  const OpRegistry registry = BuiltinOps();
  DPTRAIN_ASSIGN_OR_RETURN(Graph graph, ReadOnnxGraph(path, registry));
  if (absl::Status s = MarkBuffers(graph, options.buffers); !s.ok()) return WithPath(path, s);
  GraphModelOptions model;
  model.name = graph.name;
  model.loss = options.loss;
  model.label_smoothing = options.label_smoothing;
  model.class_weights = options.class_weights;
  model.optimizer = options.optimizer;
  model.seed = options.seed;
  model.dropout = options.dropout;
  model.threads = options.threads;
  model.dense_gemm = options.dense_gemm;
  model.conv_algorithm = options.conv_algorithm;
  absl::StatusOr<std::unique_ptr<nn::Model>> made = CreateGraphModel(graph, registry, model);
  if (!made.ok()) return WithPath(path, made.status());
  return made;
}

}  // namespace graph
}  // namespace dptrain
