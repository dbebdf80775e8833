#include "worker/nn/layer_check.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace dptrain {
namespace nn {
namespace {

template <typename To, typename From>
std::vector<To> Cast(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}

template <typename T>
std::vector<double> ToVector(TensorRef<T> t) {
  return std::vector<double>(t.data, t.data + t.size());
}

}  // namespace

double Dot(TensorRef<double> y, const std::vector<double>& g) {
  double sum = 0;
  for (int64_t i = 0; i < y.size(); ++i) sum += y.data[i] * g[i];
  return sum;
}

// Indices of at most `limit` elements of [0, n), all of them if n <= limit.
std::vector<int64_t> PickIndices(int64_t n, int limit, uint64_t seed) {
  std::vector<int64_t> all(n);
  for (int64_t i = 0; i < n; ++i) all[i] = i;
  if (n <= limit) return all;
  std::mt19937_64 rng(seed);
  for (int i = 0; i < limit; ++i) std::swap(all[i], all[i + rng() % (n - i)]);
  all.resize(limit);
  return all;
}

namespace {

// Central differences of L = sum(g * layer(x)) with respect to `values` (the input or the
// parameters the layer is bound to), at the chosen indices.
void ExpectMatchesFiniteDifferences(const std::string& what, Layer<double>& layer,
                                    std::vector<double>& x, const LayerCheckOptions& options,
                                    const std::vector<double>& g, std::vector<double>& values,
                                    const std::vector<double>& analytic) {
  const std::vector<int64_t> picked =
      PickIndices(static_cast<int64_t>(values.size()), options.max_fd_checks, options.seed + 7);
  std::vector<double> numeric, expected;
  for (int64_t i : picked) {
    const double saved = values[i];
    values[i] = saved + options.fd_step;
    const double plus =
        Dot(layer.Forward({}, {x.data(), options.batch, options.input}, options.training), g);
    values[i] = saved - options.fd_step;
    const double minus =
        Dot(layer.Forward({}, {x.data(), options.batch, options.input}, options.training), g);
    values[i] = saved;
    numeric.push_back((plus - minus) / (2 * options.fd_step));
    expected.push_back(analytic[i]);
  }
  ExpectAllClose(what + " vs finite differences", expected, numeric, options.fd_tolerance);
}

}  // namespace

std::vector<double> RandomVector(int64_t n, double scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> v(n);
  for (double& x : v) x = scale * (2.0 * static_cast<double>(rng() >> 11) * 0x1.0p-53 - 1.0);
  return v;
}

void ExpectAllClose(const std::string& what, const std::vector<double>& actual,
                    const std::vector<double>& expected, double tolerance) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double scale = 1e-6;  // Tensors that are all (nearly) zero are compared absolutely.
  for (double e : expected) scale = std::max(scale, std::abs(e));
  int64_t worst = -1, failures = 0;
  double worst_error = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double error = std::abs(actual[i] - expected[i]);
    if (!(error <= tolerance * scale)) ++failures;  // Also counts NaN.
    if (!(error <= worst_error)) {
      worst_error = error;
      worst = static_cast<int64_t>(i);
    }
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << actual.size()
                         << " elements off; worst at " << worst << ": " << actual[worst] << " vs "
                         << expected[worst] << " (tolerance " << tolerance * scale << ")";
}

