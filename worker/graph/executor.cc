#include "worker/graph/executor.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/graph/constant_folding.h"
#include "worker/graph/shape_arithmetic.h"
#include "worker/nn/batch_sample.h"

namespace dptrain {
namespace graph {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

absl::Status NodeError(const Node& node, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("node '", node.name, "' (", node.op, "): ", what));
}

// Copies `spec`'s initial value (or fill) to `out`; an error if the sizes disagree.
template <typename T>
absl::Status InitialValue(const Node& node, const NodeTensorSpec& spec, T* out) {
  const int64_t n = spec.size();
  if (spec.initial == nullptr) {
    std::fill(out, out + n, static_cast<T>(spec.fill));
    return absl::OkStatus();
  }
  if (spec.initial->type != Tensor::Type::kFloat || spec.initial->num_elements() != n) {
    return NodeError(node, absl::StrCat("'", spec.name, "' is ", spec.initial->ToString(),
                                        ", expected ", n, " floats"));
  }
  std::copy(spec.initial->floats.begin(), spec.initial->floats.end(), out);
  return absl::OkStatus();
}

// The size of axis `axis` of a value of `shape` as a Shape node gives it: kBatchSize for the
// batch axis (known only at run time; BatchMultiple where other axes are merged with it), else
// the axis's size.
absl::StatusOr<int64_t> ShapeEntry(const Node& node, const ValueShape& shape, int64_t axis) {
  const std::optional<int> a = NormalizeAxis(axis, shape.rank());
  if (!a.has_value()) {
    return NodeError(node, absl::StrCat("dimension ", axis, " of a Shape of rank ", shape.rank(),
                                        " is out of range"));
  }
  if (*a != shape.batch_axis) return shape.dims[*a];
  // Merged with other axes (Swin's windows: B_ of [B*9, 49, 96]): the batch size times their
  // count, which a Reshape places again by the elements in front of it.
  const int64_t k = shape.batch_outer * shape.batch_inner;
  if (k > kMaxBatchFactor) {
    return NodeError(node, absl::StrCat("reads axis ", *a, " of a value of shape ",
                                        shape.ToString(), ": too many axes merged with the batch"));
  }
  return BatchMultiple(k);
}

// Gather of dimensions of a Shape (of a value of `shape`), axis 0, constant indices.
absl::StatusOr<Tensor> GatherShape(const Node& node, const ValueShape& shape,
                                   const Tensor* indices) {
  DPTRAIN_ASSIGN_OR_RETURN(const int64_t axis, IntAttribute(node, "axis", 0));
  if (axis != 0 || indices == nullptr || indices->type != Tensor::Type::kInt64 ||
      indices->shape.size() > 1) {
    return NodeError(node,
                     "only Gather of constant 0-D or 1-D indices (axis 0) of a Shape is "
                     "supported");
  }
  Tensor out;
  out.type = Tensor::Type::kInt64;
  out.shape = indices->shape;
  for (int64_t i : indices->ints) {
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t entry, ShapeEntry(node, shape, i));
    out.ints.push_back(entry);
  }
  return out;
}

// A Shape node's whole output, as an int64 constant (kBatchSize for the batch).
absl::StatusOr<Tensor> WholeShape(const Node& node, const ValueShape& shape) {
  Tensor whole;
  whole.type = Tensor::Type::kInt64;
  whole.shape = {shape.rank()};
  for (int i = 0; i < shape.rank(); ++i) {
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t entry, ShapeEntry(node, shape, i));
    whole.ints.push_back(entry);
  }
  return whole;
}

// The value of a node whose inputs are all constants: shape arithmetic (its error where neither
// way folds it), else the wider constant folding.
absl::StatusOr<Tensor> FoldConstants(const Node& node, const std::vector<const Tensor*>& in) {
  bool int64 = true;
  for (const Tensor* t : in) int64 = int64 && (t == nullptr || t->type == Tensor::Type::kInt64);
  absl::StatusOr<Tensor> value = absl::InvalidArgumentError("");
  if (int64 && IsShapeArithmetic(node.op)) {
    value = EvaluateShapeArithmetic(node, in);
    if (value.ok() || !IsFoldableOnConstants(node.op)) return value;
  }
  absl::StatusOr<Tensor> wide = FoldConstantNode(node, in);
  if (wide.ok() || value.status().message().empty()) return wide;
  return value;
}

