#include "worker/graph/value_shape.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/graph/graph.h"

namespace dptrain {
namespace graph {
namespace {

// The product of v[begin, end); -1 where it overflows (sizes here are positive, or one -1).
int64_t Product(const std::vector<int64_t>& v, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < v.size(); ++i) {
    if (__builtin_mul_overflow(p, v[i], &p)) return -1;
  }
  return p;
}

// Today's rule for a batch-first input (kept so that every graph that imported before still
// does): the target's first entry is the batch whatever its value; the rest, with 0 = copy the
// input's axis and one -1 = inferred, holds a sample's elements.
absl::StatusOr<ValueShape> BatchFirstReshape(const ValueShape& in,
                                             const std::vector<int64_t>& target) {
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("target shape ", ShapeText(target),
                                                   " for input ", in.dims_for_ops().ToString(),
                                                   " of each sample unsupported: ", why));
  };
  if (target.size() < 2 || target.size() > static_cast<size_t>(kMaxRank)) {
    return refuse(absl::StrCat("expected the batch followed by 1 to ", kMaxRank - 1, " dims"));
  }
  for (int64_t d : target) {
    if (d != kBatchSize && d > kMaxAxisSize) return refuse("a dimension too large");
  }
  std::vector<int64_t> dims(target.begin() + 1, target.end());
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == 0) {  // allowzero = 0: copy the input's dimension.
      if (i + 1 >= in.dims.size()) return refuse("copies an axis the input lacks");
      dims[i] = in.dims[i + 1];
    }
    if (dims[i] == -1) {
      if (infer >= 0) return refuse("two -1");
      infer = static_cast<int>(i);
    } else if (dims[i] < 1) {
      return refuse("negative dimension");
    } else {
      known *= dims[i];
    }
  }
  const int64_t sample = in.per_sample();
  if (infer >= 0) {
    if (sample % known != 0) return refuse("does not divide the sample");
    dims[infer] = sample / known;
    known = sample;
  }
  if (known != sample) return refuse("changes the number of elements of a sample");
  ValueShape out;
  out.dims.push_back(1);
  out.dims.insert(out.dims.end(), dims.begin(), dims.end());
  return out;
}

}  // namespace

int64_t ValueShape::per_sample() const { return Product(dims, 0, dims.size()); }

bool ValueShape::IsBatchFirst() const {
  return batch_axis == 0 && batch_outer == 1 && batch_inner == 1 && rank() >= 2 && rank() <= 4;
}

nn::Dims ValueShape::dims_for_ops() const {
  if (!IsBatchFirst()) return nn::Dims{static_cast<int>(per_sample()), 1, 1};
  nn::Dims d;
  int* out[3] = {&d.c, &d.h, &d.w};
  for (int i = 1; i < rank(); ++i) *out[i - 1] = static_cast<int>(dims[i]);
  return d;
}

std::vector<int64_t> ValueShape::Concrete(int64_t batch) const {
  std::vector<int64_t> c = dims;
  if (batch_axis >= 0) c[batch_axis] = batch_outer * batch * batch_inner;
  return c;
}

int64_t ValueShape::AxisSize(int axis, int64_t batch) const {
  return axis == batch_axis ? batch_outer * batch * batch_inner : dims[axis];
}

