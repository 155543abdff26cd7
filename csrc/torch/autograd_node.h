// The backward node of every differentiable op, built the way torch's
// generated autograd builds its own (a Node with the saved state on it,
// edges to the inputs, set_history on the outputs), not through
// torch::autograd::Function, which also records each input's and output's
// metadata, checks views and dirty inputs and wraps every output: 2-3 µs
// more per call than aten on the CPU machine (NOTES.md, issue 9).
//
// A differentiable op is a struct F, the content of an entry of torch's
// derivatives.yaml:
//   static constexpr const char* kName;             // the grad_fn's name
//   static R op_call(args...);                      // the op below autograd; R is
//                                                   // Tensor or std::tuple<Tensor...>
//   static void save(NodeContext*, const R& outputs, args...);   // what the backward needs
//   static variable_list backward(NodeContext*, variable_list grads);
// where backward returns one gradient per argument (undefined for the
// non-tensor ones). Autograd<F>::kernel, with op_call's signature, is the
// op's Autograd-key kernel.
#pragma once

#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

namespace fastreduce {

using torch::autograd::Node;
using torch::autograd::variable_list;

// The Node handle of the torch being built against: std::shared_ptr in
// 2.11 (the GPU image), c10::intrusive_ptr in 2.13 and 2.14. Both branches
// name it through N, so that the one not taken is never compiled.
using NodeHandle = decltype(std::declval<Node&>().getptr());

template <typename N>
NodeHandle make_node(N** raw) {
  using Handle = decltype(std::declval<N&>().getptr());
  if constexpr (std::is_same_v<Handle, std::shared_ptr<Node>>) {
    // torch's deleteNode (found by argument lookup) frees long graphs
    // without deep recursion.
    *raw = new N();
    return Handle(*raw, [](auto* node) { deleteNode(node); });
  } else {
    auto node = c10::make_intrusive<N>();
    *raw = node.get();
    return Handle(std::move(node));
  }
}

// What the ops' forward and backward use of torch's AutogradContext.
class NodeContext {
 public:
  ska::flat_hash_map<std::string, at::IValue> saved_data;

  void save_for_backward(variable_list tensors) { to_save_ = std::move(tensors); }
  // Outputs with no gradient (statistics saved for the backward).
  void mark_non_differentiable(const variable_list& outputs) {
    for (const auto& t : outputs) non_differentiable_.push_back(t.unsafeGetTensorImpl());
  }
  // Off: unused outputs reach backward as undefined gradients, not zeros.
  void set_materialize_grads(bool value) { materialize_grads_ = value; }
  variable_list get_saved_variables() const {
    variable_list tensors;
    tensors.reserve(saved_.size());
    for (const auto& saved : saved_) tensors.push_back(saved.unpack(node_->getptr()));
    return tensors;
  }

 private:
  template <typename F>
  friend struct OpNode;
  template <typename F>
  friend struct OpFunction;

  // The outputs join the graph: differentiable ones get this node as
  // grad_fn, the rest a placeholder input, so grads[i] is output i's.
  void wrap_outputs(const NodeHandle& node, c10::ArrayRef<at::Tensor> outputs) {
    TORCH_INTERNAL_ASSERT(outputs.size() <= 64);
    for (size_t i = 0; i < outputs.size(); ++i) {
      const at::Tensor& out = outputs[i];
      const bool marked = std::find(non_differentiable_.begin(), non_differentiable_.end(),
                                    out.unsafeGetTensorImpl()) != non_differentiable_.end();
      if (marked || !torch::autograd::isDifferentiableType(out.scalar_type())) {
        node->add_input_metadata(Node::undefined_input());
      } else {
        torch::autograd::set_history(out, node);
        differentiable_ |= uint64_t{1} << i;
      }
    }
    non_differentiable_.clear();
    saved_.reserve(to_save_.size());
    for (const auto& t : to_save_) saved_.emplace_back(t, t.defined() && t.grad_fn().get() == node.get());
    to_save_.clear();
  }

  Node* node_ = nullptr;
  variable_list to_save_;
  c10::SmallVector<const c10::TensorImpl*, 2> non_differentiable_;
  std::vector<torch::autograd::SavedVariable> saved_;
  uint64_t differentiable_ = 0;  // bit i: output i has this node as grad_fn
  bool materialize_grads_ = true;
};

inline bool is_tensor_argument(const at::Tensor&) { return true; }
inline bool is_tensor_argument(const std::optional<at::Tensor>&) { return true; }
template <typename T>
bool is_tensor_argument(const T&) {
  return false;
}

inline void add_edge(torch::autograd::edge_list& edges, const at::Tensor& t) {
  edges.push_back(t.defined() ? torch::autograd::impl::gradient_edge(t) : torch::autograd::Edge());
}
inline void add_edge(torch::autograd::edge_list& edges, const std::optional<at::Tensor>& t) {
  edges.push_back(t.has_value() && t->defined() ? torch::autograd::impl::gradient_edge(*t)
                                                : torch::autograd::Edge());
}
template <typename T>
void add_edge(torch::autograd::edge_list&, const T&) {}

template <typename F>
struct OpNode final : Node {
  NodeContext ctx;
  uint64_t tensor_arguments = 0;  // bit i: forward argument i is a tensor (has an edge)
  size_t arguments = 0;

