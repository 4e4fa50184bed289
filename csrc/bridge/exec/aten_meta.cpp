#include "aten_meta.h"

#include <ATen/MetaFunctions.h>
#include <ATen/Operators.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace torchneuron {
namespace {

struct Entry {
  const char* name;
  const char* overload;
  c10::KernelFunction kernel;
};

// One operator: its at::_ops struct names it and gives the signature that
// picks the overload of at::meta::fn.
#define TORCHNEURON_ATEN_META(op, fn)                                 \
  Entry {                                                             \
    at::_ops::op::name, at::_ops::op::overload_name,                  \
        c10::KernelFunction::makeFromUnboxedRuntimeFunction(          \
            static_cast<at::_ops::op::schema*>(&at::meta::fn))        \
  }

// The functional and in-place forms of the structured operators that models
// call most, whose Meta kernel Python takes over (the test checks that it
// does for each, so an entry PyTorch no longer overrides is noticed).
std::vector<Entry> entries() {
  return {
      // arithmetic
      TORCHNEURON_ATEN_META(add_Tensor, add), TORCHNEURON_ATEN_META(add__Tensor, add_),
      TORCHNEURON_ATEN_META(sub_Tensor, sub), TORCHNEURON_ATEN_META(sub__Tensor, sub_),
      TORCHNEURON_ATEN_META(mul_Tensor, mul), TORCHNEURON_ATEN_META(mul__Tensor, mul_),
      TORCHNEURON_ATEN_META(div_Tensor, div), TORCHNEURON_ATEN_META(div__Tensor, div_),
      TORCHNEURON_ATEN_META(div_Tensor_mode, div), TORCHNEURON_ATEN_META(div__Tensor_mode, div_),
      TORCHNEURON_ATEN_META(pow_Tensor_Tensor, pow), TORCHNEURON_ATEN_META(pow_Tensor_Scalar, pow),
      TORCHNEURON_ATEN_META(pow_Scalar, pow), TORCHNEURON_ATEN_META(pow__Scalar, pow_),
      TORCHNEURON_ATEN_META(maximum, maximum), TORCHNEURON_ATEN_META(minimum, minimum),
      TORCHNEURON_ATEN_META(remainder_Tensor, remainder), TORCHNEURON_ATEN_META(fmod_Tensor, fmod),
      TORCHNEURON_ATEN_META(atan2, atan2), TORCHNEURON_ATEN_META(lerp_Scalar, lerp),
      TORCHNEURON_ATEN_META(addcmul, addcmul), TORCHNEURON_ATEN_META(addcmul_, addcmul_),
      TORCHNEURON_ATEN_META(addcdiv, addcdiv), TORCHNEURON_ATEN_META(addcdiv_, addcdiv_),
      TORCHNEURON_ATEN_META(bitwise_and_Tensor, bitwise_and), TORCHNEURON_ATEN_META(bitwise_or_Tensor, bitwise_or),
      TORCHNEURON_ATEN_META(bitwise_xor_Tensor, bitwise_xor), TORCHNEURON_ATEN_META(bitwise_not, bitwise_not),
      TORCHNEURON_ATEN_META(clamp, clamp), TORCHNEURON_ATEN_META(clamp_, clamp_),
      TORCHNEURON_ATEN_META(clamp_Tensor, clamp),
      // comparisons
      TORCHNEURON_ATEN_META(eq_Tensor, eq), TORCHNEURON_ATEN_META(eq_Scalar, eq),
      TORCHNEURON_ATEN_META(ne_Tensor, ne), TORCHNEURON_ATEN_META(ne_Scalar, ne),
      TORCHNEURON_ATEN_META(lt_Tensor, lt), TORCHNEURON_ATEN_META(lt_Scalar, lt),
      TORCHNEURON_ATEN_META(le_Tensor, le), TORCHNEURON_ATEN_META(le_Scalar, le),
      TORCHNEURON_ATEN_META(gt_Tensor, gt), TORCHNEURON_ATEN_META(gt_Scalar, gt),
      TORCHNEURON_ATEN_META(ge_Tensor, ge), TORCHNEURON_ATEN_META(ge_Scalar, ge),
      TORCHNEURON_ATEN_META(isin_Tensor_Tensor, isin), TORCHNEURON_ATEN_META(isin_Tensor_Scalar, isin),
      // unary
      TORCHNEURON_ATEN_META(neg, neg), TORCHNEURON_ATEN_META(neg_, neg_),
      TORCHNEURON_ATEN_META(exp, exp), TORCHNEURON_ATEN_META(log, log),
      TORCHNEURON_ATEN_META(sqrt, sqrt), TORCHNEURON_ATEN_META(rsqrt, rsqrt),
      TORCHNEURON_ATEN_META(reciprocal, reciprocal), TORCHNEURON_ATEN_META(sign, sign),
      TORCHNEURON_ATEN_META(sin, sin), TORCHNEURON_ATEN_META(cos, cos),
      TORCHNEURON_ATEN_META(erf, erf), TORCHNEURON_ATEN_META(floor, floor),
      TORCHNEURON_ATEN_META(sigmoid, sigmoid), TORCHNEURON_ATEN_META(sigmoid_, sigmoid_),
      TORCHNEURON_ATEN_META(tanh, tanh), TORCHNEURON_ATEN_META(tanh_, tanh_),
      TORCHNEURON_ATEN_META(silu, silu), TORCHNEURON_ATEN_META(silu_, silu_),
      TORCHNEURON_ATEN_META(gelu, gelu), TORCHNEURON_ATEN_META(gelu_, gelu_),
      TORCHNEURON_ATEN_META(tril, tril_symint), TORCHNEURON_ATEN_META(triu, triu_symint),
      // backward of the activations
      TORCHNEURON_ATEN_META(sigmoid_backward, sigmoid_backward),
      TORCHNEURON_ATEN_META(tanh_backward, tanh_backward),
      TORCHNEURON_ATEN_META(gelu_backward, gelu_backward),
      TORCHNEURON_ATEN_META(threshold_backward, threshold_backward),
      // reductions, scans, softmax
      TORCHNEURON_ATEN_META(sum_dim_IntList, sum), TORCHNEURON_ATEN_META(mean_dim, mean),
      TORCHNEURON_ATEN_META(amax, amax), TORCHNEURON_ATEN_META(amin, amin),
      TORCHNEURON_ATEN_META(argmax, argmax), TORCHNEURON_ATEN_META(argmin, argmin),
      TORCHNEURON_ATEN_META(any, any), TORCHNEURON_ATEN_META(any_dim, any), TORCHNEURON_ATEN_META(any_dims, any),
      TORCHNEURON_ATEN_META(all, all), TORCHNEURON_ATEN_META(all_dim, all), TORCHNEURON_ATEN_META(all_dims, all),
      TORCHNEURON_ATEN_META(cumsum, cumsum), TORCHNEURON_ATEN_META(cumprod, cumprod),
      TORCHNEURON_ATEN_META(_softmax, _softmax), TORCHNEURON_ATEN_META(_log_softmax, _log_softmax),
      TORCHNEURON_ATEN_META(_softmax_backward_data, _softmax_backward_data),
      TORCHNEURON_ATEN_META(_log_softmax_backward_data, _log_softmax_backward_data),
      // shapes, indexing, matrix products
      TORCHNEURON_ATEN_META(cat, cat), TORCHNEURON_ATEN_META(gather, gather),
      TORCHNEURON_ATEN_META(scatter_src, scatter), TORCHNEURON_ATEN_META(scatter_value, scatter),
      TORCHNEURON_ATEN_META(scatter_add, scatter_add),
      TORCHNEURON_ATEN_META(mm, mm), TORCHNEURON_ATEN_META(bmm, bmm),
      TORCHNEURON_ATEN_META(addmm, addmm), TORCHNEURON_ATEN_META(baddbmm, baddbmm),
  };
}

#undef TORCHNEURON_ATEN_META

const std::unordered_map<c10::OperatorName, c10::KernelFunction>& table() {
  static const auto* t = [] {
    auto* m = new std::unordered_map<c10::OperatorName, c10::KernelFunction>();
    for (Entry& e : entries()) m->emplace(c10::OperatorName(e.name, e.overload), std::move(e.kernel));
    return m;
  }();
  return *t;
}

} // namespace

const c10::KernelFunction* aten_meta_kernel(const c10::OperatorHandle& op) {
  auto it = table().find(op.operator_name());
  return it == table().end() ? nullptr : &it->second;
}

std::vector<std::string> aten_meta_operators() {
  std::vector<std::string> names;
  for (const auto& [name, kernel] : table())
    names.push_back(name.name + (name.overload_name.empty() ? "" : "." + name.overload_name));
  return names;
}

} // namespace torchneuron
