#include "worker/graph/constant_folding.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dptrain {
namespace graph {
namespace {

using Shape = std::vector<int64_t>;

// A constant as doubles (int64 values in shapes and masks are far below 2^53), with its type.
struct Values {
  bool integer = false;
  Shape shape;
  std::vector<double> v;
};

constexpr int64_t kMaxElements = int64_t{1} << 22;

absl::Status Error(const Node& node, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("node '", node.name, "' (", node.op, "): folding constants: ", what));
}

int64_t Count(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

Shape Strides(const Shape& s) {
  Shape st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

absl::StatusOr<Values> Read(const Node& node, const Tensor* t) {
  if (t == nullptr) return Error(node, "an input is missing");
  Values out;
  out.shape = t->shape;
  out.integer = t->type == Tensor::Type::kInt64;
  if (out.integer) {
    for (int64_t x : t->ints) {
      if (IsBatchMultiple(x)) return Error(node, "the batch size, known only at run time");
      out.v.push_back(static_cast<double>(x));
    }
  } else {
    out.v.assign(t->floats.begin(), t->floats.end());
  }
  if (static_cast<int64_t>(out.v.size()) != Count(out.shape)) return Error(node, "malformed");
  return out;
}

absl::StatusOr<Tensor> Write(const Node& node, Values values) {
  if (Count(values.shape) != static_cast<int64_t>(values.v.size()) ||
      Count(values.shape) > kMaxElements) {
    return Error(node, "a result too large");
  }
  Tensor t;
  t.shape = values.shape;
  if (values.integer) {
    t.type = Tensor::Type::kInt64;
    for (double x : values.v) {
      if (!(std::abs(x) < 9e18)) return Error(node, "an int64 value out of range");
      t.ints.push_back(static_cast<int64_t>(x));
    }
  } else {
    t.type = Tensor::Type::kFloat;
    for (double x : values.v) t.floats.push_back(static_cast<float>(x));
  }
  return t;
}

// NumPy's broadcast of `shapes`, or an error.
absl::StatusOr<Shape> Broadcast(const Node& node, const std::vector<Shape>& shapes) {
  size_t rank = 0;
  for (const Shape& s : shapes) rank = std::max(rank, s.size());
  Shape out(rank, 1);
  for (const Shape& s : shapes) {
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[rank - s.size() + i];
      if (s[i] == o || s[i] == 1) continue;
      if (o != 1) return Error(node, "shapes that do not broadcast");
      o = s[i];
    }
  }
  if (Count(out) < 0 || Count(out) > kMaxElements) return Error(node, "a result too large");
  return out;
}

// The flat index into `s` (broadcast to `out`) of each element of `out`.
std::vector<int64_t> BroadcastIndex(const Shape& s, const Shape& out) {
  const Shape own = Strides(s);
  Shape st(out.size(), 0);
  const size_t lead = out.size() - s.size();
  for (size_t i = 0; i < s.size(); ++i) st[lead + i] = s[i] == 1 ? 0 : own[i];
  const int64_t n = Count(out);
  std::vector<int64_t> index(n);
  Shape coord(out.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = 0;
    for (size_t a = 0; a < out.size(); ++a) off += coord[a] * st[a];
    index[k] = off;
    for (int a = static_cast<int>(out.size()) - 1; a >= 0; --a) {
      if (++coord[a] < out[a]) break;
      coord[a] = 0;
    }
  }
  return index;
}

absl::StatusOr<int> Axis(const Node& node, int64_t axis, size_t rank) {
  if (axis < 0) axis += static_cast<int64_t>(rank);
  if (axis < 0 || axis >= static_cast<int64_t>(rank)) return Error(node, "an axis out of range");
  return static_cast<int>(axis);
}

absl::StatusOr<Values> Elementwise(const Node& node, const std::vector<Values>& in) {
  std::vector<Shape> shapes;
  for (const Values& x : in) shapes.push_back(x.shape);
  DPTRAIN_ASSIGN_OR_RETURN(const Shape out_shape, Broadcast(node, shapes));
  std::vector<std::vector<int64_t>> index;
  for (const Values& x : in) index.push_back(BroadcastIndex(x.shape, out_shape));
  Values out;
  out.shape = out_shape;
  const int64_t n = Count(out_shape);
  const std::string& op = node.op;
  out.integer = op == "Equal" || op == "Not" || op == "Less" || op == "Greater" ||
                (op == "Where" ? in[1].integer && in[2].integer : in[0].integer);
  for (int64_t k = 0; k < n; ++k) {
    auto at = [&](size_t i) { return in[i].v[index[i][k]]; };
    double r = 0;
    if (op == "Add") r = at(0) + at(1);
    if (op == "Sub") r = at(0) - at(1);
    if (op == "Mul") r = at(0) * at(1);
    if (op == "Div") {
      if (in[0].integer && at(1) == 0) return Error(node, "division by zero");
      r = in[0].integer ? std::trunc(at(0) / at(1)) : at(0) / at(1);
    }
    if (op == "Equal") r = at(0) == at(1);
    if (op == "Less") r = at(0) < at(1);
    if (op == "Greater") r = at(0) > at(1);
    if (op == "Not") r = at(0) == 0;
    if (op == "Pow") r = std::pow(at(0), at(1));
    if (op == "Min") r = std::min(at(0), at(1));
    if (op == "Max") r = std::max(at(0), at(1));
    if (op == "Sqrt") r = std::sqrt(at(0));
    if (op == "Neg") r = -at(0);
    if (op == "Abs") r = std::abs(at(0));
    if (op == "Exp") r = std::exp(at(0));
    if (op == "Log") r = std::log(at(0));
    if (op == "Reciprocal") r = 1.0 / at(0);
    if (op == "Floor") r = std::floor(at(0));
    if (op == "Ceil") r = std::ceil(at(0));
    if (op == "Where") r = at(0) != 0 ? at(1) : at(2);
    out.v.push_back(r);
  }
  return out;
}

}  // namespace

bool IsFoldableOnConstants(const std::string& op) {
  static const std::set<std::string> kOps = {
      "Add",        "Sub",       "Mul",     "Div",      "Equal",     "Less",
      "Greater",    "Not",       "Where",   "Range",    "Slice",     "Transpose",
      "Concat",     "Expand",    "Cast",    "Gather",   "ScatterND", "ConstantOfShape",
      "Reshape",    "Unsqueeze", "Squeeze", "Identity", "Pow",       "Min",
      "Max",        "Sqrt",      "Neg",     "Abs",      "Exp",       "Log",
      "Reciprocal", "Floor",     "Ceil"};
  return kOps.count(op) > 0;
}

absl::StatusOr<Tensor> FoldConstantNode(const Node& node, const std::vector<const Tensor*>& in) {
  const std::string& op = node.op;
  std::vector<Values> x;
  for (const Tensor* t : in) {
    if (t == nullptr) {
      x.emplace_back();  // An absent optional input.
      x.back().shape = {0};
      continue;
    }
    DPTRAIN_ASSIGN_OR_RETURN(Values v, Read(node, t));
    x.push_back(std::move(v));
  }
  if (x.empty()) return Error(node, "no input");
  // An input's values as int64: exact from an int64 tensor (INT64_MAX, an open slice end,
  // does not survive a double), else truncated.
  auto ints = [&](size_t i) {
    Shape out;
    if (i < in.size() && in[i] != nullptr && in[i]->type == Tensor::Type::kInt64)
      return in[i]->ints;
    if (i < x.size()) {
      for (double d : x[i].v) {
        out.push_back(std::abs(d) < 9e18 ? static_cast<int64_t>(d)
                                         : (d < 0 ? -(int64_t{1} << 62) : int64_t{1} << 62));
      }
    }
    return out;
  };
  static const std::set<std::string> kUnary = {"Not", "Sqrt",       "Neg",   "Abs", "Exp",
                                               "Log", "Reciprocal", "Floor", "Ceil"};
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Equal" || op == "Less" ||
      op == "Greater" || op == "Where" || op == "Pow" || op == "Min" || op == "Max" ||
      kUnary.count(op) > 0) {
    const size_t n = kUnary.count(op) > 0 ? 1 : op == "Where" ? 3 : 2;
    if (x.size() != n) return Error(node, "wrong number of inputs");
    DPTRAIN_ASSIGN_OR_RETURN(Values out, Elementwise(node, x));
    return Write(node, std::move(out));
  }
  if (op == "Identity") return Write(node, x[0]);
  if (op == "Cast") {
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t to, IntAttribute(node, "to", 1));
    Values out = x[0];
    out.integer = to != 1 && to != 10 && to != 11;  // float, float16, double: floats.
    if (out.integer) {
      for (double& d : out.v) d = to == 9 ? (d != 0) : std::trunc(d);  // 9: bool.
    }
    return Write(node, std::move(out));
  }
  if (op == "Range") {
    if (x.size() != 3) return Error(node, "Range takes three inputs");
    for (const Values& v : x) {
      if (v.v.size() != 1) return Error(node, "Range takes three scalars");
    }
    const double start = x[0].v.at(0), limit = x[1].v.at(0), delta = x[2].v.at(0);
    if (delta == 0) return Error(node, "a zero delta");
    const double count = std::max(0.0, std::ceil((limit - start) / delta));
    if (count > kMaxElements) return Error(node, "a result too large");
    Values out;
    out.integer = x[0].integer;
    for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) out.v.push_back(start + i * delta);
    out.shape = {static_cast<int64_t>(out.v.size())};
    return Write(node, std::move(out));
  }
  if (op == "ConstantOfShape") {
    if (x[0].shape.size() != 1) return Error(node, "the shape must be 1-D");
    Values out;
    out.shape = ints(0);
    const int64_t n = Count(out.shape);
    if (n < 0 || n > kMaxElements) return Error(node, "a result too large");
    out.integer = node.attributes.count("value_int") > 0;
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t vi, IntAttribute(node, "value_int", 0));
    DPTRAIN_ASSIGN_OR_RETURN(const float vf, FloatAttribute(node, "value_float", 0.0f));
    out.v.assign(n, out.integer ? static_cast<double>(vi) : static_cast<double>(vf));
    return Write(node, std::move(out));
  }
  if (op == "Reshape") {
    Values out = x[0];
    Shape target = ints(1);
    int infer = -1;
    int64_t known = 1;
    for (size_t i = 0; i < target.size(); ++i) {
      if (target[i] == 0 && i < x[0].shape.size()) target[i] = x[0].shape[i];
      if (target[i] == -1 && infer < 0) {
        infer = static_cast<int>(i);
      } else if (target[i] < 0 || __builtin_mul_overflow(known, target[i], &known)) {
        return Error(node, "a bad target");
      }
    }
    const int64_t n = static_cast<int64_t>(out.v.size());
    if (infer >= 0) target[infer] = known > 0 ? n / known : 0;
    if (Count(target) != n) return Error(node, "a target of another size");
    out.shape = target;
    return Write(node, std::move(out));
  }
  if (op == "Unsqueeze" || op == "Squeeze") {
    Shape axes = ints(1);
    if (x.size() < 2 || x[1].shape == Shape{0}) {
      DPTRAIN_ASSIGN_OR_RETURN(axes, IntsAttribute(node, "axes", {}));
    }
    Values out = x[0];
    const size_t rank = op == "Unsqueeze" ? out.shape.size() + axes.size() : out.shape.size();
    std::set<int> marked;
    for (int64_t a : axes) {
      DPTRAIN_ASSIGN_OR_RETURN(const int n, Axis(node, a, rank));
      marked.insert(n);
    }
    if (marked.size() != axes.size()) return Error(node, "an axis given twice");
    Shape shape;
    if (op == "Unsqueeze") {
      size_t next = 0;
      for (size_t i = 0; i < rank; ++i) shape.push_back(marked.count(i) ? 1 : out.shape[next++]);
    } else {
      for (size_t i = 0; i < rank; ++i) {
        const bool drop = axes.empty() ? out.shape[i] == 1 : marked.count(i) > 0;
        if (drop && out.shape[i] != 1) return Error(node, "squeezes an axis not of size 1");
        if (!drop) shape.push_back(out.shape[i]);
      }
    }
    out.shape = shape;
    return Write(node, std::move(out));
  }
  if (op == "Transpose") {
    const Values& in0 = x[0];
    const size_t r = in0.shape.size();
    Shape reversed(r);
    for (size_t i = 0; i < r; ++i) reversed[i] = static_cast<int64_t>(r - 1 - i);
    DPTRAIN_ASSIGN_OR_RETURN(const Shape perm, IntsAttribute(node, "perm", reversed));
    if (perm.size() != r) return Error(node, "a bad perm");
    Shape sorted = perm;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < r; ++i) {
      if (sorted[i] != static_cast<int64_t>(i)) return Error(node, "a bad perm");
    }
    Values out;
    out.integer = in0.integer;
    for (size_t i = 0; i < r; ++i) out.shape.push_back(in0.shape[perm[i]]);
    const Shape st = Strides(in0.shape);
    Shape permuted(r);
    for (size_t i = 0; i < r; ++i) permuted[i] = st[perm[i]];
    const int64_t n = Count(out.shape);
    Shape coord(r, 0);
    for (int64_t k = 0; k < n; ++k) {
      int64_t off = 0;
      for (size_t a = 0; a < r; ++a) off += coord[a] * permuted[a];
      out.v.push_back(in0.v[off]);
      for (int a = static_cast<int>(r) - 1; a >= 0; --a) {
        if (++coord[a] < out.shape[a]) break;
        coord[a] = 0;
      }
    }
    return Write(node, std::move(out));
  }
  if (op == "Concat") {
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t attr, IntAttribute(node, "axis", 0));
    DPTRAIN_ASSIGN_OR_RETURN(const int axis, Axis(node, attr, x[0].shape.size()));
    Values out = x[0];
    out.shape[axis] = 0;
    for (const Values& v : x) {
      Shape a = v.shape, b = x[0].shape;
      if (a.size() != b.size()) return Error(node, "inputs of different ranks");
      a[axis] = b[axis] = 0;
      if (a != b) return Error(node, "inputs of different shapes");
      out.shape[axis] += v.shape[axis];
      if (out.shape[axis] > kMaxElements) return Error(node, "a result too large");
    }
    if (Count(out.shape) < 0 || Count(out.shape) > kMaxElements) {
      return Error(node, "a result too large");
    }
    const int64_t outer = Count(Shape(x[0].shape.begin(), x[0].shape.begin() + axis));
    int64_t inner = 1;
    for (size_t i = axis + 1; i < x[0].shape.size(); ++i) inner *= x[0].shape[i];
    out.v.clear();
    for (int64_t o = 0; o < outer; ++o) {
      for (const Values& v : x) {
        const int64_t block = v.shape[axis] * inner;
        out.v.insert(out.v.end(), v.v.begin() + o * block, v.v.begin() + (o + 1) * block);
      }
    }
    return Write(node, std::move(out));
  }
  if (op == "Expand") {
    // (A tensor of the model never comes here: a class token expanded over the run's batch is
    // the Expand op's, any_shape_ops.h.)
    DPTRAIN_ASSIGN_OR_RETURN(const Shape out_shape, Broadcast(node, {x[0].shape, ints(1)}));
    Values out;
    out.integer = x[0].integer;
    out.shape = out_shape;
    for (int64_t i : BroadcastIndex(x[0].shape, out_shape)) out.v.push_back(x[0].v[i]);
    return Write(node, std::move(out));
  }
  if (op == "Slice" || op == "Gather") {
    const Values& in0 = x[0];
    const size_t r = in0.shape.size();
    if (op == "Gather") {
      if (x.size() != 2) return Error(node, "Gather takes two inputs");
      DPTRAIN_ASSIGN_OR_RETURN(const int64_t attr, IntAttribute(node, "axis", 0));
      DPTRAIN_ASSIGN_OR_RETURN(const int axis, Axis(node, attr, r));
      const int64_t size = in0.shape[axis];
      Values out;
      out.integer = in0.integer;
      out.shape = Shape(in0.shape.begin(), in0.shape.begin() + axis);
      out.shape.insert(out.shape.end(), x[1].shape.begin(), x[1].shape.end());
      out.shape.insert(out.shape.end(), in0.shape.begin() + axis + 1, in0.shape.end());
      const int64_t total = Count(out.shape);
      if (total < 0 || total > kMaxElements) return Error(node, "a result too large");
      const Shape picked = ints(1);
      const int64_t outer = Count(Shape(in0.shape.begin(), in0.shape.begin() + axis));
      const int64_t inner = Count(Shape(in0.shape.begin() + axis + 1, in0.shape.end()));
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i : picked) {
          if (i < -size || i >= size) return Error(node, "an index out of range");
          const int64_t j = i < 0 ? i + size : i;
          const auto from = in0.v.begin() + (o * size + j) * inner;
          out.v.insert(out.v.end(), from, from + inner);
        }
      }
      return Write(node, std::move(out));
    }
    const Shape starts = ints(1), ends = ints(2);
    Shape axes = x.size() > 3 && x[3].shape != Shape{0} ? ints(3) : Shape{};
    Shape steps = x.size() > 4 && x[4].shape != Shape{0} ? ints(4) : Shape{};
    if (axes.empty()) {
      for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    }
    if (steps.empty()) steps.assign(starts.size(), 1);
    if (ends.size() != starts.size() || axes.size() != starts.size() ||
        steps.size() != starts.size()) {
      return Error(node, "starts, ends, axes and steps of different lengths");
    }
    Shape first(r, 0), step(r, 1), count = in0.shape;
    for (size_t i = 0; i < axes.size(); ++i) {
      DPTRAIN_ASSIGN_OR_RETURN(const int a, Axis(node, axes[i], r));
      const int64_t dim = in0.shape[a], st = steps[i];
      if (st == 0 || st == std::numeric_limits<int64_t>::min()) return Error(node, "a bad step");
      auto clamp = [&](int64_t v, int64_t lo, int64_t hi) {
        if (v < 0) v = v < -dim ? lo : v + dim;
        return std::clamp(v, lo, hi);
      };
      const int64_t b = st > 0 ? clamp(starts[i], 0, dim) : clamp(starts[i], -1, dim - 1);
      const int64_t e = st > 0 ? clamp(ends[i], 0, dim) : clamp(ends[i], -1, dim - 1);
      first[a] = b;
      step[a] = st;
      count[a] = st > 0 ? (e > b ? 1 + (e - b - 1) / st : 0) : (b > e ? 1 + (b - e - 1) / -st : 0);
    }
    Values out;
    out.integer = in0.integer;
    out.shape = count;
    const Shape st = Strides(in0.shape);
    const int64_t n = Count(count);
    Shape coord(r, 0);
    for (int64_t k = 0; k < n; ++k) {
      int64_t off = 0;
      for (size_t a = 0; a < r; ++a) off += (first[a] + coord[a] * step[a]) * st[a];
      out.v.push_back(in0.v[off]);
      for (int a = static_cast<int>(r) - 1; a >= 0; --a) {
        if (++coord[a] < count[a]) break;
        coord[a] = 0;
      }
    }
    return Write(node, std::move(out));
  }
  if (op == "ScatterND") {
    if (x.size() != 3) return Error(node, "ScatterND takes three inputs");
    if (node.attributes.count("reduction") > 0) return Error(node, "a reduction unsupported");
    Values out = x[0];
    const Shape& is = x[1].shape;
    if (is.empty()) return Error(node, "scalar indices");
    const int64_t k = is.back();
    if (k < 1 || k > static_cast<int64_t>(out.shape.size())) return Error(node, "bad indices");
    const Shape st = Strides(out.shape);
    int64_t slice = 1;
    for (size_t i = k; i < out.shape.size(); ++i) slice *= out.shape[i];
    const int64_t updates = Count(Shape(is.begin(), is.end() - 1));
    if (static_cast<int64_t>(x[2].v.size()) != updates * slice) return Error(node, "bad updates");
    const Shape idx = ints(1);
    for (int64_t u = 0; u < updates; ++u) {
      int64_t off = 0;
      for (int64_t j = 0; j < k; ++j) {
        int64_t i = idx[u * k + j];
        const int64_t dim = out.shape[j];
        if (i < -dim || i >= dim) return Error(node, "an index out of range");
        off += (i < 0 ? i + dim : i) * st[j];
      }
      std::copy(x[2].v.begin() + u * slice, x[2].v.begin() + (u + 1) * slice, out.v.begin() + off);
    }
    return Write(node, std::move(out));
  }
  return Error(node, "not foldable");
}

}  // namespace graph
}  // namespace dptrain