  std::string name() const override { return F::kName; }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ctx.materialize_grads_) {
      for (size_t i = 0; i < grads.size(); ++i)
        if (!grads[i].defined() && (ctx.differentiable_ >> i & 1)) grads[i] = input_metadata(i).zeros_like();
    }
    variable_list per_argument = F::backward(&ctx, std::move(grads));
    variable_list per_edge;
    per_edge.reserve(num_outputs());
    for (size_t i = 0; i < arguments; ++i)
      if (tensor_arguments >> i & 1) per_edge.push_back(std::move(per_argument[i]));
    return per_edge;
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& saved : ctx.saved_) saved.reset_data();
  }

  // Compiled autograd: the node's identity and saved state key its cache,
  // and apply runs with the saved tensors swapped for the traced ones.
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    args.collect(static_cast<uint64_t>(typeid(F).hash_code()));
    args.collect(std::string(F::kName));
    args.collect(ctx.saved_data);
    args.collect(ctx.saved_, /*is_output=*/true);
    args.collect(ctx.materialize_grads_);
  }
  variable_list apply_with_saved(const variable_list& grads,
                                 torch::dynamo::autograd::SwapSavedVariables& swap) override {
    swap.before(ctx.saved_data);
    swap.before(ctx.saved_);
    variable_list result = apply(variable_list(grads));
    swap.after(ctx.saved_);
    swap.after(ctx.saved_data);
    return result;
  }
};

// Whether a call records a backward node. Dual tensors (forward-mode AD) are
// refused rather than their tangents dropped.
inline bool wants_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
inline bool wants_grad(const std::optional<at::Tensor>& t) { return t.has_value() && wants_grad(*t); }
template <typename T>
bool wants_grad(const T&) {
  return false;
}
inline bool has_forward_grad(const at::Tensor& t) { return t.defined() && t._fw_grad(/*level=*/0).defined(); }
inline bool has_forward_grad(const std::optional<at::Tensor>& t) { return t.has_value() && has_forward_grad(*t); }
template <typename T>
bool has_forward_grad(const T&) {
  return false;
}
template <typename... Args>
bool any_wants_grad(const Args&... args) {
  TORCH_CHECK_NOT_IMPLEMENTED(!(has_forward_grad(args) || ...),
                              "fastreduce: forward-mode AD (dual tensors, torch.func.jvp) is not supported");
  return at::GradMode::is_enabled() && (wants_grad(args) || ...);
}

// An op's outputs as a list (for the graph) and back.
inline std::vector<at::Tensor> output_list(const at::Tensor& out) { return {out}; }
template <typename... T>
std::vector<at::Tensor> output_list(const std::tuple<T...>& outs) {
  return std::apply([](const auto&... t) { return std::vector<at::Tensor>{t...}; }, outs);
}
template <typename R>
R from_output_list(const std::vector<at::Tensor>& outs) {
  if constexpr (std::is_same_v<R, at::Tensor>) {
    return outs[0];
  } else {
    return [&]<size_t... I>(std::index_sequence<I...>) { return R(outs[I]...); }(
        std::make_index_sequence<std::tuple_size_v<R>>());
  }
}

template <typename F>
struct OpFunction {
  template <typename... Args>
  static auto apply(Args&&... args) {
    OpNode<F>* node = nullptr;
    const NodeHandle handle = make_node(&node);
    node->ctx.node_ = node;
    torch::autograd::edge_list edges;
    (add_edge(edges, args), ...);
    node->set_next_edges(std::move(edges));
    static_assert(sizeof...(Args) <= 64);
    node->arguments = sizeof...(Args);
    size_t i = 0;
    ((node->tensor_arguments |= uint64_t{is_tensor_argument(args)} << i++), ...);

    auto outputs = [&] {
      at::AutoDispatchBelowADInplaceOrView below;
      return F::op_call(args...);
    }();
    {
      at::AutoGradMode no_grad(false);
      F::save(&node->ctx, outputs, args...);
    }
    node->ctx.wrap_outputs(handle, output_list(outputs));
    return outputs;
  }
};

// The Autograd-key kernel of F: straight to the op below autograd when no
// input wants a gradient, else through a backward node.
template <typename F, typename Signature = decltype(&F::op_call)>
struct Autograd;
template <typename F, typename R, typename... Args>
struct Autograd<F, R (*)(Args...)> {
  static R kernel(Args... args) {
    if (!any_wants_grad(args...)) {
      at::AutoDispatchBelowADInplaceOrView below;
      return F::op_call(args...);
    }
    return OpFunction<F>::apply(args...);
  }
};

}  // namespace fastreduce