// The shape of a node's output where the op does not say it (NodeImpl::output_shape).
ValueShape DefaultOutputShape(const nn::Dims& output, const ValueShape* input0) {
  if (input0 == nullptr) return ValueShape::BatchFirst(output, 2);
  if (input0->dims_for_ops() == output) return *input0;
  return ValueShape::BatchFirst(output, input0->IsBatchFirst() ? input0->rank() : 2);
}

}  // namespace

template <typename T>
absl::StatusOr<std::unique_ptr<Executor<T>>> Executor<T>::Create(const Graph& graph,
                                                                 const OpRegistry& registry,
                                                                 const ExecutorOptions& options) {
  DPTRAIN_RETURN_IF_ERROR(ValidateGraph(graph));
  std::unique_ptr<Executor<T>> e(new Executor<T>());
  e->input_dims_ = graph.input_dims;
  e->input_ids_ = graph.input_ids;
  e->value_shapes_.push_back(ValueShape::BatchFirst(graph.input_dims, graph.input_rank));

  // Value ids: runtime values only. A node's secondary outputs are "not computed" (-2).
  std::map<std::string, int> ids = {{graph.input, 0}};
  std::map<std::string, std::string> not_computed;  // Value -> why.
  e->value_dims_.push_back(graph.input_dims);
  e->value_producer_.push_back(-1);
  e->value_consumers_.push_back(0);

  // Parameters: name -> every (node, index in its Params()) using it, in node order (a weight
  // tied between several nodes has several).
  struct ParamUse {
    int node;
    int slot;
    NodeTensorSpec spec;
  };
  std::map<std::string, std::vector<ParamUse>> param_uses;
  std::vector<std::vector<NodeTensorSpec>> node_buffers;
  SharedScratch scratch;  // The nodes keep what they take from it.

  // Shape arithmetic (shape_arithmetic.h), evaluated here once: the dims of each Shape node's
  // computed input, and the int64 constants computed from them (or from constants), each a
  // constant of this build rather than a node.
  std::map<std::string, std::pair<ValueShape, std::string>> shapes;  // Value -> (shape, node).
  std::map<std::string, Tensor> folded;
  std::vector<size_t> graph_node;  // Per nodes_ entry: its index in graph.nodes.

  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    if (node.op == "Shape") {
      DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(node, {}));
      auto it = node.inputs.size() == 1 ? ids.find(node.inputs[0]) : ids.end();
      const Tensor* constant = nullptr;
      if (node.inputs.size() == 1) {
        auto f = folded.find(node.inputs[0]);
        constant = f != folded.end() ? &f->second : graph.FindConstant(node.inputs[0]);
      }
      if (it == ids.end() && constant != nullptr) {
        // The shape of a constant, or of one computed here (expand's target, from a Shape).
        Tensor& value = folded[node.outputs[0]];
        value.type = Tensor::Type::kInt64;
        value.ints = constant->shape;
        value.shape = {static_cast<int64_t>(value.ints.size())};
        continue;
      }
      if (it == ids.end()) {
        return NodeError(node, "only the Shape of one computed value is supported");
      }
      shapes[node.outputs[0]] = {e->value_shapes_[it->second], node.name};
      continue;
    }
    if (IsShapeArithmetic(node.op) || IsFoldableOnConstants(node.op)) {
      std::vector<const Tensor*> operands;
      const ValueShape* shape = nullptr;
      bool constant = !node.inputs.empty();
      for (size_t s = 0; s < node.inputs.size() && constant; ++s) {
        const std::string& name = node.inputs[s];
        const Tensor* t = nullptr;
        if (name.empty()) {
          // An absent optional input.
        } else if (auto sh = shapes.find(name); sh != shapes.end()) {
          if (node.op == "Gather" && s == 0) {
            shape = &sh->second.first;  // Entries read one by one (GatherShape).
          } else {
            // The whole shape as an int64 value (x.flatten(2) slices it).
            Tensor& whole = folded[name];
            DPTRAIN_ASSIGN_OR_RETURN(whole, WholeShape(node, sh->second.first));
            t = &whole;
          }
        } else if (auto f = folded.find(name); f != folded.end()) {
          t = &f->second;
        } else if (const NamedConstant* c = graph.FindNamedConstant(name);
                   c != nullptr && (c->value.type == Tensor::Type::kInt64 ||
                                    (!c->state && IsFoldableOnConstants(node.op)))) {
          t = &c->value;  // An int64 constant, or a float one that is not model state.
        } else {
          constant = false;
        }
        operands.push_back(t);
      }
      if (constant && shape != nullptr) {
        DPTRAIN_ASSIGN_OR_RETURN(
            folded[node.outputs[0]],
            GatherShape(node, *shape, operands.size() > 1 ? operands[1] : nullptr));
        continue;
      }
      if (constant && !operands.empty() && operands[0] != nullptr) {
        // Folded here; else an op of the registry may take the constants (Expand of a float
        // tensor of the model), or the error says why neither does.
        absl::StatusOr<Tensor> value = FoldConstants(node, operands);
        if (value.ok()) {
          folded[node.outputs[0]] = *std::move(value);
          continue;
        }
        bool any_float = false;
        for (const Tensor* t : operands) {
          any_float = any_float || (t != nullptr && t->type == Tensor::Type::kFloat);
        }
        if (!any_float || !registry.Has(node.op)) return value.status();
      }
    }
    DPTRAIN_RETURN_IF_ERROR(CheckOpSupported(registry, node));
    NodeContext ctx{node, {}, SplitMix64(options.seed ^ SplitMix64(n)), &scratch};
    NodeState state;
    state.name = node.name;
    state.op = node.op;
    for (size_t slot = 0; slot < node.inputs.size(); ++slot) {
      const std::string& name = node.inputs[slot];
      NodeInput in;
      in.name = name;
      if (!name.empty()) {
        if (auto it = ids.find(name); it != ids.end()) {
          in.dims = e->value_dims_[it->second];
          in.shape = e->value_shapes_[it->second];
          if (!registry.AnyShape(node.op) && !in.shape->IsBatchFirst()) {
            return NodeError(node,
                             absl::StrCat("input '", name, "' has shape ", in.shape->ToString(),
                                          ": this op takes values of rank 2 to 4 "
                                          "with the batch first (B) only"));
          }
          state.inputs.push_back(it->second);
          ++e->value_consumers_[it->second];
        } else if (auto nc = not_computed.find(name); nc != not_computed.end()) {
          return NodeError(
              node, absl::StrCat("input '", name, "' is ", nc->second, ", which is not computed"));
        } else if (auto sh = shapes.find(name); sh != shapes.end()) {
          // Whole, only as a Reshape's or an Expand's target (x.reshape(y.shape), as GroupNorm
          // exports; norm.expand_as(x), as F.normalize does): the batch size and the
          // per-sample dims (a lower rank's trailing 1s give it the same per-sample dims).
          if ((node.op != "Reshape" && node.op != "Expand") || slot != 1) {
            return NodeError(
                node, absl::StrCat("reads the Shape '", name, "' of node '", sh->second.second,
                                   "' other than by Gather or as a Reshape's or an Expand's "
                                   "target: unsupported"));
          }
          // An Expand reads the sizes as a shape of the run's batch: the value's batch must be
          // an axis of its own (no batch, or one merged with another axis, would read as
          // another shape).
          const ValueShape& of = sh->second.first;
          if (node.op == "Expand" &&
              (of.batch_axis < 0 || of.batch_outer != 1 || of.batch_inner != 1)) {
            return NodeError(
                node, absl::StrCat("expands to the Shape of a value of shape ", of.ToString(),
                                   ": unsupported (its batch is not "
                                   "an axis of its own)"));
          }
          Tensor& whole = folded[name];
          DPTRAIN_ASSIGN_OR_RETURN(whole, WholeShape(node, sh->second.first));
          in.constant = &whole;
        } else if (auto f = folded.find(name); f != folded.end()) {
          in.constant = &f->second;
        } else {
          const NamedConstant* c = graph.FindNamedConstant(name);  // ValidateGraph: it is one.
          in.constant = &c->value;
          in.state = c->state;
          in.fixed = c->fixed;
        }
      }
      ctx.inputs.push_back(std::move(in));
    }
    absl::StatusOr<std::unique_ptr<NodeImpl<T>>> impl = registry.Create<T>(ctx);
    if (!impl.ok()) return impl.status();
    state.impl = *std::move(impl);

    const std::vector<NodeTensorSpec> params = state.impl->Params();
    for (size_t s = 0; s < params.size(); ++s) {
      const NodeTensorSpec& spec = params[s];
      if (graph.FindConstant(spec.name) == nullptr) {
        return NodeError(node, absl::StrCat("parameter '", spec.name, "' is not a constant"));
      }
      std::vector<ParamUse>& uses = param_uses[spec.name];
      if (!uses.empty() && uses.front().spec.shape != spec.shape) {
        return NodeError(node,
                         absl::StrCat("parameter '", spec.name, "' is also used by node '",
                                      e->nodes_[uses.front().node].name, "' with another shape"));
      }
      uses.push_back(ParamUse{static_cast<int>(e->nodes_.size()), static_cast<int>(s), spec});
    }
    node_buffers.push_back(state.impl->Buffers());

    state.output = static_cast<int>(e->value_dims_.size());
    ids[node.outputs[0]] = state.output;
    e->value_dims_.push_back(state.impl->output_dims());
    const ValueShape* input0 = nullptr;
    for (const NodeInput& in : ctx.inputs) {
      if (in.shape.has_value() && input0 == nullptr) input0 = &*in.shape;
    }
    std::optional<ValueShape> out_shape = state.impl->output_shape();
    e->value_shapes_.push_back(
        out_shape.has_value() ? *out_shape : DefaultOutputShape(state.impl->output_dims(), input0));
    {
      const ValueShape& out = e->value_shapes_.back();
      int64_t elements = 1;
      bool fits = out.rank() >= 1 && out.rank() <= kMaxRank;
      for (int64_t d : out.dims) {
        fits = fits && d >= 1 && !__builtin_mul_overflow(elements, d, &elements) &&
               elements <= kMaxSampleSize;
      }
      if (!fits) {
        return NodeError(node, absl::StrCat("output of shape ", out.ToString(),
                                            " unsupported (rank 1 to ", kMaxRank,
                                            ", no empty axis, at most 2^31 - 1 elements per "
                                            "sample)"));
      }
    }
    state.batch_first = e->value_shapes_.back().IsBatchFirst() && !state.impl->twin().any_shape;
    for (const NodeInput& in : ctx.inputs) {
      if (in.shape.has_value() && !in.shape->IsBatchFirst()) state.batch_first = false;
    }
    // The producer's position among the built nodes (Backward compares it with theirs), not
    // in the graph, whose Shape and shape-arithmetic nodes were evaluated away.
    e->value_producer_.push_back(static_cast<int>(e->nodes_.size()));
    e->value_consumers_.push_back(0);
    for (size_t o = 1; o < node.outputs.size(); ++o) {
      if (!node.outputs[o].empty()) {
        not_computed[node.outputs[o]] =
            absl::StrCat("output ", o, " of node '", node.name, "' (", node.op, ")");
      }
    }
    e->nodes_.push_back(std::move(state));
    graph_node.push_back(n);
  }

  // A parameter may not double as a plain constant operand of a node that does not learn it.
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    for (const std::string& name : node.inputs) {
      auto it = param_uses.find(name);
      if (it == param_uses.end()) continue;
      bool learns = false;
      for (const ParamUse& use : it->second) learns = learns || graph_node[use.node] == n;
      if (!learns) {
        return NodeError(node, absl::StrCat("reads '", name, "', a parameter of node '",
                                            e->nodes_[it->second.front().node].name,
                                            "', as a plain operand: unsupported"));
      }
    }
  }

  auto output = ids.find(graph.output);
  if (output == ids.end()) {
    const auto nc = not_computed.find(graph.output);
    return absl::InvalidArgumentError(
        absl::StrCat("graph output '", graph.output, "' is ",
                     nc != not_computed.end() ? nc->second : std::string("not a node output"),
                     ", which is not computed"));
  }
  e->output_ = output->second;
  ++e->value_consumers_[e->output_];

  // Parameters in the order of the graph's constants (reserved at once: growing a vector of
  // hundreds of MB step by step leaves its old blocks in the heap, RSS that never goes back).
  int64_t total_params = 0;
  for (const auto& [name, uses] : param_uses) total_params += uses.front().spec.size();
  e->initial_params_.reserve(total_params);
  for (const NamedConstant& c : graph.constants) {
    auto it = param_uses.find(c.name);
    if (it == param_uses.end()) continue;
    const ParamUse& first = it->second.front();
    const int64_t size = first.spec.size();
    // Every use reads the one copy; the first (in node order) writes its gradient there, each
    // later one into a buffer of its own that Backward adds in (a tied weight).
    for (const ParamUse& use : it->second) {
      NodeState& state = e->nodes_[use.node];
      if (state.param_offsets.empty()) {
        const size_t slots = state.impl->Params().size();
        state.param_offsets.assign(slots, -1);
        state.param_sizes.assign(slots, 0);
        state.param_tied.assign(slots, -1);
      }
      state.param_offsets[use.slot] = e->num_params_;
      state.param_sizes[use.slot] = size;
      if (&use != &first) {
        state.param_tied[use.slot] = static_cast<int>(e->tied_grads_.size());
        e->tied_grads_.push_back({e->num_params_, std::vector<T>(size)});
      }
    }
    e->params_.push_back({c.name, first.spec.shape, e->num_params_, size});
    e->initial_params_.resize(e->num_params_ + size);
    DPTRAIN_RETURN_IF_ERROR(InitialValue(graph.nodes[graph_node[first.node]], first.spec,
                                         e->initial_params_.data() + e->num_params_));
    e->num_params_ += size;
  }

  // Buffers node by node. A buffer that a later node of the same op uses too (a batch norm
  // applied twice: its running statistics) is laid out once and bound to both, which update it
  // in node order, as PyTorch's module called twice does.
  struct BufferUse {
    int node;
    int64_t offset, size;
  };
  std::map<std::string, BufferUse> buffer_names;
  for (size_t n = 0; n < e->nodes_.size(); ++n) {
    for (const NodeTensorSpec& spec : node_buffers[n]) {
      if (param_uses.count(spec.name) > 0) {
        return NodeError(graph.nodes[graph_node[n]],
                         absl::StrCat("buffer '", spec.name, "' is also a parameter"));
      }
      if (auto it = buffer_names.find(spec.name); it != buffer_names.end()) {
        const BufferUse& first = it->second;
        if (graph.nodes[graph_node[first.node]].op != graph.nodes[graph_node[n]].op ||
            first.size != spec.size()) {
          return NodeError(
              graph.nodes[graph_node[n]],
              absl::StrCat("buffer '", spec.name, "' is also used by node '",
                           graph.nodes[graph_node[first.node]].name, "' (",
                           graph.nodes[graph_node[first.node]].op, ") in another way"));
        }
        e->nodes_[n].buffer_offsets.push_back(first.offset);
        continue;
      }
      const int64_t size = spec.size();
      buffer_names[spec.name] = BufferUse{static_cast<int>(n), e->num_buffers_, size};
      e->nodes_[n].buffer_offsets.push_back(e->num_buffers_);
      e->buffers_.push_back({spec.name, spec.shape, e->num_buffers_, size});
      e->initial_buffers_.resize(e->num_buffers_ + size);
      DPTRAIN_RETURN_IF_ERROR(InitialValue(graph.nodes[graph_node[n]], spec,
                                           e->initial_buffers_.data() + e->num_buffers_));
      e->num_buffers_ += size;
    }
  }

  // Entries of the model's state that no node learns or keeps (an int64 index buffer read only
  // through shape arithmetic, as Swin's and BEiT's relative_position_index): carried as fixed
  // buffers, so that the saved weights hold every state_dict entry and load back strictly.
  for (const NamedConstant& c : graph.constants) {
    if (!c.state || param_uses.count(c.name) > 0 || buffer_names.count(c.name) > 0) continue;
    const int64_t size = c.value.num_elements();
    if (size < 1 ||
        size != static_cast<int64_t>(c.value.type == Tensor::Type::kFloat ? c.value.floats.size()
                                                                          : c.value.ints.size())) {
      continue;
    }
    e->buffers_.push_back({c.name, c.value.shape, e->num_buffers_, size});
    e->initial_buffers_.resize(e->num_buffers_ + size);
    T* out = e->initial_buffers_.data() + e->num_buffers_;
    if (c.value.type == Tensor::Type::kFloat) {
      std::copy(c.value.floats.begin(), c.value.floats.end(), out);
    } else {
      std::transform(c.value.ints.begin(), c.value.ints.end(), out,
                     [](int64_t v) { return static_cast<T>(v); });
    }
    e->num_buffers_ += size;
  }

  // What every node computes with: the options' pool and algorithm, and two input-gradient
  // buffers that all share, as a Sequential's layers do (Backward keeps them safe: see
  // Accumulate).
  e->ctx_.pool = options.pool;
  e->ctx_.conv_algorithm = options.conv_algorithm;
  e->ctx_.grad_buffers = &e->grad_pair_;

  // A bound that every id of the input must be below, where only embedding lookups read it.
  if (graph.input_ids) {
    int64_t limit = std::numeric_limits<int64_t>::max();
    for (const NodeState& node : e->nodes_) {
      for (int v : node.inputs) {
        if (v != 0) continue;
        const int64_t rows = node.impl->ids_below();
        limit = rows > 0 ? std::min(limit, rows) : 0;
      }
    }
    e->input_id_limit_ = limit == std::numeric_limits<int64_t>::max() ? 0 : limit;
  }

  const size_t num_values = e->value_dims_.size();
  e->values_.resize(num_values);
  e->grad_views_.resize(num_values);
  e->grad_ready_.resize(num_values);
  e->requires_grad_.resize(num_values);
  e->grad_sums_.resize(num_values);
  return e;
}