void CheckLayer(Layer<double>& d, Layer<float>& f, const LayerCheckOptions& options,
                const ReferenceForward& reference) {
  absl::StatusOr<Dims> out_dims = d.OutputDims(options.input);
  ASSERT_TRUE(out_dims.ok()) << out_dims.status();
  int64_t num_params = 0;
  for (const TensorSpec& spec : d.ParamSpecs()) num_params += spec.size();
  const int batch = options.batch;
  const int64_t out_size = batch * out_dims->size();

  std::vector<double> x =
      RandomVector(batch * options.input.size(), options.input_scale, options.seed);
  std::vector<double> params = RandomVector(num_params, options.param_scale, options.seed + 1);
  std::vector<double> g = RandomVector(out_size, 1.0, options.seed + 2);
  std::vector<double> grads(num_params, 0.0);
  std::vector<float> xf = Cast<float>(x), paramsf = Cast<float>(params), gf = Cast<float>(g);
  std::vector<float> gradsf(num_params, 0.0f);
  d.BindParams(params.data(), grads.data());
  f.BindParams(paramsf.data(), gradsf.data());
  int64_t num_buffers = 0;
  for (const TensorSpec& spec : d.BufferSpecs()) num_buffers += spec.size();
  std::vector<double> buffers(num_buffers);
  d.InitBuffers(buffers.data());
  if (options.init_buffers) options.init_buffers(buffers);
  std::vector<float> buffersf = Cast<float>(buffers);
  d.BindBuffers(buffers.data());
  f.BindBuffers(buffersf.data());

  // A first step on a larger batch of other data leaves stale values in every reused buffer, so
  // that a layer that forgets to overwrite part of a buffer fails the checks below.
  {
    const std::vector<double> x0 = RandomVector((batch + 1) * options.input.size(), 3.0, 99);
    const std::vector<double> g0 = RandomVector((batch + 1) * out_dims->size(), 3.0, 98);
    const std::vector<float> x0f = Cast<float>(x0), g0f = Cast<float>(g0);
    d.Forward({}, {x0.data(), batch + 1, options.input}, options.training);
    d.Backward({}, {g0.data(), batch + 1, *out_dims}, true);
    f.Forward(options.float_context, {x0f.data(), batch + 1, options.input}, options.training);
    f.Backward(options.float_context, {g0f.data(), batch + 1, *out_dims}, true);
  }

  // Forward: double against the reference, float against double.
  TensorRef<double> y = d.Forward({}, {x.data(), batch, options.input}, options.training);
  ASSERT_EQ(y.batch, batch);
  ASSERT_EQ(y.dims, *out_dims);
  const std::vector<double> yd = ToVector(y);
  if (reference) ExpectAllClose("forward vs reference", yd, reference(x, params, batch), 1e-12);
  TensorRef<float> yf =
      f.Forward(options.float_context, {xf.data(), batch, options.input}, options.training);
  ASSERT_EQ(yf.dims, *out_dims);
  ExpectAllClose("float forward", ToVector(yf), yd, options.float_tolerance);

  // Backward twice: parameter gradients are overwritten, not accumulated.
  std::vector<double> dx;
  for (int round = 0; round < 2; ++round) {
    TensorRef<double> dxd = d.Backward({}, {g.data(), batch, *out_dims}, true);
    ASSERT_EQ(dxd.batch, batch);
    ASSERT_EQ(dxd.dims, options.input);
    if (round == 1) ExpectAllClose("second backward", ToVector(dxd), dx, 0.0);
    dx = ToVector(dxd);
  }
  const std::vector<double> param_grads = grads;
  d.Backward({}, {g.data(), batch, *out_dims}, true);
  ExpectAllClose("repeated parameter gradients", grads, param_grads, 0.0);
  // Without an input gradient the parameter gradients must come out the same.
  EXPECT_EQ(d.Backward({}, {g.data(), batch, *out_dims}, false).data, nullptr);
  ExpectAllClose("parameter gradients without input gradient", grads, param_grads, 0.0);

  TensorRef<float> dxf = f.Backward(options.float_context, {gf.data(), batch, *out_dims}, true);
  ExpectAllClose("float input gradient", ToVector(dxf), dx, options.float_tolerance);
  ExpectAllClose("float parameter gradients", Cast<double>(gradsf), param_grads,
                 options.float_tolerance);

  ExpectMatchesFiniteDifferences("input gradient", d, x, options, g, x, dx);
  ExpectMatchesFiniteDifferences("parameter gradients", d, x, options, g, params, param_grads);
}

}  // namespace nn
}  // namespace dptrain
