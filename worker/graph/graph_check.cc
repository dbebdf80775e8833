#include "worker/graph/graph_check.h"

#include <algorithm>
#include <memory>
#include <random>
#include <utility>

#include "gtest/gtest.h"
#include "worker/graph/executor.h"
#include "worker/nn/layer_check.h"

namespace dptrain {
namespace graph {
namespace {

using nn::Dot;
using nn::ExpectAllClose;
using nn::PickIndices;
using nn::RandomVector;

template <typename T>
std::vector<double> ToDouble(const T* data, int64_t n) {
  return std::vector<double>(data, data + n);
}

}  // namespace

Node MakeNode(const std::string& op, const std::string& name, std::vector<std::string> inputs,
              std::vector<std::string> outputs, std::map<std::string, Attribute> attributes) {
  return Node{op, name, std::move(attributes), std::move(inputs), std::move(outputs)};
}

NamedConstant RandomConstant(const std::string& name, std::vector<int64_t> shape, uint64_t seed,
                             double scale, double offset) {
  Tensor t;
  t.shape = std::move(shape);
  for (double v : RandomVector(t.num_elements(), scale, seed)) {
    t.floats.push_back(static_cast<float>(v + offset));
  }
  return {name, std::move(t)};
}

NamedConstant IntConstant(const std::string& name, std::vector<int64_t> values) {
  Tensor t;
  t.type = Tensor::Type::kInt64;
  t.shape = {static_cast<int64_t>(values.size())};
  t.ints = std::move(values);
  return {name, std::move(t)};
}

NamedConstant FloatScalar(const std::string& name, float value) {
  Tensor t;
  t.floats = {value};
  return {name, std::move(t)};
}

Graph Chain(nn::Dims dims, std::vector<Node> nodes, std::vector<NamedConstant> constants) {
  Graph g;
  g.name = "test";
  g.input = "x";
  g.input_dims = dims;
  g.output = nodes.back().outputs[0];
  g.nodes = std::move(nodes);
  g.constants = std::move(constants);
  return g;
}

void CheckGraphGradients(const Graph& graph, const OpRegistry& registry,
                         const GraphCheckOptions& options) {
  absl::StatusOr<std::unique_ptr<Executor<double>>> made_d =
      Executor<double>::Create(graph, registry);
  ASSERT_TRUE(made_d.ok()) << made_d.status();
  absl::StatusOr<std::unique_ptr<Executor<float>>> made_f =
      Executor<float>::Create(graph, registry);
  ASSERT_TRUE(made_f.ok()) << made_f.status();
  Executor<double>& d = **made_d;
  Executor<float>& f = **made_f;
  const int batch = options.batch;
  const int64_t in_size = batch * d.input_dims().size();
  const int64_t out_size = batch * d.output_dims().size();

  std::vector<double> x = RandomVector(in_size, 1.0, options.seed);
  std::vector<double> g = RandomVector(out_size, 1.0, options.seed + 1);
  std::vector<double> params = d.initial_params();
  std::vector<double> grads(params.size(), -7.0);  // Backward must overwrite every one.
  std::vector<double> buffers = d.initial_buffers();
  d.Bind(params.data(), grads.data(), buffers.data());
  std::vector<float> xf(x.begin(), x.end()), gf(g.begin(), g.end());
  std::vector<float> paramsf = f.initial_params();
  std::vector<float> gradsf(paramsf.size(), -7.0f);
  std::vector<float> buffersf = f.initial_buffers();
  f.Bind(paramsf.data(), gradsf.data(), buffersf.data());

  // Double: forward, backward, then finite differences of L = sum(g * y).
  nn::TensorRef<double> y = ForwardOk(d, x.data(), batch, options.training);
  ASSERT_EQ(y.size(), out_size);
  const std::vector<double> yd = ToDouble(y.data, y.size());
  nn::TensorRef<double> dx = d.Backward({g.data(), batch, d.output_dims()}, true);
  ASSERT_EQ(dx.size(), in_size);
  const std::vector<double> dxd = ToDouble(dx.data, dx.size());
  const std::vector<double> gradsd = grads;

  auto check = [&](const std::string& what, std::vector<double>& values,
                   const std::vector<double>& analytic, int64_t begin, int64_t size) {
    std::vector<double> numeric, expected;
    for (int64_t i : PickIndices(size, options.max_fd_checks, options.seed + 3)) {
      double& v = values[begin + i];
      const double saved = v;
      v = saved + options.fd_step;
      const double plus = Dot(ForwardOk(d, x.data(), batch, options.training), g);
      v = saved - options.fd_step;
      const double minus = Dot(ForwardOk(d, x.data(), batch, options.training), g);
      v = saved;
      numeric.push_back((plus - minus) / (2 * options.fd_step));
      expected.push_back(analytic[begin + i]);
    }
    ExpectAllClose(what + " vs finite differences", expected, numeric, options.fd_tolerance);
  };
  check("d/d input", x, dxd, 0, in_size);
  for (const nn::ParamInfo& p : d.params()) {
    check("d/d " + p.name, params, gradsd, p.offset, p.size);
  }

  // Float against double, from the same starting buffers.
  nn::TensorRef<float> yf = ForwardOk(f, xf.data(), batch, options.training);
  ExpectAllClose("float forward", ToDouble(yf.data, yf.size()), yd, options.float_tolerance);
  nn::TensorRef<float> dxf = f.Backward({gf.data(), batch, f.output_dims()}, true);
  ExpectAllClose("float d/d input", ToDouble(dxf.data, dxf.size()), dxd, options.float_tolerance);
  for (const nn::ParamInfo& p : f.params()) {
    ExpectAllClose(
        "float d/d " + p.name, ToDouble(gradsf.data() + p.offset, p.size),
        std::vector<double>(gradsd.begin() + p.offset, gradsd.begin() + p.offset + p.size),
        options.float_tolerance);
  }
}

}  // namespace graph
}  // namespace dptrain