template <typename T>
T* Executor<T>::GradOf(NodeState& node, size_t slot) {
  const int tied = node.param_tied[slot];
  return tied < 0 ? grads_ + node.param_offsets[slot] : tied_grads_[tied].grad.data();
}

template <typename T>
nn::Dims Executor<T>::output_dims() const {
  return value_dims_[output_];
}

template <typename T>
void Executor<T>::Bind(const T* params, T* grads, T* buffers) {
  grads_ = grads;
  for (NodeState& node : nodes_) {
    std::vector<const T*> values;
    std::vector<T*> grad_ptrs;
    for (size_t s = 0; s < node.param_offsets.size(); ++s) {
      values.push_back(params + node.param_offsets[s]);
      grad_ptrs.push_back(GradOf(node, s));
    }
    node.impl->BindParams(values, grad_ptrs);
    std::vector<T*> buffer_ptrs;
    for (int64_t offset : node.buffer_offsets) buffer_ptrs.push_back(buffers + offset);
    node.impl->BindBuffers(buffer_ptrs);
  }
}

template <typename T>
absl::StatusOr<nn::TensorRef<T>> Executor<T>::Forward(const T* input, int batch, bool training) {
  values_[0] = {input, batch, input_dims_};
  std::vector<nn::TensorRef<T>> inputs;
  for (NodeState& node : nodes_) {
    inputs.clear();
    for (int v : node.inputs) inputs.push_back(values_[v]);
    if (inputs.empty()) inputs.push_back(values_[0]);  // For the batch size (node.h).
    if (absl::Status s = node.impl->CheckInputs(inputs, training); !s.ok()) {
      return nn::Prefixed(s, absl::StrCat("node '", node.name, "' (", node.op, "): "));
    }
    values_[node.output] = node.impl->Forward(ctx_, inputs, training);
  }
  return values_[output_];
}

