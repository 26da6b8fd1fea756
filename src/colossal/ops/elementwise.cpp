// Elementwise ops: dtype promotion, broadcasting, kernel dispatch and the derivatives.
#include "colossal/ops/elementwise.h"

#include <cmath>

#include "colossal/autograd/function.h"
#include "colossal/autograd/grad_mode.h"
#include "colossal/core/view.h"
#include "colossal/ops/elementwise_kernels.h"
#include "colossal/ops/reduction.h"
#include "colossal/ops/shape.h"

namespace colossal::ops {

constinit core::DispatchStub<BinaryKernel> binary_stub("elementwise_binary");
constinit core::DispatchStub<UnaryKernel> unary_stub("elementwise_unary");
constinit core::DispatchStub<UnaryBackwardKernel> unary_backward_stub("elementwise_unary_backward");
constinit core::DispatchStub<TernaryKernel> ternary_stub("elementwise_ternary");

using autograd::Node;
using autograd::record;

namespace {

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add:
      return "add";
    case BinaryOp::sub:
      return "sub";
    case BinaryOp::mul:
      return "mul";
    case BinaryOp::div:
      return "div";
    case BinaryOp::pow:
      return "pow";
    case BinaryOp::maximum:
      return "maximum";
    case BinaryOp::minimum:
      return "minimum";
    case BinaryOp::eq:
      return "eq";
    case BinaryOp::ne:
      return "ne";
    case BinaryOp::lt:
      return "lt";
    case BinaryOp::le:
      return "le";
    case BinaryOp::gt:
      return "gt";
    case BinaryOp::ge:
      return "ge";
  }
  return "binary";
}

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg:
      return "neg";
    case UnaryOp::exp:
      return "exp";
    case UnaryOp::log:
      return "log";
    case UnaryOp::tanh:
      return "tanh";
    case UnaryOp::sqrt:
      return "sqrt";
    case UnaryOp::rsqrt:
      return "rsqrt";
    case UnaryOp::abs:
      return "abs";
    case UnaryOp::relu:
      return "relu";
    case UnaryOp::sigmoid:
      return "sigmoid";
    case UnaryOp::silu:
      return "silu";
    case UnaryOp::gelu:
      return "gelu";
    case UnaryOp::gelu_tanh:
      return "gelu_tanh";
    case UnaryOp::pow_scalar:
      return "pow";
    case UnaryOp::clamp:
      return "clamp";
    case UnaryOp::affine:
      return "affine";
  }
  return "unary";
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  COLOSSAL_CHECK(a.defined() && b.defined(), "{}: undefined operand", op);
  COLOSSAL_CHECK(a.device() == b.device(), "{}: operands on different devices: {} (shape {}) and {} (shape {})", op,
                 a.device(), a.shape(), b.device(), b.shape());
}

bool is_comparison(BinaryOp op) {
  return op >= BinaryOp::eq;
}

/// Broadcasts, promotes and runs the binary kernel; no autograd.
Tensor binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, double alpha) {
  const char* name = binary_name(op);
  check_same_device(a, b, name);
  const Shape shape = core::broadcast_shapes(a.shape(), b.shape(), name);
  const DType compute = core::promote_types(a.dtype(), b.dtype());
  COLOSSAL_CHECK(compute != DType::boolean || is_comparison(op), "{}: not defined for bool tensors", name);
  const DType out_dtype = is_comparison(op) ? DType::boolean : compute;
  Tensor out = core::empty(shape, TensorOptions(out_dtype, a.device()));
  if (out.numel() == 0) return out;
  const Tensor a_in = core::expand_raw(a.dtype() == compute ? a : core::cast_raw(a, compute), shape);
  const Tensor b_in = core::expand_raw(b.dtype() == compute ? b : core::cast_raw(b, compute), shape);
  binary_stub(a.device(), op, out, a_in, b_in, alpha);
  return out;
}

Tensor unary_forward(UnaryOp op, const Tensor& x, double p0 = 0.0, double p1 = 0.0) {
  const char* name = unary_name(op);
  COLOSSAL_CHECK(x.defined(), "{}: undefined operand", name);
  const bool integer_ok =
      op == UnaryOp::neg || op == UnaryOp::abs || op == UnaryOp::relu || op == UnaryOp::clamp || op == UnaryOp::affine;
  COLOSSAL_CHECK(core::is_floating(x.dtype()) || (integer_ok && core::is_integral(x.dtype())),
                 "{}: expected a floating tensor, got {} (shape {})", name, x.dtype(), x.shape());
  Tensor out = core::empty(x.shape(), TensorOptions(x.dtype(), x.device()));
  if (out.numel() > 0) unary_stub(x.device(), op, out, x, p0, p1);
  return out;
}

