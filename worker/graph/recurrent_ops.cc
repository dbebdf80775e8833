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
#include "worker/graph/recurrent_cells.h"
#include "worker/nn/batch_sample.h"
#include "worker/nn/gemm.h"

namespace dptrain {
namespace graph {
namespace any_shape_internal {
namespace {

enum class Cell { kLstm, kGru };

// One layer of nn.LSTM or nn.GRU, one or two directions (recurrent_ops.h). Gate order as
// PyTorch's: LSTM input, forget, cell, output; GRU reset, update, new.
template <typename T>
class TorchRecurrentNode final : public AnyShapeNode<T> {
 public:
  // `tensors`: per direction weight_ih, weight_hh, then bias_ih and bias_hh if `biases`.
  // `lengths`: a second runtime input holds each sample's length (pack_padded_sequence's).
  TorchRecurrentNode(Cell cell, std::vector<Operand<T>> tensors, bool biases, int directions,
                     int64_t steps, int64_t in, int64_t hidden, int output, bool lengths,
                     ValueShape out)
      : AnyShapeNode<T>(std::move(out)),
        cell_(cell),
        has_lengths_(lengths),
        tensors_(std::move(tensors)),
        per_direction_(biases ? 4 : 2),
        directions_(directions),
        steps_(steps),
        in_(in),
        hidden_(hidden),
        gates_per_step_((cell == Cell::kLstm ? 4 : 3) * hidden),
        output_index_(output),
        state_(directions) {
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

  // What a GPU twin needs: the form and where each tensor lies.
  TwinSpec<T> twin() const override {
    TwinSpec<T> t = AnyShapeNode<T>::twin();
    typename TwinSpec<T>::Recurrent& r = t.recurrent;
    r.gru = cell_ == Cell::kGru;
    r.biases = per_direction_ == 4;
    r.lengths = has_lengths_;
    r.directions = directions_;
    r.output = output_index_;
    r.steps = steps_;
    r.in = in_;
    r.hidden = hidden_;
    for (const Operand<T>& o : tensors_) r.tensors.push_back({o.source(), o.held(), o.size()});
    return t;
  }

  // Lengths (pack_padded_sequence's) must be whole numbers in [1, T], as PyTorch requires.
  absl::Status CheckInputs(absl::Span<const TensorRef<T>> inputs, bool) const override {
    if (!has_lengths_) return absl::OkStatus();
    const TensorRef<T>& lengths = inputs[1];
    for (int n = 0; n < lengths.batch; ++n) {
      const T v = lengths.data[n];
      if (!(v >= T(1) && v <= static_cast<T>(steps_) && v == std::floor(v))) {
        return nn::AtBatchSample(
            absl::InvalidArgumentError(
                absl::StrCat(nn::BatchSampleText(n), " has sequence length ",
                             static_cast<double>(v), ", not a whole number in [1, ", steps_,
                             "] (pack_padded_sequence needs at least one step per sample)")),
            n);
      }
    }
    return absl::OkStatus();
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    x_ = x.data;
    batch_ = x.batch;
    const int64_t b = batch_, h = hidden_, state = b * h;
    lengths_.clear();
    if (has_lengths_) {
      // In [0, T] whatever happens (CheckInputs refused anything else before this call).
      for (int n = 0; n < x.batch; ++n) {
        const T v = inputs[1].data[n];
        lengths_.push_back(v >= T(0) && v <= static_cast<T>(steps_) ? static_cast<int64_t>(v) : 0);
      }
    }
    for (int d = 0; d < directions_; ++d) ForwardDirection(d);
    // Y [T, D, B, H]: each time step's h of each direction (zero past a sample's length); Y_h,
    // Y_c [D, B, H]: the last (a sample's state stays as it was past its length).
    const int64_t out_size = (output_index_ == 0 ? steps_ : 1) * directions_ * state;
    T* y = EnsureSize(output_, out_size);
    if (output_index_ == 0 && has_lengths_) std::fill(y, y + out_size, T(0));
    for (int d = 0; d < directions_; ++d) {
      const State& s = state_[d];
      if (output_index_ == 0) {
        for (int64_t step = 0; step < steps_; ++step) {
          const T* h_t = s.h.data() + (step + 1) * state;
          if (!has_lengths_) {
            std::copy(h_t, h_t + state, y + (TimeOf(d, step) * directions_ + d) * state);
            continue;
          }
          for (int64_t n = 0; n < b; ++n) {
            const int64_t t = TimeAt(d, n, step);
            if (t >= 0)
              std::copy(h_t + n * h, h_t + (n + 1) * h, y + (t * directions_ + d) * state + n * h);
          }
        }
      } else {
        const T* last = (output_index_ == 1 ? s.h : s.c).data() + steps_ * state;
        std::copy(last, last + state, y + d * state);
      }
    }
    return {y, x.batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    for (Operand<T>& t : tensors_) {
      if (T* grad = t.grad(); grad != nullptr) std::fill(grad, grad + t.size(), T(0));
    }
    T* dx = nullptr;
    if (need_input_grad[0]) {
      const int64_t n = steps_ * batch_ * in_;
      dx = EnsureSize(grad_input_, n);
      std::fill(dx, dx + n, T(0));
    }
    for (int d = 0; d < directions_; ++d) BackwardDirection(d, grad_output.data, dx);
    std::vector<TensorRef<T>> grads(has_lengths_ ? 2 : 1);
    if (has_lengths_ && need_input_grad[1]) {  // Lengths are counts: no gradient.
      T* zero = EnsureSize(grad_lengths_, batch_);
      std::fill(zero, zero + batch_, T(0));
      grads[1] = {zero, batch_, {1, 1, 1}};
    }
    if (dx == nullptr) return grads;
    ValueShape in;
    in.dims = {steps_, 1, in_};
    in.batch_axis = 1;
    grads[0] = {dx, batch_, in.dims_for_ops()};
    return grads;
  }

 private:
  // One direction's values of the last Forward, in its own step order (step s reads time
  // TimeOf(d, s)): the gates after their activations [T, B, G], h (and the LSTM's c) [T + 1, B,
  // H] from the zero initial state, tanh(c) (LSTM) or W_hn h + b_hn (GRU) [T, B, H].
  struct State {
    std::vector<T> gates, h, c, extra;
  };

  int64_t TimeOf(int direction, int64_t step) const {
    return RecurrentTime(direction, step, steps_);
  }
  // The time sample n reads at `step` of direction d, or -1 past its length (its state then
  // stays as it was): with lengths, the reverse direction starts at the sample's last step.
  int64_t TimeAt(int direction, int64_t n, int64_t step) const {
    return RecurrentTime(direction, step, has_lengths_ ? lengths_[n] : steps_);
  }
  // Whether the samples read different times at a step (the reverse direction with lengths):
  // their rows of X are then gathered (and their gradients scattered) one by one.
  bool Ragged(int direction) const { return has_lengths_ && direction == 1; }
  // The rows of X that step `step` of direction d reads, [B, I]: X's own rows at one time, or
  // gathered per sample into `into` (zeros past a sample's length).
  const T* StepInput(int d, int64_t step, std::vector<T>& into) const {
    const int64_t b = batch_;
    if (!Ragged(d)) return x_ + TimeOf(d, step) * b * in_;
    T* rows = EnsureSize(into, b * in_);
    for (int64_t n = 0; n < b; ++n) {
      const int64_t t = TimeAt(d, n, step);
      if (t < 0) {
        std::fill(rows + n * in_, rows + (n + 1) * in_, T(0));
      } else {
        const T* from = x_ + (t * b + n) * in_;
        std::copy(from, from + in_, rows + n * in_);
      }
    }
    return rows;
  }
  const Operand<T>& Tensor(int direction, int k) const {
    return tensors_[direction * per_direction_ + k];
  }
  Operand<T>& MutableTensor(int direction, int k) {
    return tensors_[direction * per_direction_ + k];
  }
  const T* Bias(int direction, int k) const {
    return per_direction_ == 4 ? Tensor(direction, 2 + k).data() : nullptr;
  }

  void ForwardDirection(int d) {
    const int64_t b = batch_, h = hidden_, g = gates_per_step_, state = b * h;
    State& s = state_[d];
    T* gates = EnsureSize(s.gates, steps_ * b * g);
    T* hs = EnsureSize(s.h, (steps_ + 1) * state);
    T* cs = cell_ == Cell::kLstm ? EnsureSize(s.c, (steps_ + 1) * state) : nullptr;
    T* extra = EnsureSize(s.extra, steps_ * state);
    T* hidden_pre = cell_ == Cell::kGru ? EnsureSize(hidden_pre_, b * g) : nullptr;
    std::fill(hs, hs + state, T(0));
    if (cs != nullptr) std::fill(cs, cs + state, T(0));
    const T* w_ih = Tensor(d, 0).data();
    const T* w_hh = Tensor(d, 1).data();
    const T* b_ih = Bias(d, 0);
    const T* b_hh = Bias(d, 1);
    for (int64_t step = 0; step < steps_; ++step) {
      const T* x_t = StepInput(d, step, step_input_);
      const T* h_prev = hs + step * state;
      T* pre = gates + step * b * g;
      nn::Gemm(false, true, static_cast<int>(b), static_cast<int>(g), static_cast<int>(in_), T(1),
               x_t, static_cast<int>(in_), w_ih, static_cast<int>(in_), T(0), pre,
               static_cast<int>(g));
      // LSTM: every gate sums both products; GRU: the hidden product apart (r scales its n part).
      T* into = cell_ == Cell::kLstm ? pre : hidden_pre;
      nn::Gemm(false, true, static_cast<int>(b), static_cast<int>(g), static_cast<int>(h), T(1),
               h_prev, static_cast<int>(h), w_hh, static_cast<int>(h),
               cell_ == Cell::kLstm ? T(1) : T(0), into, static_cast<int>(g));
      for (int64_t n = 0; n < b; ++n) {
        T* row = pre + n * g;
        const T* hp = h_prev + n * h;
        T* h_next = hs + (step + 1) * state + n * h;
        T* ex = extra + step * state + n * h;
        if (TimeAt(d, n, step) < 0) {  // Past its length: the state stays.
          std::copy(hp, hp + h, h_next);
          if (cs != nullptr) {
            std::copy(cs + step * state + n * h, cs + step * state + (n + 1) * h,
                      cs + (step + 1) * state + n * h);
          }
          continue;
        }
        if (cell_ == Cell::kLstm) {
          const int64_t at = step * state + n * h;
          for (int64_t j = 0; j < h; ++j) {
            cs[at + state + j] =
                LstmForward<T>(row, nullptr, b_ih, b_hh, h, j, cs[at + j], row, &ex[j], &h_next[j]);
          }
        } else {
          const T* hrow = hidden_pre + n * g;
          for (int64_t j = 0; j < h; ++j) {
            h_next[j] = GruForward<T>(row, hrow, b_ih, b_hh, h, j, hp[j], row, &ex[j]);
          }
        }
      }
    }
  }

  void BackwardDirection(int d, const T* dy, T* dx) {
    const int64_t b = batch_, h = hidden_, g = gates_per_step_, state = b * h;
    const State& s = state_[d];
    T* dh = EnsureSize(dh_, state);
    T* dc = EnsureSize(dc_, state);
    T* dpre_i = EnsureSize(dpre_i_, b * g);
    T* dpre_h = EnsureSize(dpre_h_, b * g);
    std::fill(dh, dh + state, T(0));
    std::fill(dc, dc + state, T(0));
    if (output_index_ == 1) std::copy(dy + d * state, dy + (d + 1) * state, dh);
    if (output_index_ == 2) std::copy(dy + d * state, dy + (d + 1) * state, dc);
    const T* w_ih = Tensor(d, 0).data();
    const T* w_hh = Tensor(d, 1).data();
    T* gw_ih = MutableTensor(d, 0).grad();
    T* gw_hh = MutableTensor(d, 1).grad();
    T* gb_ih = per_direction_ == 4 ? MutableTensor(d, 2).grad() : nullptr;
    T* gb_hh = per_direction_ == 4 ? MutableTensor(d, 3).grad() : nullptr;
    for (int64_t step = steps_ - 1; step >= 0; --step) {
      const T* gates = s.gates.data() + step * b * g;
      const T* h_prev = s.h.data() + step * state;
      for (int64_t n = 0; n < b; ++n) {
        const T* row = gates + n * g;
        const T* ex = s.extra.data() + step * state + n * h;
        const T* hp = h_prev + n * h;
        T* dh_n = dh + n * h;
        T* dc_n = dc + n * h;
        T* di = dpre_i + n * g;
        T* dhh = dpre_h + n * g;
        const int64_t t = TimeAt(d, n, step);
        if (t < 0) {  // Past its length: the state's gradients pass through, the gates get none.
          std::fill(di, di + g, T(0));
          std::fill(dhh, dhh + g, T(0));
          continue;
        }
        const T* dy_t = output_index_ == 0 ? dy + (t * directions_ + d) * state + n * h : nullptr;
        for (int64_t j = 0; j < h; ++j) {
          const T dh_j = dh_n[j] + (dy_t != nullptr ? dy_t[j] : T(0));
          if (cell_ == Cell::kLstm) {
            LstmBackward<T>(row, ex[j], s.c[step * state + n * h + j], dh_j, &dc_n[j], di, h, j);
          } else {  // The direct path; the product's is added below.
            dh_n[j] = GruBackward<T>(row, ex[j], hp[j], dh_j, di, dhh, h, j);
          }
        }
      }
      // LSTM: both products share the gates' gradient.
      const T* dh_side = cell_ == Cell::kLstm ? dpre_i : dpre_h;
      const T* x_t = StepInput(d, step, step_input_);
      if (gw_ih != nullptr) {
        nn::Gemm(true, false, static_cast<int>(g), static_cast<int>(in_), static_cast<int>(b), T(1),
                 dpre_i, static_cast<int>(g), x_t, static_cast<int>(in_), T(1), gw_ih,
                 static_cast<int>(in_));
      }
      if (gw_hh != nullptr) {
        nn::Gemm(true, false, static_cast<int>(g), static_cast<int>(h), static_cast<int>(b), T(1),
                 dh_side, static_cast<int>(g), h_prev, static_cast<int>(h), T(1), gw_hh,
                 static_cast<int>(h));
      }
      for (int64_t n = 0; n < b; ++n) {
        for (int64_t j = 0; j < g; ++j) {
          if (gb_ih != nullptr) gb_ih[j] += dpre_i[n * g + j];
          if (gb_hh != nullptr) gb_hh[j] += dh_side[n * g + j];
        }
      }
      if (dx != nullptr && !Ragged(d)) {
        nn::Gemm(false, false, static_cast<int>(b), static_cast<int>(in_), static_cast<int>(g),
                 T(1), dpre_i, static_cast<int>(g), w_ih, static_cast<int>(in_), T(1),
                 dx + TimeOf(d, step) * b * in_, static_cast<int>(in_));
      } else if (dx != nullptr) {  // Each sample's row to its own time.
        T* rows = EnsureSize(step_grad_, b * in_);
        nn::Gemm(false, false, static_cast<int>(b), static_cast<int>(in_), static_cast<int>(g),
                 T(1), dpre_i, static_cast<int>(g), w_ih, static_cast<int>(in_), T(0), rows,
                 static_cast<int>(in_));
        for (int64_t n = 0; n < b; ++n) {
          const int64_t t = TimeAt(d, n, step);
          if (t < 0) continue;
          T* to = dx + (t * b + n) * in_;
          for (int64_t k = 0; k < in_; ++k) to[k] += rows[n * in_ + k];
        }
      }
      // The gradient of the previous h: LSTM through the recurrence only; GRU adds it to the
      // direct path left in dh. A sample past its length keeps its h's gradient as it was.
      T* kept = has_lengths_ && cell_ == Cell::kLstm ? EnsureSize(dh_kept_, state) : nullptr;
      if (kept != nullptr) std::copy(dh, dh + state, kept);
      nn::Gemm(false, false, static_cast<int>(b), static_cast<int>(h), static_cast<int>(g), T(1),
               dh_side, static_cast<int>(g), w_hh, static_cast<int>(h),
               cell_ == Cell::kLstm ? T(0) : T(1), dh, static_cast<int>(h));
      for (int64_t n = 0; kept != nullptr && n < b; ++n) {
        if (TimeAt(d, n, step) < 0) std::copy(kept + n * h, kept + (n + 1) * h, dh + n * h);
      }
    }
  }

  const Cell cell_;
  const bool has_lengths_;
  std::vector<int64_t> lengths_;  // Of the last Forward's samples, when has_lengths_.
  std::vector<Operand<T>> tensors_;
  std::vector<size_t> params_per_tensor_, buffers_per_tensor_;
  const int per_direction_, directions_;
  const int64_t steps_, in_, hidden_, gates_per_step_;
  const int output_index_;
  const T* x_ = nullptr;  // Forward's input, valid until Backward returns (node.h).
  int batch_ = 0;
  std::vector<State> state_;
  std::vector<T> output_, hidden_pre_, dh_, dc_, dpre_i_, dpre_h_, grad_input_;
  std::vector<T> step_input_, step_grad_, dh_kept_, grad_lengths_;
};

// TorchLSTM or TorchGRU: X, then per direction weight_ih, weight_hh and (both or neither)
// bias_ih, bias_hh, then (attribute sequence_lens = 1) each sample's length [B]; attributes
// hidden_size, output, directions (1 or 2).
template <Cell kCell>
struct TorchRecurrent {
  template <typename T>
  struct Op {
    static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
      DPTRAIN_RETURN_IF_ERROR(
          CheckKnownAttributes(ctx.node, {"hidden_size", "output", "directions", "sequence_lens"}));
      DPTRAIN_ASSIGN_OR_RETURN(const ValueShape x, ShapeOf(ctx, 0));
      DPTRAIN_ASSIGN_OR_RETURN(const int64_t hidden, IntAttribute(ctx.node, "hidden_size", 0));
      DPTRAIN_ASSIGN_OR_RETURN(const int64_t output, IntAttribute(ctx.node, "output", 0));
      DPTRAIN_ASSIGN_OR_RETURN(const int64_t directions, IntAttribute(ctx.node, "directions", 1));
      DPTRAIN_ASSIGN_OR_RETURN(const int64_t with_lengths,
                               IntAttribute(ctx.node, "sequence_lens", 0));
      const bool lengths = with_lengths != 0;
      if (lengths) {
        if (ctx.inputs.size() < 2) return ctx.Error("sequence_lens without a lengths input");
        const NodeInput& l = ctx.inputs.back();
        if (!l.is_runtime() || l.shape->per_sample() != 1 || l.shape->batch_axis != 0 ||
            l.shape->batch_outer != 1 || l.shape->batch_inner != 1) {
          return ctx.Error("the last input must be each sample's length, a computed [B] value");
        }
      }
      if (x.rank() != 3 || x.batch_axis != 1 || x.batch_outer != 1 || x.batch_inner != 1) {
        return ctx.Error(absl::StrCat("input of shape ", x.ToString(), ": [T, B, features] only"));
      }
      const int64_t outputs = kCell == Cell::kLstm ? 3 : 2;
      if (hidden < 1 || hidden > (1 << 20) || output < 0 || output >= outputs ||
          (directions != 1 && directions != 2)) {
        return ctx.Error(absl::StrCat("hidden_size ", hidden, ", output ", output,
                                      " or directions ", directions, " out of range"));
      }
      const size_t tensors_in = ctx.inputs.size() - 1 - (lengths ? 1 : 0);
      if (tensors_in != 2 * static_cast<size_t>(directions) &&
          tensors_in != 4 * static_cast<size_t>(directions)) {
        return ctx.Error(
            "expected X, then per direction weight_ih, weight_hh and optionally "
            "bias_ih, bias_hh");
      }
      const bool biases = tensors_in == 4 * static_cast<size_t>(directions);
      const int per = biases ? 4 : 2;
      const int64_t steps = x.dims[0], in = x.dims[2];
      const int64_t rows = (kCell == Cell::kLstm ? 4 : 3) * hidden;
      const std::vector<Shape> expected = {{rows, in}, {rows, hidden}, {rows}, {rows}};
      std::vector<Operand<T>> tensors;
      for (size_t k = 1; k <= tensors_in; ++k) {
        const NodeInput& t = ctx.inputs[k];
        const Shape& want = expected[(k - 1) % per];
        if (t.constant == nullptr || t.constant->type != Tensor::Type::kFloat ||
            t.constant->shape != want) {
          return ctx.Error(absl::StrCat(
              "input ", k, " must be a float tensor of the model of shape ", ShapeText(want)));
        }
        tensors.emplace_back(t, t.constant->shape);
      }
      ValueShape out;
      if (output == 0) {
        out.dims = {steps, directions, 1, hidden};
        out.batch_axis = 2;
      } else {
        out.dims = {directions, 1, hidden};
        out.batch_axis = 1;
      }
      return std::unique_ptr<NodeImpl<T>>(std::make_unique<TorchRecurrentNode<T>>(
          kCell, std::move(tensors), biases, static_cast<int>(directions), steps, in, hidden,
          static_cast<int>(output), lengths, std::move(out)));
    }
  };
};

}  // namespace
}  // namespace any_shape_internal

OpFactory TorchLstmOp() {
  return MakeOpFactory<any_shape_internal::TorchRecurrent<any_shape_internal::Cell::kLstm>::Op>(
      true);
}
OpFactory TorchGruOp() {
  return MakeOpFactory<any_shape_internal::TorchRecurrent<any_shape_internal::Cell::kGru>::Op>(
      true);
}

}  // namespace graph
}  // namespace dptrain