std::string ValueShape::ToString() const {
  std::vector<std::string> parts;
  for (int i = 0; i < rank(); ++i) {
    if (i != batch_axis) {
      parts.push_back(absl::StrCat(dims[i]));
      continue;
    }
    std::string s = "B";
    if (batch_outer != 1) s = absl::StrCat(batch_outer, "*", s);
    if (batch_inner != 1) absl::StrAppend(&s, "*", batch_inner);
    parts.push_back(s);
  }
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

ValueShape ValueShape::BatchFirst(const nn::Dims& d, int rank) {
  const int64_t per_sample[3] = {d.c, d.h, d.w};
  int needed = 2;
  for (int i = 0; i < 3; ++i) {
    if (per_sample[i] != 1) needed = i + 2;
  }
  rank = std::max(std::min(rank, 4), needed);
  ValueShape s;
  s.dims.push_back(1);
  for (int i = 1; i < rank; ++i) s.dims.push_back(per_sample[i - 1]);
  return s;
}

std::optional<int> NormalizeAxis(int64_t axis, int rank) {
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return std::nullopt;
  return static_cast<int>(axis);
}

absl::StatusOr<ValueShape> ReshapedShape(const ValueShape& in, const std::vector<int64_t>& target) {
  if (in.batch_axis < 0) {
    // A value without a batch (computed from tensors of the model): a plain reshape.
    auto refuse = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("target shape ", ShapeText(target),
                                                     " for a value of shape ", in.ToString(),
                                                     " unsupported: ", why));
    };
    if (target.empty() || target.size() > static_cast<size_t>(kMaxRank)) {
      return refuse(absl::StrCat("expected 1 to ", kMaxRank, " dims"));
    }
    ValueShape out;
    out.batch_axis = -1;
    out.dims = target;
    int infer = -1;
    for (size_t i = 0; i < target.size(); ++i) {
      int64_t& d = out.dims[i];
      if (IsBatchMultiple(d)) return refuse("the batch in a value without one");
      if (d == 0) {
        if (i >= in.dims.size()) return refuse("copies an axis the input lacks");
        d = in.dims[i];
      } else if (d == -1 && infer < 0) {
        infer = static_cast<int>(i);
      } else if (d < 1 || d > kMaxAxisSize) {
        return refuse("a dimension out of range");
      }
    }
    if (infer >= 0) {
      std::vector<int64_t> others = out.dims;
      others.erase(others.begin() + infer);
      const int64_t known = Product(others, 0, others.size());
      if (known < 1 || in.per_sample() % known != 0) return refuse("does not divide");
      out.dims[infer] = in.per_sample() / known;
    }
    if (Product(out.dims, 0, out.dims.size()) != in.per_sample()) {
      return refuse("changes the number of elements");
    }
    return out;
  }
  absl::Status first_error;
  if (in.batch_axis == 0 && in.batch_outer == 1 && in.batch_inner == 1) {
    // A batch-first value (any rank): the rule graphs have always imported with, which reads
    // the target's first entry as the batch; where the rest does not hold a sample, the batch
    // may have been merged (x.view(B * H, N, d)): found below as for any other value.
    absl::StatusOr<ValueShape> s = BatchFirstReshape(in, target);
    if (s.ok()) return s;
    first_error = s.status();
  }
  const bool symbolic = std::any_of(target.begin(), target.end(), IsBatchMultiple);
  auto refuse = [&](absl::string_view why) {
    if (!first_error.ok() && !symbolic) return first_error;
    return absl::InvalidArgumentError(absl::StrCat("target shape ", ShapeText(target),
                                                   " for a value of shape ", in.ToString(),
                                                   " unsupported: ", why));
  };
  if (target.empty() || target.size() > static_cast<size_t>(kMaxRank)) {
    return refuse(absl::StrCat("expected 1 to ", kMaxRank, " dims"));
  }
  // The input's elements before and after the batch in its row-major order.
  const int64_t before = Product(in.dims, 0, in.batch_axis) * in.batch_outer;
  const int64_t after = in.batch_inner * Product(in.dims, in.batch_axis + 1, in.dims.size());
  for (int64_t d : target) {
    if (!IsBatchMultiple(d) && d > kMaxAxisSize) return refuse("a dimension too large");
  }
  ValueShape out;
  out.dims = target;
  int batch = -1;  // The axis holding the batch, where the target says which.
  int64_t factor = 0;  // Its other elements (B*k: k), when the target says only their count.
  int infer = -1;
  for (int i = 0; i < static_cast<int>(target.size()); ++i) {
    int64_t& d = out.dims[i];
    if (IsBatchMultiple(d) || (d == 0 && i == in.batch_axis)) {
      if (batch >= 0) return refuse("the batch twice");
      batch = i;
      if (d == 0) {
        out.batch_outer = in.batch_outer;
        out.batch_inner = in.batch_inner;
      } else {
        factor = BatchFactor(d);
      }
      d = d == 0 ? out.batch_outer * out.batch_inner : factor;
    } else if (d == 0) {
      if (i >= in.rank()) return refuse("copies an axis the input lacks");
      d = in.dims[i];
    } else if (d == -1) {
      if (infer >= 0) return refuse("two -1");
      infer = i;
    } else if (d < 1) {
      return refuse("negative dimension");
    }
  }
  if (batch >= 0) {
    if (infer >= 0) {
      std::vector<int64_t> others = out.dims;
      others.erase(others.begin() + infer);
      const int64_t known = Product(others, 0, others.size());
      if (known <= 0 || (before * after) % known != 0) return refuse("does not divide");
      out.dims[infer] = before * after / known;
    }
    if (Product(out.dims, 0, out.dims.size()) != before * after) {
      return refuse("changes the number of elements of a sample");
    }
    const int64_t lead = Product(out.dims, 0, batch);
    if (factor > 0) {
      // B*k: the elements before the batch in this axis are the input's before it that the
      // axes in front do not hold (bsz * num_heads: the batch first; tgt_len * bsz: last).
      if (lead <= 0 || before % lead != 0 || factor % (before / lead) != 0) {
        return refuse("moves the batch's elements");
      }
      out.batch_outer = before / lead;
      out.batch_inner = factor / out.batch_outer;
    }
    if (lead * out.batch_outer != before) return refuse("moves the batch's elements");
    out.batch_axis = batch;
    return out;
  }
  if (infer == 0 && before == 1) {
    // x.view(-1, heads, N, N) of [B, windows, heads, N, N]: the batch leads the flattened
    // first axis (nothing of the sample before it), merged with what the rest does not hold.
    std::vector<int64_t> others(out.dims.begin() + 1, out.dims.end());
    const int64_t known = Product(others, 0, others.size());
    if (known >= 1 && after % known == 0) {
      out.dims[0] = after / known;
      out.batch_axis = 0;
      out.batch_outer = 1;
      out.batch_inner = after / known;
      return out;
    }
  }
  if (infer >= 0) {
    return refuse("both the batch and a -1 to infer (export with a dynamic batch axis)");
  }
  // A graph exported with a fixed batch: the export's batch size is the factor the element
  // count says; the batch lies in the one axis whose leading elements are the input's before
  // its batch.
  // (out.dims: the target with its 0s copied from the input.)
  const std::vector<int64_t>& sizes = out.dims;
  const int64_t total = Product(sizes, 0, sizes.size());
  if (total < 1 || before * after < 1 || total % (before * after) != 0) {
    return refuse("does not keep the elements of a sample");
  }
  const int64_t export_batch = total / (before * after);
  std::vector<ValueShape> found;
  for (int k = 0; k < static_cast<int>(sizes.size()); ++k) {
    const int64_t lead = Product(sizes, 0, k);
    if (lead < 1 || before % lead != 0) continue;
    const int64_t outer = before / lead;
    if (sizes[k] % (outer * export_batch) != 0) continue;
    const int64_t inner = sizes[k] / (outer * export_batch);
    if (inner * Product(sizes, k + 1, sizes.size()) != after) continue;
    ValueShape s;
    s.dims = sizes;
    s.dims[k] = outer * inner;
    s.batch_axis = k;
    s.batch_outer = outer;
    s.batch_inner = inner;
    found.push_back(s);
  }
  if (found.empty()) return refuse("splits the batch");
  if (found.size() > 1) {
    return refuse(absl::StrCat("cannot tell which axis holds the batch (", found[0].ToString(),
                               " or ", found[1].ToString(),
                               "): export with a batch size that no axis of the model has, "
                               "or with a dynamic batch axis"));
  }
  return found[0];
}

}  // namespace graph
}  // namespace dptrain
