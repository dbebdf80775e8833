#include "worker/graph/shape_arithmetic.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dptrain {
namespace graph {
namespace {

absl::Status NodeError(const Node& node, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("node '", node.name, "' (", node.op, "): ", what));
}

// Axes of a Squeeze/Unsqueeze: the attribute (before opset 13) or the int64 input 1.
absl::StatusOr<std::vector<int64_t>> Axes(const Node& node,
                                          const std::vector<const Tensor*>& inputs) {
  if (inputs.size() > 1 && inputs[1] != nullptr) return inputs[1]->ints;
  return IntsAttribute(node, "axes", {});
}

// Normalises `axis` for `rank` (negative counts from the end), or an error.
absl::StatusOr<int64_t> Axis(const Node& node, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) {
    return NodeError(node, absl::StrCat("axis ", axis, " out of range for rank ", rank));
  }
  return axis < 0 ? axis + rank : axis;
}

// Add, Sub, Mul, Div, Mod of int64 values: one shape, or either a scalar (one element).
absl::StatusOr<Tensor> Arithmetic(const Node& node, const std::vector<const Tensor*>& in) {
  if (in.size() != 2 || in[0] == nullptr || in[1] == nullptr) {
    return NodeError(node, "expects two int64 operands");
  }
  const Tensor& a = *in[0];
  const Tensor& b = *in[1];
  const int64_t na = a.num_elements(), nb = b.num_elements();
  if (a.shape != b.shape && na != 1 && nb != 1) {
    return NodeError(node, absl::StrCat("folding of ", a.ToString(), " and ", b.ToString(),
                                        " unsupported (one shape, or a scalar)"));
  }
  if (na == 0 || nb == 0) return NodeError(node, "an empty operand");
  Tensor out;
  out.type = Tensor::Type::kInt64;
  // The larger operand's shape; of two one-element operands, the one of higher rank ([1], not
  // [], for a scalar minus a [1]: NumPy's broadcast).
  out.shape = na != nb ? (na > nb ? a.shape : b.shape)
                       : (a.shape.size() >= b.shape.size() ? a.shape : b.shape);
  const int64_t n = std::max(na, nb);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t x = a.ints[na == 1 ? 0 : i];
    const int64_t y = b.ints[nb == 1 ? 0 : i];
    if (IsBatchMultiple(x) || IsBatchMultiple(y)) {
      // The batch size times a positive constant, or divided by one that divides its factor.
      const bool left = IsBatchMultiple(x);
      const int64_t k = BatchFactor(left ? x : y), c = left ? y : x;
      int64_t product = 0;
      if (node.op == "Mul" && !IsBatchMultiple(c) && c >= 1 &&
          !__builtin_mul_overflow(k, c, &product) && product <= kMaxBatchFactor) {
        out.ints.push_back(BatchMultiple(product));
        continue;
      }
      if (node.op == "Div" && left && c >= 1 && k % c == 0) {
        out.ints.push_back(BatchMultiple(k / c));
        continue;
      }
      return NodeError(node,
                       "computes with the batch size (dimension 0 of a Shape), known only "
                       "at run time, other than multiplying it by a positive constant: "
                       "unsupported (export the model with a fixed batch size of 2 or more)");
    }
    int64_t z = 0;
    bool overflow = false;
    if (node.op == "Add") {
      overflow = __builtin_add_overflow(x, y, &z);
    } else if (node.op == "Sub") {
      overflow = __builtin_sub_overflow(x, y, &z);
    } else if (node.op == "Mul") {
      overflow = __builtin_mul_overflow(x, y, &z);
    } else {
      if (y == 0) return NodeError(node, "division by zero");
      overflow = x == std::numeric_limits<int64_t>::min() && y == -1;
      if (!overflow && node.op == "Mod") {
        // ONNX's integer Mod (fmod=0): the remainder takes the divisor's sign, as Python's %.
        z = x % y;
        if (z != 0 && ((z < 0) != (y < 0))) z += y;
      } else if (!overflow) {
        z = x / y;  // Truncates toward zero, as ONNX's integer Div.
      }
    }
    if (overflow) return NodeError(node, "int64 overflow");
    out.ints.push_back(z);
  }
  return out;
}

}  // namespace

