#include "worker/graph/builtin_models.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/graph/graph_model.h"
#include "worker/graph/op_registry.h"

namespace dptrain {
namespace graph {
namespace {

// Writes a graph node by node; each node's output is its name and becomes the current value.
class Builder {
 public:
  Builder(std::string name, nn::Dims input) {
    graph_.name = std::move(name);
    graph_.input = "input";
    graph_.input_dims = input;
    current_ = graph_.input;
  }

  const std::string& current() const { return current_; }

  // A learnable constant (zeros until BuiltinGraph draws the weights), in layout order.
  std::string Param(const std::string& name, std::vector<int64_t> shape) {
    param_specs_.push_back({name, shape});
    return Constant(name, std::move(shape), 0.0f);
  }
  // A buffer's initial value, all `fill`.
  std::string Constant(const std::string& name, std::vector<int64_t> shape, float fill) {
    Tensor t;
    t.shape = std::move(shape);
    t.floats.assign(t.num_elements(), fill);
    graph_.constants.push_back({name, std::move(t)});
    return name;
  }

  // Node `name` running `op` on `inputs` (the current value when empty).
  const std::string& Op(const std::string& op, const std::string& name,
                        std::vector<std::string> inputs = {},
                        std::map<std::string, Attribute> attributes = {}) {
    if (inputs.empty()) inputs.push_back(current_);
    graph_.nodes.push_back({op, name, std::move(attributes), std::move(inputs), {name}});
    current_ = name;
    return current_;
  }

  // A convolution's weight and bias, declared now (layout order), for ConvOp.
  std::vector<std::string> ConvTensors(const std::string& name, int64_t in, int64_t out,
                                       int64_t k) {
    return {Param(name + ".weight", {out, in, k, k}), Param(name + ".bias", {out})};
  }
  // Conv node `name` on `x` with `tensors` (ConvTensors), a square kernel `k`, `stride`, `pad`.
  const std::string& ConvOp(const std::string& name, const std::string& x,
                            const std::vector<std::string>& tensors, int64_t k, int64_t stride,
                            int64_t pad) {
    return Op("Conv", name, {x, tensors[0], tensors[1]},
              {{"kernel_shape", std::vector<int64_t>{k, k}},
               {"strides", std::vector<int64_t>{stride, stride}},
               {"pads", std::vector<int64_t>{pad, pad, pad, pad}}});
  }
  const std::string& Conv(const std::string& name, int64_t in, int64_t out, int64_t k,
                          int64_t stride, int64_t pad) {
    const std::vector<std::string> tensors = ConvTensors(name, in, out, k);
    return ConvOp(name, current_, tensors, k, stride, pad);
  }
  // nn.Linear: Gemm with transB=1.
  const std::string& Linear(const std::string& name, int64_t in, int64_t out) {
    const std::string w = Param(name + ".weight", {out, in});
    const std::string b = Param(name + ".bias", {out});
    return Op("Gemm", name, {current_, w, b}, {{"transB", int64_t{1}}});
  }
  // BatchNorm2d's four tensors (scale, bias, running mean 0, running variance 1), named after
  // `prefix`, in state_dict order.
  std::vector<std::string> BatchNormTensors(const std::string& prefix, int64_t c) {
    return {Param(prefix + ".weight", {c}), Param(prefix + ".bias", {c}),
            Constant(prefix + ".running_mean", {c}, 0.0f),
            Constant(prefix + ".running_var", {c}, 1.0f)};
  }
  const std::string& BatchNormOp(const std::string& name, const std::vector<std::string>& tensors) {
    std::vector<std::string> inputs = {current_};
    inputs.insert(inputs.end(), tensors.begin(), tensors.end());
    return Op("BatchNormalization", name, std::move(inputs),
              {{"epsilon", 1e-5f}, {"momentum", 0.9f}});
  }

  const std::vector<nn::TensorSpec>& param_specs() const { return param_specs_; }
  Graph Finish() && {
    graph_.output = current_;
    return std::move(graph_);
  }