// Note [What elementwise backward saves]
// A node's saved tensors stay alive until backward reaches it, so each op saves only what its
// derivative reads: add and sub nothing (their gradients need only the inputs' shapes and dtypes),
// a unary op either its input or its output, never both. relu saves its output: relu'(x) is 1
// exactly where relu(x) > 0, so the backward kernel, which tests x > 0, gives the same gradients
// from y, and y is the tensor the next layer saves anyway (a ResNet's conv input; the batch-norm
// output before it is then freed). Saving both inputs of every residual add and both sides of
// every relu held about twice the activations torch holds for ResNet-50.

/// Which tensor a unary op's derivative reads (see the note above).
enum class UnarySaves { nothing, input, output };
UnarySaves unary_saves(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg:
    case UnaryOp::affine:
      return UnarySaves::nothing;
    case UnaryOp::exp:
    case UnaryOp::tanh:
    case UnaryOp::sqrt:
    case UnaryOp::rsqrt:
    case UnaryOp::sigmoid:
    case UnaryOp::relu:
      return UnarySaves::output;
    case UnaryOp::log:
    case UnaryOp::abs:
    case UnaryOp::clamp:
    case UnaryOp::silu:
    case UnaryOp::gelu:
    case UnaryOp::gelu_tanh:
    case UnaryOp::pow_scalar:
      return UnarySaves::input;
  }
  return UnarySaves::input;
}

/// Runs a unary op and records its fused backward kernel, saving only the tensor the derivative
/// reads; the kernel's other operand slot gets the same tensor (its value is not read).
Tensor unary(UnaryOp op, const Tensor& x, double p0 = 0.0, double p1 = 0.0) {
  Tensor y = unary_forward(op, x, p0, p1);
  const UnarySaves saves = unary_saves(op);
  Tensor saved = saves == UnarySaves::input ? x.detach() : saves == UnarySaves::output ? y.detach() : Tensor();
  record(unary_name(op), {x}, {y},
         [op, saved = std::move(saved), shape = x.shape(), options = TensorOptions(x.dtype(), x.device()), p0, p1](
             const std::vector<Tensor>& g, const Node&) {
           Tensor grad_x = core::empty(shape, options);
           if (grad_x.numel() > 0) {
             const Tensor& operand = saved.defined() ? saved : g[0];
             unary_backward_stub(options.device, op, grad_x, g[0], operand, operand, p0, p1);
           }
           return std::vector<Tensor>{grad_x};
         });
  return y;
}

/// What a gradient needs to know of an input it is reduced onto: shape and dtype, not the values.
struct InputMeta {
  Shape shape;
  DType dtype;
  explicit InputMeta(const Tensor& t) : shape(t.shape()), dtype(t.dtype()) {}
};

/// Reduces a gradient to an input's shape and dtype.
Tensor reduce_grad(const Tensor& grad, const InputMeta& input) {
  Tensor g = sum_to(grad, input.shape);
  return g.dtype() == input.dtype ? g : core::cast_raw(g, input.dtype);
}
Tensor reduce_grad(const Tensor& grad, const Tensor& input) {
  return reduce_grad(grad, InputMeta(input));
}

/// Refuses in-place updates the graph would not see (see the header).
void check_inplace(const Tensor& a, const char* op) {
  COLOSSAL_CHECK(a.defined(), "{}: undefined tensor", op);
  COLOSSAL_CHECK(
      !(autograd::GradMode::is_enabled() && a.requires_grad()),
      "{}: in-place update of a tensor that requires grad (shape {}) while grad mode is on; wrap the update in "
      "autograd::NoGradGuard",
      op, a.shape());
}

