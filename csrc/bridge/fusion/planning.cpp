#include <c10/util/accumulate.h>

#include <algorithm>
#include <cmath>

#include "../exec/op_policy.h"
#include "../kernels/vector_math.h"
#include "../sanitizers/op_tracking.h"
#include "fused_group.h"

namespace torchneuron::fusion {
namespace {

using Kind = ExactArithmetic::Kind;

std::optional<Kind> kind_of(ExactKind k) {
  switch (k) {
    case ExactKind::None: return std::nullopt;
    case ExactKind::Add: return Kind::Add;
    case ExactKind::Sub: return Kind::Sub;
    case ExactKind::Mul: return Kind::Mul;
    case ExactKind::Div: return Kind::Div;
    case ExactKind::Neg: return Kind::Neg;
    case ExactKind::Abs: return Kind::Abs;
    case ExactKind::Clamp: return Kind::Clamp;
    case ExactKind::Reciprocal: return Kind::Reciprocal;
    case ExactKind::Function: return Kind::Function;
  }
  return std::nullopt;
}

// A real Scalar (ATen wraps it as a double, int64 or bool tensor), or a bound
// that is a number: clamp with a NaN bound fills NaN, which is left to ATen.
bool real(const c10::Scalar& s) {
  return !s.isComplex() && !(s.isFloatingPoint() && std::isnan(s.toDouble()));
}

// A Scalar `other` as TensorIterator converts the number ATen wraps it in.
template <typename T>
T wrapped(const c10::Scalar& s) {
  return s.isFloatingPoint() ? T(s.toDouble()) : s.isBoolean() ? T(s.toBool()) : T(s.toLong());
}

// A clamp bound as ATen's kernel converts it (Scalar::to, which refuses an
// overflow: then nullopt, and ATen raises it).
std::optional<double> bound(const c10::Scalar& s, c10::ScalarType dtype) {
  try {
    return dtype == at::kFloat ? double(s.to<float>()) : s.to<double>();
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

// The member as exact arithmetic, or nullopt if it needs ATen's kernel: its
// policy names an exact kind and the arguments allow it (no type promotion,
// alpha 1, real scalars and bounds, a whole operand for a function).
// Tensor operands must cover the group whole or be single elements.
std::optional<ExactArithmetic> exact_arithmetic_of(const ElementwiseCall& call) {
  const auto& schema = call.op.schema();
  std::string base = schema.name().substr(6);  // after "aten::"
  const bool inplace = !base.empty() && base.back() == '_';
  if (inplace) base.pop_back();
  const std::optional<Kind> kind = kind_of(call.policy->exact);
  if (!kind) return std::nullopt;
  ExactArithmetic op{*kind, c10::ScalarType::Undefined, -1, -1, -1};
  auto arg = [&](const char* name) -> const c10::IValue* {
    auto i = schema.argumentIndexWithName(name);
    return i && *i < call.args.size() ? &call.args[*i] : nullptr;
  };
  auto index = [&](const char* name) { return int(*schema.argumentIndexWithName(name)); };
  const c10::IValue* self = arg("self");
  if (!self || !self->isTensor()) return std::nullopt;
  op.self = index("self");
  op.out = inplace ? op.self : arg("out") ? index("out") : -1;
  if (op.out == -1 && call.results.size() != 1) return std::nullopt;
  const at::Tensor& out = op.out == -1 ? call.results[0] : call.args[op.out].toTensor();
  op.dtype = out.scalar_type();
  if (op.dtype != at::kFloat && op.dtype != at::kDouble) return std::nullopt;

  if (const c10::IValue* alpha = arg("alpha");
      alpha && (alpha->toScalar().isBoolean() || !real(alpha->toScalar()) || alpha->toScalar().toDouble() != 1.0))
    return std::nullopt;  // a bool alpha is ATen's error to raise
  if (const c10::IValue* mode = arg("rounding_mode"); mode && !mode->isNone()) return std::nullopt;
  if (const c10::IValue* other = arg("other")) {
    if (other->isTensor()) {
      op.other = index("other");
    } else if (other->isScalar() && real(other->toScalar())) {
      op.scalar = op.dtype == at::kFloat ? wrapped<float>(other->toScalar()) : wrapped<double>(other->toScalar());
    } else {
      return std::nullopt;
    }
  }
  if (base == "relu") op.lo = 0.0;
  for (auto [name, limit] : {std::pair{"min", &op.lo}, std::pair{"max", &op.hi}}) {
    const c10::IValue* v = arg(name);
    if (!v || v->isNone()) continue;
    if (!v->isScalar() || !real(v->toScalar())) return std::nullopt;  // a Tensor bound, a NaN
    *limit = bound(v->toScalar(), op.dtype);
    if (!*limit) return std::nullopt;
  }
  if (op.kind == Kind::Clamp && !op.lo && !op.hi) return std::nullopt;
  if (op.kind == Kind::Function) {
    const at::Tensor& x = call.args[op.self].toTensor();
    if (schema.arguments().size() != (arg("out") ? 2 : 1) || x.scalar_type() != op.dtype || x.numel() != out.numel())
      return std::nullopt;
    op.function = vector_math::as_unfused(base, op.dtype);
    if (!op.function) return std::nullopt;
  }

  // No type promotion: every tensor of more than zero dimensions has the
  // result's dtype, and 0-dim ones (which weigh less) are real numbers.
  for (int i : {op.self, op.other}) {
    if (i < 0) continue;
    const at::Tensor& t = call.args[i].toTensor();
    if (t.dim() == 0 ? c10::isComplexType(t.scalar_type()) : t.scalar_type() != op.dtype) return std::nullopt;
  }
  return op;
}

// How `t` covers an iteration space of shape `full`, and the row length
// that cover implies (0: none), or nullopt if it cannot take part.
std::optional<std::pair<Cover, int64_t>> cover_of(const at::Tensor& t, c10::IntArrayRef full, int64_t numel) {
  if (t.numel() == 1) return std::make_pair(Cover::Single, int64_t(0));
  if (!t.is_contiguous() || t.dim() > int64_t(full.size())) return std::nullopt;
  if (t.numel() == numel) return std::make_pair(Cover::Full, int64_t(0));
  // Right-aligned against `full`: leading ones then full's trailing sizes
  // (a row), or full's leading sizes then trailing ones (a column).
  const int64_t lead = int64_t(full.size()) - t.dim();
  auto size = [&](int64_t d) { return d < lead ? 1 : t.size(d - lead); };
  int64_t k = 0;
  while (k < int64_t(full.size()) && size(k) == 1) ++k;
  bool row = k > 0;
  for (int64_t d = k; d < int64_t(full.size()); ++d) row &= size(d) == full[d];
  if (row) return std::make_pair(Cover::Row, c10::multiply_integers(full.begin() + k, full.end()));
  k = int64_t(full.size());
  while (k > 0 && size(k - 1) == 1) --k;
  bool column = k < int64_t(full.size());
  for (int64_t d = 0; d < k; ++d) column &= size(d) == full[d];
  if (column) return std::make_pair(Cover::Column, c10::multiply_integers(full.begin() + k, full.end()));
  return std::nullopt;
}

// The tensor operands of a call and the row length its broadcasting needs
// (0: none), or false if the call cannot fuse. Outputs are contiguous and all
// of one shape; inputs match it or broadcast as a row, a column or a single
// element. (Rows of any length: FusedGroup::run cuts pieces inside a thread's
// range only at rows that are a multiple of every vector step.)
// A row-wise call's row length, with its dimension argument rewritten for
// pieces of [rows, row] in `dims`; 0 if the call is not row-wise, -1 if it
// is but cannot fuse.
int64_t rowwise_row(const ElementwiseCall& call, c10::IValue& dims) {
  if (call.policy->fusion != Fusion::Rowwise) return 0;
  const at::Tensor& self = call.args[0].toTensor();
  const size_t dims_arg = call.policy->rowwise_dims_arg;
  const c10::IValue& arg = call.args[dims_arg];
  const int64_t nd = self.dim();
  if (nd == 0) return -1;
  if (call.op.schema().arguments()[dims_arg].name() == "normalized_shape") {  // layer norm
    if (!arg.isIntList()) return -1;
    auto shape = arg.toIntVector();
    if (shape.empty() || int64_t(shape.size()) > nd ||
        !std::equal(shape.begin(), shape.end(), self.sizes().end() - shape.size()))
      return -1;
    const int64_t row = c10::multiply_integers(shape);
    dims = c10::IValue(std::vector<int64_t>{row});
    return row;
  }
  int64_t d;
  if (arg.isInt()) {
    d = arg.toInt();
    dims = c10::IValue(int64_t(-1));
  } else if (arg.isIntList() && arg.toIntList().size() == 1) {
    d = arg.toIntList().get(0);
    dims = c10::IValue(std::vector<int64_t>{-1});
  } else {
    return -1;
  }
  return d == -1 || d == nd - 1 ? self.size(-1) : -1;
}

bool collect_operands(ElementwiseCall& call, int64_t& numel, int64_t& row, std::vector<Operand>& operands) {
  const auto& schema = call.op.schema();
  // An in-place call reads what it writes, but for copy_ and fill_.
  const bool reads_self = !schema.name().empty() && schema.name().back() == '_' && schema.name() != "aten::copy_" &&
                          schema.name() != "aten::fill_";
  struct Use {
    const at::Tensor* t;
    size_t index;
    bool result, written;
  };
  std::vector<Use> uses;
  for (size_t i = 0; i < call.args.size(); ++i) {
    const auto& a = call.args[i];
    if (a.isTensor()) {
      const auto* alias = i < schema.arguments().size() ? schema.arguments()[i].alias_info() : nullptr;
      uses.push_back({&a.toTensor(), i, false, alias && alias->isWrite()});
    } else if (a.isTensorList() || a.isGenerator() ||
               (a.isList() && !a.isIntList() && !a.isDoubleList() && !a.isBoolList())) {
      return false;
    }
  }
  for (size_t i = 0; i < call.results.size(); ++i) uses.push_back({&call.results[i], i, true, true});
  c10::IValue dims;
  const int64_t rowwise = rowwise_row(call, dims);
  if (rowwise < 0) return false;
  // The iteration space: a row-wise call's input, else its output.
  const at::Tensor* out = rowwise ? &call.args[0].toTensor() : nullptr;
  for (const Use& u : uses)
    if (u.written && !rowwise) out = u.t;
  if (!out || !out->defined() || out->dim() == 0) return false;
  const c10::IntArrayRef full = out->sizes();
  numel = out->numel();
  row = rowwise;
  std::vector<Operand> writes;
  for (const Use& u : uses) {
    const at::Tensor& t = *u.t;
    if (!t.defined() || t.is_conj() || t.is_neg()) return false;
    std::optional<std::pair<Cover, int64_t>> cover;
    if (rowwise && u.written && t.is_contiguous() && t.numel() * rowwise == numel)  // a reduction's result
      cover = std::make_pair(t.dim() == out->dim() ? Cover::Column : Cover::PerRow, rowwise);
    else
      cover = cover_of(t, full, numel);
    if (!cover || (u.written && (cover->first == Cover::Single || (cover->first != Cover::Full && !rowwise))))
      return false;
    if (cover->second != 0) {
      if (row != 0 && row != cover->second) return false;
      row = cover->second;
    }
    auto p = reinterpret_cast<uintptr_t>(t.const_data_ptr());  // an address only: no copy-on-write materialising
    Operand o{u.index, u.result, u.written && !reads_self, cover->first, {p, p + t.nbytes(), t.itemsize()},
              t.scalar_type()};
    (u.written ? writes : operands).push_back(o);
  }
  operands.insert(operands.end(), writes.begin(), writes.end());
  if (numel < min_fusable_numel()) return false;
  if (rowwise) call.args[call.policy->rowwise_dims_arg] = std::move(dims);  // pieces are [rows, row]
  return true;
}

// Tensors of a group must coincide exactly or not overlap at all.
// Coinciding tensors must also be cut alike, so that a piece only ever reads
// elements an earlier member wrote for that same piece (a bias read whole by
// every piece must not share memory with a per-row result).
bool coincide_or_disjoint(const Operand& a, const Operand& b) {
  if (a.slot >= 0 || b.slot >= 0) return true;  // elided: never touches memory
  auto cut = [](Cover c) { return c == Cover::PerRow ? Cover::Column : c; };
  const Range &x = a.range, &y = b.range;
  return (x.begin == y.begin && x.end == y.end && x.itemsize == y.itemsize && cut(a.cover) == cut(b.cover)) ||
         x.end <= y.begin || y.end <= x.begin;
}

} // namespace

bool FusedGroup::compatible(const std::vector<Operand>& operands) const {
  for (const Member& m : members)
    for (const Operand& a : m.operands)
      for (const Operand& b : operands)
        if (!coincide_or_disjoint(a, b)) return false;
  return true;
}

// The tensor's freed, and nothing outside the group can read it any more (the
// group is still the queue's tail): if the group's first use of it writes it,
// no use needs memory, and the whole lifetime moves to a scratch slot.
void FusedGroup::elide(uintptr_t begin, uintptr_t end) {
  std::vector<std::pair<Operand*, size_t>> uses;  // and the member using it
  for (size_t m = 0; m < members.size(); ++m)
    for (Operand& o : members[m].operands)
      if (!o.closed && o.range.begin >= begin && o.range.end <= end) uses.emplace_back(&o, m);
  if (uses.empty()) return;
  int slot = -1;
  if (uses.front().first->write_only) {
    // A slot whose last user comes before this intermediate's first writer.
    const c10::ScalarType dtype = uses.front().first->dtype;
    for (size_t s = 0; s < slots.size() && slot < 0; ++s)
      if (slots[s].dtype == dtype && slots[s].last_use < uses.front().second) slot = int(s);
    if (slot < 0) {
      slot = int(slots.size());
      slots.push_back({dtype, 0});
    }
    slots[slot].last_use = uses.back().second;
    record_elided();
  }
  for (auto& [o, m] : uses) {
    o->closed = true;
    o->slot = slot;
  }
}

std::optional<Candidate> candidate_of(ElementwiseCall& call) {
  Candidate c;
  if (!collect_operands(call, c.numel, c.row, c.operands)) return std::nullopt;
  for (size_t i = 0; i < c.operands.size(); ++i)  // x[1:].add_(x[:-1]) is ATen's to reject or order
    for (size_t j = 0; j < i; ++j)
      if (!coincide_or_disjoint(c.operands[i], c.operands[j])) return std::nullopt;
  c.exact = exact_arithmetic_of(call);
  for (const Operand& o : c.operands)
    if (o.cover != Cover::Full && o.cover != Cover::Single) c.exact.reset();
  return c;
}

} // namespace torchneuron::fusion