template <typename T>
void Executor<T>::Accumulate(int v, nn::TensorRef<T> grad, bool consumed_next) {
  if (!grad_ready_[v]) {
    grad_ready_[v] = true;
    // The only contribution: no copy, unless it lies in the shared pair and another node's
    // backward runs before v's producer reads it (that node writes the pair).
    if (value_consumers_[v] == 1 && (consumed_next || !grad_pair_.Contains(grad.data))) {
      grad_views_[v] = grad;
      return;
    }
    T* sum = nn::EnsureSize(grad_sums_[v], grad.size());
    std::copy(grad.data, grad.data + grad.size(), sum);
    grad_views_[v] = {sum, grad.batch, value_dims_[v]};
    return;
  }
  T* sum = grad_sums_[v].data();
  for (int64_t i = 0; i < grad.size(); ++i) sum[i] += grad.data[i];
}

template <typename T>
nn::TensorRef<T> Executor<T>::Backward(nn::TensorRef<T> grad_output, bool need_input_grad) {
  // Which values need a gradient: the input if asked, and what a node with parameters or an
  // input that needs one computes.
  requires_grad_[0] = need_input_grad;
  for (const NodeState& node : nodes_) {
    bool needed = !node.param_offsets.empty();
    for (int v : node.inputs) needed = needed || requires_grad_[v];
    requires_grad_[node.output] = needed;
  }
  std::fill(grad_ready_.begin(), grad_ready_.end(), false);
  Accumulate(output_, grad_output, /*consumed_next=*/true);

  std::vector<bool> need;
  for (int n = static_cast<int>(nodes_.size()) - 1; n >= 0; --n) {
    NodeState& node = nodes_[n];
    if (!requires_grad_[node.output]) continue;
    if (!grad_ready_[node.output]) {
      // The output does not reach the loss: the parameters' gradients are zero.
      for (size_t s = 0; s < node.param_offsets.size(); ++s) {
        T* g = GradOf(node, s);
        std::fill(g, g + node.param_sizes[s], T(0));
      }
      continue;
    }
    need.clear();
    for (int v : node.inputs) need.push_back(requires_grad_[v]);
    const std::vector<nn::TensorRef<T>> grads =
        node.impl->Backward(ctx_, grad_views_[node.output], need);
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      // Node n - 1 is the next to run backward (value 0, the input's, goes to the caller). An
      // empty view adds nothing (a node that reads the input for its batch size only).
      const int v = node.inputs[i];
      if (need[i] && grads[i].data != nullptr) Accumulate(v, grads[i], value_producer_[v] == n - 1);
    }
  }
  // Tied weights: every later use's gradient into the first's (the one in the flat buffer), in
  // node order, whatever ran first.
  for (const TiedGrad& tied : tied_grads_) {
    T* g = grads_ + tied.offset;
    for (size_t i = 0; i < tied.grad.size(); ++i) g[i] += tied.grad[i];
  }
  if (!need_input_grad) return {};
  if (!grad_ready_[0]) {
    // The output does not depend on the input (a constant graph): a zero gradient.
    T* zero = nn::EnsureSize(grad_sums_[0], values_[0].size());
    std::fill(zero, zero + values_[0].size(), T(0));
    return {zero, values_[0].batch, input_dims_};
  }
  return grad_views_[0];
}

template class Executor<float>;
template class Executor<double>;

}  // namespace graph
}  // namespace dptrain