Tensor scalar_like(double value, const Tensor& like) {
  // A 0-d operand of the same dtype keeps the other operand's dtype under promotion.
  const DType dtype =
      core::is_floating(like.dtype()) ? like.dtype() : (std::floor(value) == value ? like.dtype() : DType::f32);
  return core::full({}, value, TensorOptions(dtype, like.device()));
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  Tensor out = binary_forward(BinaryOp::add, a, b, alpha);
  record("add", {a, b}, {out},
         [a = InputMeta(a), b = InputMeta(b), alpha](const std::vector<Tensor>& g, const Node& node) {
           return std::vector<Tensor>{
               node.needs_input_grad(0) ? reduce_grad(g[0], a) : Tensor(),
               node.needs_input_grad(1) ? reduce_grad(alpha == 1.0 ? g[0] : mul(g[0], alpha), b) : Tensor()};
         });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  Tensor out = binary_forward(BinaryOp::sub, a, b, alpha);
  record("sub", {a, b}, {out},
         [a = InputMeta(a), b = InputMeta(b), alpha](const std::vector<Tensor>& g, const Node& node) {
           return std::vector<Tensor>{node.needs_input_grad(0) ? reduce_grad(g[0], a) : Tensor(),
                                      node.needs_input_grad(1) ? reduce_grad(mul(g[0], -alpha), b) : Tensor()};
         });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::mul, a, b, 1.0);
  record("mul", {a, b}, {out}, [a = a.detach(), b = b.detach()](const std::vector<Tensor>& g, const Node& node) {
    return std::vector<Tensor>{node.needs_input_grad(0) ? reduce_grad(mul(g[0], b), a) : Tensor(),
                               node.needs_input_grad(1) ? reduce_grad(mul(g[0], a), b) : Tensor()};
  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::div, a, b, 1.0);
  record("div", {a, b}, {out},
         [a = InputMeta(a), b = b.detach(), out = out.detach()](const std::vector<Tensor>& g, const Node& node) {
           Tensor grad_a = div(g[0], b);
           return std::vector<Tensor>{node.needs_input_grad(0) ? reduce_grad(grad_a, a) : Tensor(),
                                      node.needs_input_grad(1) ? reduce_grad(neg(mul(grad_a, out)), b) : Tensor()};
         });
  return out;
}

Tensor add(const Tensor& a, double b) {
  if (!core::is_floating(a.dtype()) && std::floor(b) != b) return add(a, scalar_like(b, a));
  return unary(UnaryOp::affine, a, 1.0, b);
}
Tensor mul(const Tensor& a, double b) {
  if (!core::is_floating(a.dtype()) && std::floor(b) != b) return mul(a, scalar_like(b, a));
  return unary(UnaryOp::affine, a, b, 0.0);
}
Tensor div(const Tensor& a, double b) {
  if (!core::is_floating(a.dtype())) return div(a, scalar_like(b, a));
  return unary(UnaryOp::affine, a, 1.0 / b, 0.0);
}
Tensor neg(const Tensor& a) {
  return unary(UnaryOp::neg, a);
}
Tensor pow(const Tensor& a, double exponent) {
  return unary(UnaryOp::pow_scalar, a, exponent);
}

Tensor pow(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::pow, a, b, 1.0);
  record("pow", {a, b}, {out},
         [a = a.detach(), b = b.detach(), out = out.detach()](const std::vector<Tensor>& g, const Node& node) {
           Tensor grad_a, grad_b;
           if (node.needs_input_grad(0))
             grad_a = reduce_grad(mul(g[0], mul(b, pow(a, sub(b, scalar_like(1.0, b))))), a);
           if (node.needs_input_grad(1)) grad_b = reduce_grad(mul(g[0], mul(out, log(a))), b);
           return std::vector<Tensor>{grad_a, grad_b};
         });
  return out;
}

namespace {
/// maximum/minimum: the gradient goes to the selected operand; ties split it evenly (as PyTorch).
Tensor select_binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(op, a, b, 1.0);
  record(binary_name(op), {a, b}, {out},
         [op, a = a.detach(), b = b.detach()](const std::vector<Tensor>& g, const Node& node) {
           const DType dtype = g[0].dtype();
           Tensor wins_a = core::cast_raw(op == BinaryOp::maximum ? gt(a, b) : lt(a, b), dtype);
           Tensor ties = core::cast_raw(eq(a, b), dtype);
           Tensor share_a = add(wins_a, mul(ties, 0.5));
           Tensor grad_a = mul(g[0], share_a);
           return std::vector<Tensor>{node.needs_input_grad(0) ? reduce_grad(grad_a, a) : Tensor(),
                                      node.needs_input_grad(1) ? reduce_grad(sub(g[0], grad_a), b) : Tensor()};
         });
  return out;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) {
  return select_binary(BinaryOp::maximum, a, b);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return select_binary(BinaryOp::minimum, a, b);
}
Tensor clamp(const Tensor& a, double min, double max) {
  COLOSSAL_CHECK(min <= max, "clamp: min {} exceeds max {}", min, max);
  return unary(UnaryOp::clamp, a, min, max);
}