bool IsShapeArithmetic(const std::string& op) {
  return op == "Unsqueeze" || op == "Squeeze" || op == "Concat" || op == "Gather" || op == "Cast" ||
         op == "Identity" || op == "Add" || op == "Sub" || op == "Mul" || op == "Div" ||
         op == "Mod" || op == "Reshape" || op == "ConstantOfShape" || op == "Equal" ||
         op == "Where" || op == "Slice" || op == "ReduceProd";
}

absl::StatusOr<Tensor> EvaluateShapeArithmetic(const Node& node,
                                               const std::vector<const Tensor*>& in) {
  if (in.empty() || in[0] == nullptr) return NodeError(node, "has no input to evaluate");
  for (const Tensor* t : in) {
    if (t != nullptr && (t->type != Tensor::Type::kInt64 ||
                         static_cast<int64_t>(t->ints.size()) != t->num_elements())) {
      return NodeError(node, absl::StrCat("operand ", t->ToString(), " is not an int64 value"));
    }
  }
  if (node.op == "Add" || node.op == "Sub" || node.op == "Mul" || node.op == "Div" ||
      node.op == "Mod") {
    if (node.op == "Mod") {
      DPTRAIN_ASSIGN_OR_RETURN(const int64_t fmod, IntAttribute(node, "fmod", 0));
      if (fmod != 0) return NodeError(node, "fmod=1 unsupported for integers");
    }
    return Arithmetic(node, in);
  }
  const Tensor& x = *in[0];
  if (node.op == "Identity") return x;
  if (node.op == "ReduceProd") {
    // The element count of some axes (x.std(dim) exports its divisor so): a product of a 1-D
    // int64 value's entries, the batch size among them at most once.
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(node, {"keepdims", "axes"}));
    DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> axes, IntsAttribute(node, "axes", {}));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t keepdims, IntAttribute(node, "keepdims", 1));
    if (x.shape.size() > 1 || in.size() > 1 ||
        !(axes.empty() || axes == std::vector<int64_t>{0} || axes == std::vector<int64_t>{-1})) {
      return NodeError(node, "folding is implemented for the product of a 1-D value only");
    }
    int64_t product = 1, batch_factor = 0;
    for (int64_t v : x.ints) {
      bool overflow = false;
      if (IsBatchMultiple(v)) {
        if (batch_factor != 0) return NodeError(node, "a product of the batch size with itself");
        batch_factor = BatchFactor(v);
      } else {
        overflow = __builtin_mul_overflow(product, v, &product);
      }
      if (overflow) return NodeError(node, "int64 overflow");
    }
    Tensor out;
    out.type = Tensor::Type::kInt64;
    if (keepdims != 0 && !x.shape.empty()) out.shape = {1};
    if (batch_factor == 0) {
      out.ints = {product};
      return out;
    }
    int64_t factor = 0;
    if (product < 1 || __builtin_mul_overflow(batch_factor, product, &factor) ||
        factor > kMaxBatchFactor) {
      return NodeError(node,
                       "computes with the batch size other than multiplying it by a "
                       "positive constant: unsupported");
    }
    out.ints = {BatchMultiple(factor)};
    return out;
  }
  if (node.op == "Cast") {
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t to, IntAttribute(node, "to", 0));
    constexpr int64_t kOnnxFloat = 1, kOnnxInt64 = 7;
    if (to == kOnnxInt64) return x;
    if (to != kOnnxFloat) return NodeError(node, absl::StrCat("cast to type ", to, " unsupported"));
    if (std::any_of(x.ints.begin(), x.ints.end(), IsBatchMultiple)) {
      return NodeError(node,
                       "casts the batch size (dimension 0 of a Shape), known only at run "
                       "time, to float: unsupported");
    }
    Tensor out;
    out.shape = x.shape;
    out.floats.assign(x.ints.begin(), x.ints.end());
    return out;
  }
  if (node.op == "Unsqueeze") {
    DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> axes, Axes(node, in));
    const int64_t rank = static_cast<int64_t>(x.shape.size() + axes.size());
    std::vector<int64_t> normal;
    for (int64_t a : axes) {
      DPTRAIN_ASSIGN_OR_RETURN(const int64_t n, Axis(node, a, rank));
      normal.push_back(n);
    }
    std::sort(normal.begin(), normal.end());
    if (std::adjacent_find(normal.begin(), normal.end()) != normal.end()) {
      return NodeError(node, "an axis given twice");
    }
    Tensor out = x;
    for (int64_t a : normal) out.shape.insert(out.shape.begin() + a, 1);
    return out;
  }
  if (node.op == "Squeeze") {
    DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> axes, Axes(node, in));
    const int64_t rank = static_cast<int64_t>(x.shape.size());
    std::set<int64_t> drop;
    for (int64_t a : axes) {
      DPTRAIN_ASSIGN_OR_RETURN(const int64_t n, Axis(node, a, rank));
      if (x.shape[n] != 1) return NodeError(node, absl::StrCat("axis ", a, " is not of size 1"));
      drop.insert(n);
    }
    Tensor out = x;
    out.shape.clear();
    for (int64_t i = 0; i < rank; ++i) {
      const bool squeezed = axes.empty() ? x.shape[i] == 1 : drop.count(i) > 0;
      if (!squeezed) out.shape.push_back(x.shape[i]);
    }
    return out;
  }
  if (node.op == "Concat") {
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t axis, IntAttribute(node, "axis", 0));
    Tensor out;
    out.type = Tensor::Type::kInt64;
    for (const Tensor* t : in) {
      if (t == nullptr || t->shape.size() != 1 || (axis != 0 && axis != -1)) {
        return NodeError(node, "folding is implemented for 1-D int64 constants only");
      }
      out.ints.insert(out.ints.end(), t->ints.begin(), t->ints.end());
    }
    out.shape = {static_cast<int64_t>(out.ints.size())};
    return out;
  }
  if (node.op == "Gather") {
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t axis, IntAttribute(node, "axis", 0));
    if (in.size() != 2 || in[1] == nullptr || x.shape.size() != 1 || (axis != 0 && axis != -1) ||
        in[1]->shape.size() > 1) {
      return NodeError(node, "folding is implemented for 1-D data and 0-D or 1-D indices only");
    }
    Tensor out;
    out.type = Tensor::Type::kInt64;
    out.shape = in[1]->shape;
    const int64_t n = x.shape[0];
    for (int64_t i : in[1]->ints) {
      if (i < -n || i >= n) return NodeError(node, absl::StrCat("index ", i, " out of range"));
      out.ints.push_back(x.ints[i < 0 ? i + n : i]);
    }
    return out;
  }
  if (node.op == "Reshape") {
    if (in.size() != 2 || in[1] == nullptr || in[1]->shape.size() != 1) {
      return NodeError(node, "folding needs a 1-D target shape");
    }
    Tensor out = x;
    out.shape = in[1]->ints;
    int64_t known = 1;
    int infer = -1;
    for (size_t i = 0; i < out.shape.size(); ++i) {
      int64_t& d = out.shape[i];
      if (d == 0 && i < x.shape.size()) d = x.shape[i];
      if (d == -1 && infer < 0) {
        infer = static_cast<int>(i);
      } else if (d < 0 || __builtin_mul_overflow(known, d, &known)) {
        return NodeError(node, absl::StrCat("target ", ShapeText(in[1]->ints), " unsupported"));
      }
    }
    if (infer >= 0 && known > 0) out.shape[infer] = x.num_elements() / known;
    int64_t elements = 1;
    for (int64_t d : out.shape) {
      if (__builtin_mul_overflow(elements, d, &elements)) elements = -1;
    }
    if (elements != x.num_elements()) {
      return NodeError(
          node, absl::StrCat("target ", ShapeText(in[1]->ints), " does not fit ", x.ToString()));
    }
    return out;
  }
  if (node.op == "Slice") {
    // Of 1-D data, axis 0, step 1 (shape[0:2] as exported for x.flatten(2)).
    auto one = [&](size_t i, int64_t fallback) -> absl::StatusOr<int64_t> {
      if (i >= in.size() || in[i] == nullptr) return fallback;
      if (in[i]->ints.size() != 1) return NodeError(node, "folding needs one start and end");
      return in[i]->ints[0];
    };
    if (x.shape.size() != 1 || in.size() < 3) {
      return NodeError(node, "folding is implemented for 1-D data only");
    }
    DPTRAIN_ASSIGN_OR_RETURN(int64_t start, one(1, 0));
    DPTRAIN_ASSIGN_OR_RETURN(int64_t end, one(2, 0));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t axis, one(3, 0));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t step, one(4, 1));
    if ((axis != 0 && axis != -1) || step != 1) {
      return NodeError(node, "folding is implemented for axis 0 and step 1 only");
    }
    const int64_t n = x.shape[0];
    start = std::clamp(start < 0 ? start + n : start, int64_t{0}, n);
    end = std::clamp(end < 0 ? end + n : end, int64_t{0}, n);
    Tensor out;
    out.type = Tensor::Type::kInt64;
    if (end > start) out.ints.assign(x.ints.begin() + start, x.ints.begin() + end);
    out.shape = {static_cast<int64_t>(out.ints.size())};
    return out;
  }
  if (node.op == "ConstantOfShape") {
    // The importer keeps an int64 value tensor as the attribute value_int (onnx_import.cc); a
    // float one (or none: ONNX's float 0) is no shape arithmetic.
    if (node.attributes.count("value_int") == 0) {
      return NodeError(node, "a float value (a tensor of zeros or ones) unsupported");
    }
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t value, IntAttribute(node, "value_int", 0));
    if (x.shape.size() != 1) return NodeError(node, "the shape must be 1-D");
    Tensor out;
    out.type = Tensor::Type::kInt64;
    out.shape = x.ints;
    int64_t elements = 1;
    for (int64_t d : out.shape) {
      if (d < 0) return NodeError(node, "a shape of the batch size or negative: unsupported");
      if (__builtin_mul_overflow(elements, d, &elements) || elements > (int64_t{1} << 20)) {
        return NodeError(node, "folding is implemented for up to 2^20 elements");
      }
    }
    out.ints.assign(elements, value);
    return out;
  }
  if (node.op == "Equal" || node.op == "Where") {
    // Element-wise over equal shapes, or against a scalar (a one-element operand). The result
    // of Equal is 0 or 1 (ONNX's bool, kept as int64 here).
    const size_t operands = node.op == "Equal" ? 2 : 3;
    if (in.size() != operands) return NodeError(node, "wrong number of inputs");
    int64_t n = 1;
    std::vector<int64_t> shape;
    for (const Tensor* t : in) {
      if (t == nullptr) return NodeError(node, "an input is missing");
      if (t->num_elements() == 1) {
        // NumPy's broadcast of one-element operands: the highest rank ([1], not []).
        if (n == 1 && t->shape.size() > shape.size()) shape = t->shape;
        continue;
      }
      if (n != 1 && t->shape != shape) return NodeError(node, "operands of different shapes");
      n = t->num_elements();
      shape = t->shape;
    }
    auto at = [](const Tensor* t, int64_t i) { return t->ints[t->ints.size() == 1 ? 0 : i]; };
    Tensor out;
    out.type = Tensor::Type::kInt64;
    out.shape = shape;
    for (int64_t i = 0; i < n; ++i) {
      if (node.op == "Where") {
        out.ints.push_back(at(in[0], i) != 0 ? at(in[1], i) : at(in[2], i));
        continue;
      }
      const int64_t a = at(in[0], i), b = at(in[1], i);
      if (IsBatchMultiple(a) != IsBatchMultiple(b) && std::max(a, b) > 0) {
        return NodeError(node,
                         "compares the batch size, known only at run time, with a number: "
                         "unsupported");
      }
      out.ints.push_back(a == b ? 1 : 0);
    }
    return out;
  }
  return NodeError(node, "not foldable");
}

}  // namespace graph
}  // namespace dptrain
