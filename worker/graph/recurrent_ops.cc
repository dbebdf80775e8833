#include "worker/graph/recurrent_ops.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/graph/any_shape_internal.h"
#include "worker/nn/gemm.h"

namespace dptrain {
namespace graph {
namespace any_shape_internal {
namespace {

template <typename T>
T Sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// One nn.LSTM layer (recurrent_ops.h). Gate order: input, forget, cell, output.
template <typename T>
class TorchLstmNode final : public AnyShapeNode<T> {
 public:
  // `tensors`: weight_ih, weight_hh, then bias_ih and bias_hh where the layer has biases.
  TorchLstmNode(std::vector<Operand<T>> tensors, int64_t steps, int64_t in, int64_t hidden,
                int output, ValueShape out)
      : AnyShapeNode<T>(std::move(out)),
        tensors_(std::move(tensors)),
        steps_(steps),
        in_(in),
        hidden_(hidden),
        output_index_(output) {
    // Counted now: an Operand reads the graph's constant only while the executor is built.
    for (const Operand<T>& t : tensors_) {
      params_per_tensor_.push_back(t.Params().size());
      buffers_per_tensor_.push_back(t.Buffers().size());
    }
  }

  std::vector<NodeTensorSpec> Params() const override {
    std::vector<NodeTensorSpec> all;
    for (const Operand<T>& t : tensors_) {
      for (NodeTensorSpec& s : t.Params()) all.push_back(std::move(s));
    }
    return all;
  }
  std::vector<NodeTensorSpec> Buffers() const override {
    std::vector<NodeTensorSpec> all;
    for (const Operand<T>& t : tensors_) {
      for (NodeTensorSpec& s : t.Buffers()) all.push_back(std::move(s));
    }
    return all;
  }
  void BindParams(absl::Span<const T* const> params, absl::Span<T* const> grads) override {
    size_t at = 0;
    for (size_t k = 0; k < tensors_.size(); ++k) {
      const size_t n = params_per_tensor_[k];
      tensors_[k].BindParams(params.subspan(at, n), grads.subspan(at, n));
      at += n;
    }
  }
  void BindBuffers(absl::Span<T* const> buffers) override {
    size_t at = 0;
    for (size_t k = 0; k < tensors_.size(); ++k) {
      const size_t n = buffers_per_tensor_[k];
      tensors_[k].BindBuffers(buffers.subspan(at, n));
      at += n;
    }
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    x_ = x.data;
    batch_ = x.batch;
    const int64_t b = batch_, h = hidden_, g = 4 * hidden_, state = b * h;
    T* gates = EnsureSize(gates_, steps_ * b * g);
    T* c = EnsureSize(c_, (steps_ + 1) * state);
    T* hs = EnsureSize(h_, (steps_ + 1) * state);
    T* tanh_c = EnsureSize(tanh_c_, steps_ * state);
    std::fill(c, c + state, T(0));
    std::fill(hs, hs + state, T(0));
    const T* w_ih = tensors_[0].data();
    const T* w_hh = tensors_[1].data();
    for (int64_t t = 0; t < steps_; ++t) {
      T* pre = gates + t * b * g;
      nn::Gemm(false, true, static_cast<int>(b), static_cast<int>(g), static_cast<int>(in_), T(1),
               x.data + t * b * in_, static_cast<int>(in_), w_ih, static_cast<int>(in_), T(0), pre,
               static_cast<int>(g));
      nn::Gemm(false, true, static_cast<int>(b), static_cast<int>(g), static_cast<int>(h), T(1),
               hs + t * state, static_cast<int>(h), w_hh, static_cast<int>(h), T(1), pre,
               static_cast<int>(g));
      for (int64_t n = 0; n < b; ++n) {
        T* row = pre + n * g;
        if (tensors_.size() == 4) {
          const T* b_ih = tensors_[2].data();
          const T* b_hh = tensors_[3].data();
          for (int64_t j = 0; j < g; ++j) row[j] += b_ih[j] + b_hh[j];
        }
        const T* c_prev = c + t * state + n * h;
        T* c_next = c + (t + 1) * state + n * h;
        T* h_next = hs + (t + 1) * state + n * h;
        T* tc = tanh_c + t * state + n * h;
        for (int64_t j = 0; j < h; ++j) {
          const T i = Sigmoid(row[j]), f = Sigmoid(row[h + j]), cell = std::tanh(row[2 * h + j]),
                  o = Sigmoid(row[3 * h + j]);
          row[j] = i;
          row[h + j] = f;
          row[2 * h + j] = cell;
          row[3 * h + j] = o;
          c_next[j] = f * c_prev[j] + i * cell;
          tc[j] = std::tanh(c_next[j]);
          h_next[j] = o * tc[j];
        }
      }
    }
    if (output_index_ == 0) return {hs + state, x.batch, this->output_dims()};
    return {(output_index_ == 1 ? hs : c) + steps_ * state, x.batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    const int64_t b = batch_, h = hidden_, g = 4 * hidden_, state = b * h;
    const T* dy = grad_output.data;
    T* dh = EnsureSize(dh_, state);
    T* dc = EnsureSize(dc_, state);
    T* dpre = EnsureSize(dpre_, b * g);
    std::fill(dh, dh + state, T(0));
    std::fill(dc, dc + state, T(0));
    if (output_index_ == 1) std::copy(dy, dy + state, dh);
    if (output_index_ == 2) std::copy(dy, dy + state, dc);
    T* dx = need_input_grad[0] ? EnsureSize(grad_input_, steps_ * b * in_) : nullptr;
    for (Operand<T>& t : tensors_) {
      if (T* grad = t.grad(); grad != nullptr) std::fill(grad, grad + t.size(), T(0));
    }
    const T* w_ih = tensors_[0].data();
    const T* w_hh = tensors_[1].data();
    for (int64_t t = steps_ - 1; t >= 0; --t) {
      const T* gates = gates_.data() + t * b * g;
      for (int64_t n = 0; n < b; ++n) {
        const T* row = gates + n * g;
        const T* c_prev = c_.data() + t * state + n * h;
        const T* tc = tanh_c_.data() + t * state + n * h;
        T* dh_n = dh + n * h;
        T* dc_n = dc + n * h;
        T* d = dpre + n * g;
        for (int64_t j = 0; j < h; ++j) {
          const T i = row[j], f = row[h + j], cell = row[2 * h + j], o = row[3 * h + j];
          const T dh_j = dh_n[j] + (output_index_ == 0 ? dy[t * state + n * h + j] : T(0));
          const T dc_j = dc_n[j] + dh_j * o * (T(1) - tc[j] * tc[j]);
          d[j] = dc_j * cell * i * (T(1) - i);
          d[h + j] = dc_j * c_prev[j] * f * (T(1) - f);
          d[2 * h + j] = dc_j * i * (T(1) - cell * cell);
          d[3 * h + j] = dh_j * tc[j] * o * (T(1) - o);
          dc_n[j] = dc_j * f;
        }
      }
      const T* x_t = x_ + t * b * in_;
      const T* h_t = h_.data() + t * state;
      if (T* gw = tensors_[0].grad(); gw != nullptr) {
        nn::Gemm(true, false, static_cast<int>(g), static_cast<int>(in_), static_cast<int>(b), T(1),
                 dpre, static_cast<int>(g), x_t, static_cast<int>(in_), T(1), gw,
                 static_cast<int>(in_));
      }
      if (T* gw = tensors_[1].grad(); gw != nullptr) {
        nn::Gemm(true, false, static_cast<int>(g), static_cast<int>(h), static_cast<int>(b), T(1),
                 dpre, static_cast<int>(g), h_t, static_cast<int>(h), T(1), gw,
                 static_cast<int>(h));
      }
      for (size_t k = 2; k < tensors_.size(); ++k) {
        if (T* gb = tensors_[k].grad(); gb != nullptr) {
          for (int64_t n = 0; n < b; ++n) {
            for (int64_t j = 0; j < g; ++j) gb[j] += dpre[n * g + j];
          }
        }
      }
      if (dx != nullptr) {
        nn::Gemm(false, false, static_cast<int>(b), static_cast<int>(in_), static_cast<int>(g),
                 T(1), dpre, static_cast<int>(g), w_ih, static_cast<int>(in_), T(0),
                 dx + t * b * in_, static_cast<int>(in_));
      }
      // The gradient of h_{t-1}: through the recurrence only (and Y's, added above).
      nn::Gemm(false, false, static_cast<int>(b), static_cast<int>(h), static_cast<int>(g), T(1),
               dpre, static_cast<int>(g), w_hh, static_cast<int>(h), T(0), dh, static_cast<int>(h));
    }
    if (dx == nullptr) return {TensorRef<T>{}};
    return {TensorRef<T>{dx, batch_, in_shape_dims()}};
  }

 private:
  Dims in_shape_dims() const {
    ValueShape in;
    in.dims = {steps_, 1, in_};
    in.batch_axis = 1;
    return in.dims_for_ops();
  }

  std::vector<Operand<T>> tensors_;
  std::vector<size_t> params_per_tensor_, buffers_per_tensor_;
  const int64_t steps_, in_, hidden_;
  const int output_index_;
  const T* x_ = nullptr;  // Forward's input, valid until Backward returns (node.h).
  int batch_ = 0;
  // Per step: the gates after their activations [T, B, 4H], tanh(c) [T, B, H]; c and h
  // [T + 1, B, H] from the zero initial state.
  std::vector<T> gates_, tanh_c_, c_, h_;
  std::vector<T> dh_, dc_, dpre_, grad_input_;
};

template <typename T>
struct TorchLstm {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"hidden_size", "output"}));
    if (ctx.inputs.size() != 3 && ctx.inputs.size() != 5) {
      return ctx.Error("TorchLSTM takes X, weight_ih, weight_hh and optionally both biases");
    }
    DPTRAIN_ASSIGN_OR_RETURN(const ValueShape x, ShapeOf(ctx, 0));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t hidden, IntAttribute(ctx.node, "hidden_size", 0));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t output, IntAttribute(ctx.node, "output", 0));
    if (x.rank() != 3 || x.batch_axis != 1 || x.batch_outer != 1 || x.batch_inner != 1) {
      return ctx.Error(absl::StrCat("input of shape ", x.ToString(), ": [T, B, features] only"));
    }
    if (hidden < 1 || hidden > (1 << 20) || output < 0 || output > 2) {
      return ctx.Error(
          absl::StrCat("hidden_size ", hidden, " or output ", output, " out of range"));
    }
    const int64_t steps = x.dims[0], in = x.dims[2];
    const std::vector<Shape> expected = {
        {4 * hidden, in}, {4 * hidden, hidden}, {4 * hidden}, {4 * hidden}};
    std::vector<Operand<T>> tensors;
    for (size_t k = 1; k < ctx.inputs.size(); ++k) {
      const NodeInput& t = ctx.inputs[k];
      if (t.constant == nullptr || t.constant->type != Tensor::Type::kFloat ||
          t.constant->shape != expected[k - 1]) {
        return ctx.Error(absl::StrCat("input ", k, " must be a float tensor of the model of shape ",
                                      ShapeText(expected[k - 1])));
      }
      tensors.emplace_back(t, t.constant->shape);
    }
    ValueShape out;
    if (output == 0) {
      out.dims = {steps, 1, 1, hidden};
      out.batch_axis = 2;
    } else {
      out.dims = {1, 1, hidden};
      out.batch_axis = 1;
    }
    return std::unique_ptr<NodeImpl<T>>(std::make_unique<TorchLstmNode<T>>(
        std::move(tensors), steps, in, hidden, static_cast<int>(output), std::move(out)));
  }
};

}  // namespace
}  // namespace any_shape_internal

OpFactory TorchLstmOp() { return MakeOpFactory<any_shape_internal::TorchLstm>(true); }

}  // namespace graph
}  // namespace dptrain