 private:
  Graph graph_;
  std::string current_;
  std::vector<nn::TensorSpec> param_specs_;
};

// d2l's Residual named `p` (nn::Residual) on the current value. Its constants are declared in
// its state_dict order (conv1, conv2, conv3, bn1, bn2), fused or not, so both lay out alike.
void AddResidual(Builder& b, const std::string& p, int64_t in, int64_t out, bool use_1x1conv,
                 int64_t stride, bool fused) {
  const std::string x = b.current();
  const std::vector<std::string> conv1 = b.ConvTensors(p + ".conv1", in, out, 3);
  const std::vector<std::string> conv2 = b.ConvTensors(p + ".conv2", out, out, 3);
  const std::vector<std::string> conv3 =
      use_1x1conv ? b.ConvTensors(p + ".conv3", in, out, 1) : std::vector<std::string>{"", ""};
  const std::vector<std::string> bn1 = b.BatchNormTensors(p + ".bn1", out);
  const std::vector<std::string> bn2 = b.BatchNormTensors(p + ".bn2", out);
  if (fused) {
    b.Op("Residual", p,
         {x, conv1[0], conv1[1], conv2[0], conv2[1], conv3[0], conv3[1], bn1[0], bn1[1], bn2[0],
          bn2[1], bn1[2], bn1[3], bn2[2], bn2[3]},
         {{"stride", stride}});
    return;
  }
  b.ConvOp(p + ".conv1", x, conv1, 3, stride, 1);
  b.BatchNormOp(p + ".bn1", bn1);
  b.Op("Relu", p + ".relu1");
  b.ConvOp(p + ".conv2", b.current(), conv2, 3, 1, 1);
  const std::string main = b.BatchNormOp(p + ".bn2", bn2);
  const std::string shortcut = use_1x1conv ? b.ConvOp(p + ".conv3", x, conv3, 1, stride, 0) : x;
  b.Op("Add", p + ".add", {main, shortcut});
  b.Op("Relu", p);
}

// The body of a d2l ResNet (architectures.h's BuildResNet, layer for layer).
void AddResNet(Builder& b, const nn::ResNetConfig& config, bool fused) {
  const int64_t c0 = config.channels[0];
  b.Conv("0.0", config.input.c, c0, 3, 1, 1);
  b.BatchNormOp("0.1", b.BatchNormTensors("0.1", c0));
  b.Op("Relu", "0.2");
  for (size_t s = 0; s < config.channels.size(); ++s) {
    const int64_t out = config.channels[s];
    for (int r = 0; r < config.residuals; ++r) {
      const std::string name = absl::StrCat(1 + s, ".", r);
      if (r == 0 && s > 0) {
        AddResidual(b, name, config.channels[s - 1], out, true, 2, fused);
      } else {
        AddResidual(b, name, out, out, false, 1, fused);
      }
    }
  }
  const size_t next = 1 + config.channels.size();
  b.Op("GlobalAveragePool", std::to_string(next));
  b.Op("Flatten", std::to_string(next + 1));
  b.Linear(std::to_string(next + 2), config.channels.back(), config.classes);
}

}  // namespace

absl::StatusOr<Graph> ResNetGraph(const nn::ResNetConfig& config, bool fused_residuals) {
  if (config.channels.empty() || config.residuals < 1 || config.classes < 1) {
    return absl::InvalidArgumentError("ResNet: needs channels, residuals >= 1 and classes >= 1");
  }
  Builder b("resnet", config.input);
  AddResNet(b, config, fused_residuals);
  return std::move(b).Finish();
}

absl::StatusOr<Graph> BuiltinGraph(const BuiltinGraphOptions& options) {
  DPTRAIN_RETURN_IF_ERROR(nn::CheckNetworkShape(options.name, options.shape));
  const nn::Dims in = options.shape.input;
  const int64_t classes = options.shape.classes;
  Builder b(options.name, in);
  if (options.name == "mlp") {
    b.Op("Flatten", "0");
    b.Linear("1", in.size(), 256);
    b.Op("Relu", "2");
    b.Linear("3", 256, classes);
  } else if (options.name == "lenet") {
    const int64_t h = (in.h / 2 - 4) / 2, w = (in.w / 2 - 4) / 2;
    const std::map<std::string, Attribute> pool = {{"kernel_shape", std::vector<int64_t>{2, 2}},
                                                   {"strides", std::vector<int64_t>{2, 2}}};
    b.Conv("0", in.c, 6, 5, 1, 2);
    b.Op("Sigmoid", "1");
    b.Op("AveragePool", "2", {}, pool);
    b.Conv("3", 6, 16, 5, 1, 0);
    b.Op("Sigmoid", "4");
    b.Op("AveragePool", "5", {}, pool);
    b.Op("Flatten", "6");
    b.Linear("7", 16 * h * w, 120);
    b.Op("Sigmoid", "8");
    b.Linear("9", 120, 84);
    b.Op("Sigmoid", "10");
    b.Linear("11", 84, classes);
  } else {  // resnet18
    AddResNet(b, nn::ResNetConfig{in, {64, 128, 256, 512}, 2, options.shape.classes},
              options.fused_residuals);
  }
  const std::vector<nn::TensorSpec> specs = b.param_specs();
  Graph graph = std::move(b).Finish();
  int64_t total = 0;
  for (const nn::TensorSpec& spec : specs) total += spec.size();
  std::vector<float> weights(total);
  DPTRAIN_RETURN_IF_ERROR(
      nn::InitializeParams(options.name, specs, options.seed, weights.data(), options.init));
  // The params are the constants named in `specs`, in that order.
  const float* from = weights.data();
  size_t next = 0;
  for (NamedConstant& c : graph.constants) {
    if (next < specs.size() && c.name == specs[next].name) {
      std::copy(from, from + c.value.floats.size(), c.value.floats.begin());
      from += c.value.floats.size();
      ++next;
    }
  }
  return graph;
}

absl::StatusOr<Graph> BuiltinGraph(const nn::ModelOptions& options) {
  BuiltinGraphOptions g;
  g.name = options.name;
  g.shape = options.shape;
  g.seed = options.seed;
  g.init = options.init;
  return BuiltinGraph(g);
}

absl::StatusOr<std::unique_ptr<nn::Model>> CreateBuiltinModel(const nn::ModelOptions& options) {
  DPTRAIN_ASSIGN_OR_RETURN(const Graph graph, BuiltinGraph(options));
  GraphModelOptions m;
  m.name = options.name;
  m.optimizer = options.optimizer;
  m.label_smoothing = options.label_smoothing;
  m.class_weights = options.class_weights;
  m.seed = options.seed;
  m.threads = options.threads;
  m.dense_gemm = options.dense_gemm;
  m.conv_algorithm = options.conv_algorithm;
  return CreateGraphModel(graph, BuiltinOps(), m);
}

}  // namespace graph
}  // namespace dptrain