Tensor exp(const Tensor& a) {
  return unary(UnaryOp::exp, a);
}
Tensor log(const Tensor& a) {
  return unary(UnaryOp::log, a);
}
Tensor tanh(const Tensor& a) {
  return unary(UnaryOp::tanh, a);
}
Tensor sqrt(const Tensor& a) {
  return unary(UnaryOp::sqrt, a);
}
Tensor rsqrt(const Tensor& a) {
  return unary(UnaryOp::rsqrt, a);
}
Tensor abs(const Tensor& a) {
  return unary(UnaryOp::abs, a);
}
Tensor relu(const Tensor& a) {
  return unary(UnaryOp::relu, a);
}
Tensor sigmoid(const Tensor& a) {
  return unary(UnaryOp::sigmoid, a);
}
Tensor silu(const Tensor& a) {
  return unary(UnaryOp::silu, a);
}
Tensor gelu(const Tensor& a, GeluApproximation approximation) {
  return unary(approximation == GeluApproximation::tanh ? UnaryOp::gelu_tanh : UnaryOp::gelu, a);
}

Tensor eq(const Tensor& a, const Tensor& b) {
  return binary_forward(BinaryOp::eq, a, b, 1.0);
}
Tensor ne(const Tensor& a, const Tensor& b) {
  return binary_forward(BinaryOp::ne, a, b, 1.0);
}
Tensor lt(const Tensor& a, const Tensor& b) {
  return binary_forward(BinaryOp::lt, a, b, 1.0);
}
Tensor le(const Tensor& a, const Tensor& b) {
  return binary_forward(BinaryOp::le, a, b, 1.0);
}
Tensor gt(const Tensor& a, const Tensor& b) {
  return binary_forward(BinaryOp::gt, a, b, 1.0);
}
Tensor ge(const Tensor& a, const Tensor& b) {
  return binary_forward(BinaryOp::ge, a, b, 1.0);
}
Tensor eq(const Tensor& a, double b) {
  return eq(a, scalar_like(b, a));
}
Tensor gt(const Tensor& a, double b) {
  return gt(a, scalar_like(b, a));
}
Tensor lt(const Tensor& a, double b) {
  return lt(a, scalar_like(b, a));
}

Tensor& add_(Tensor& a, const Tensor& b, double alpha) {
  check_inplace(a, "add_");
  check_same_device(a, b, "add_");
  if (a.numel() == 0) return a;
  const Tensor b_in = core::expand_raw(b.dtype() == a.dtype() ? b : core::cast_raw(b, a.dtype()), a.shape());
  binary_stub(a.device(), BinaryOp::add, a, a, b_in, alpha);
  return a;
}

Tensor& add_(Tensor& a, double b) {
  check_inplace(a, "add_");
  if (a.numel() > 0) unary_stub(a.device(), UnaryOp::affine, a, a, 1.0, b);
  return a;
}

Tensor& mul_(Tensor& a, const Tensor& b) {
  check_inplace(a, "mul_");
  check_same_device(a, b, "mul_");
  if (a.numel() == 0) return a;
  const Tensor b_in = core::expand_raw(b.dtype() == a.dtype() ? b : core::cast_raw(b, a.dtype()), a.shape());
  binary_stub(a.device(), BinaryOp::mul, a, a, b_in, 1.0);
  return a;
}

Tensor& mul_(Tensor& a, double b) {
  check_inplace(a, "mul_");
  if (a.numel() > 0) unary_stub(a.device(), UnaryOp::affine, a, a, b, 0.0);
  return a;
}

namespace {
Tensor& ternary_(TernaryOp op, Tensor& a, const Tensor& b, const Tensor& c, double value, const char* name) {
  check_inplace(a, name);
  check_same_device(a, b, name);
  check_same_device(a, c, name);
  COLOSSAL_CHECK(core::is_floating(a.dtype()), "{}: expected a floating tensor, got {}", name, a.dtype());
  if (a.numel() == 0) return a;
  auto prepare = [&](const Tensor& t) {
    return core::expand_raw(t.dtype() == a.dtype() ? t : core::cast_raw(t, a.dtype()), a.shape());
  };
  ternary_stub(a.device(), op, a, prepare(b), prepare(c), value);
  return a;
}
}  // namespace

Tensor& addcmul_(Tensor& a, const Tensor& b, const Tensor& c, double value) {
  return ternary_(TernaryOp::addcmul, a, b, c, value, "addcmul_");
}
Tensor& addcdiv_(Tensor& a, const Tensor& b, const Tensor& c, double value) {
  return ternary_(TernaryOp::addcdiv, a, b, c, value, "addcdiv_");
}

}  // namespace colossal::ops
