// Recurrent layers (nn.RNN, nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell) computed
// as the CPU computes them.
//
// ATen's recurrent operators are composites that branch on the device. On
// CUDA, XPU and PrivateUse1 a cell calls _thnn_fused_{lstm,gru}_cell, which has
// CUDA kernels only, and a layer projects its input one step at a time. On the
// CPU a cell is a chain of ATen operators, a layer projects the whole sequence
// with one linear before its loop, and an LSTM of a dtype oneDNN supports runs
// oneDNN's layer (mkldnn_rnn_layer). Results and gradients depend on the branch
// (the per-step projection sums its weight gradient step by step, the CPU's in
// one matrix product), so these kernels take the CPU's branches for `neuron`
// tensors. Every operator they call then runs its CPU kernel on device memory,
// and training is bit-identical to the CPU. They are registered for the
// autograd key (autograd records the operators they call, as it does for the
// composites) and for the backend key (inference mode skips autograd).
//
// The operators are created in the order ATen's CPU branch creates them: the
// autograd engine's order, and so the order gradients are summed in, follows it.
#include <ATen/ATen.h>
#include <ATen/native/RNN.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cstring>
#include <map>
#include <mutex>

#include "explicit_ops.h"

namespace torchneuron::ops {
namespace {

using at::Tensor;
using at::TensorList;

// One layer and direction's weights, in nn.RNNBase's flat order. Biases and
// the LSTM projection w_hr may be undefined.
struct CellWeights {
  Tensor w_ih, w_hh, b_ih, b_hh, w_hr;

  Tensor project_input(const Tensor& x) const { return at::linear(x, w_ih, b_ih); }
  Tensor project_hidden(const Tensor& h) const { return at::linear(h, w_hh, b_hh); }
  Tensor project_output(const Tensor& h) const { return w_hr.defined() ? at::matmul(h, w_hr.t()) : h; }
};

std::vector<CellWeights> unflatten(TensorList flat, bool has_biases, bool has_projections) {
  const size_t per_cell = 2 + (has_biases ? 2 : 0) + (has_projections ? 1 : 0);
  TORCH_CHECK(flat.size() % per_cell == 0, "got an incorrect number of RNN parameters");
  std::vector<CellWeights> cells;
  for (size_t i = 0; i < flat.size(); i += per_cell) {
    CellWeights w{flat[i], flat[i + 1]};
    if (has_biases) w.b_ih = flat[i + 2], w.b_hh = flat[i + 3];
    if (has_projections) w.w_hr = flat[i + per_cell - 1];
    cells.push_back(std::move(w));
  }
  return cells;
}

// --- cells: one step. `x` is the step's input, already multiplied by w_ih
// (plus b_ih) when `x_projected`, as a layer does for the whole sequence.

template <Tensor (*activation)(const Tensor&)>
struct SimpleCell {
  using Hidden = Tensor;
  Hidden operator()(const Tensor& x, const Hidden& h, const CellWeights& w, bool x_projected) const {
    Tensor pre = w.project_hidden(h);
    return activation(pre.add_(x_projected ? x : w.project_input(x)));
  }
};
Tensor tanh_of(const Tensor& t) { return at::tanh(t); }
Tensor relu_of(const Tensor& t) { return at::relu(t); }

struct LSTMCell {
  using Hidden = std::pair<Tensor, Tensor>;  // (h, c)
  Hidden operator()(const Tensor& x, const Hidden& hc, const CellWeights& w, bool x_projected) const {
    Tensor gates = w.project_hidden(hc.first);
    gates.add_(x_projected ? x : w.project_input(x));
    auto g = gates.unsafe_chunk(4, 1);
    Tensor input_gate = g[0].sigmoid_();
    Tensor forget_gate = g[1].sigmoid_();
    Tensor cell_gate = g[2].tanh_();
    Tensor output_gate = g[3].sigmoid_();
    Tensor c = (forget_gate * hc.second).add_(input_gate * cell_gate);
    Tensor h = output_gate * c.tanh();
    return {w.project_output(h), c};
  }
};

struct GRUCell {
  using Hidden = Tensor;
  Hidden operator()(const Tensor& x, const Hidden& h, const CellWeights& w, bool x_projected) const {
    auto xg = (x_projected ? x : w.project_input(x)).unsafe_chunk(3, 1);
    auto hg = w.project_hidden(h).unsafe_chunk(3, 1);
    Tensor reset_gate = hg[0].add_(xg[0]).sigmoid_();
    Tensor update_gate = hg[1].add_(xg[1]).sigmoid_();
    Tensor new_gate = xg[2].add(hg[2].mul_(reset_gate)).tanh_();
    return (h - new_gate).mul_(update_gate).add_(new_gate);
  }
};

// --- hidden states: a tensor, or LSTM's (h, c) pair

const Tensor& output_of(const Tensor& h) { return h; }
const Tensor& output_of(const LSTMCell::Hidden& hc) { return hc.first; }

Tensor rows(const Tensor& h, int64_t start, int64_t end) { return h.narrow(0, start, end - start); }
LSTMCell::Hidden rows(const LSTMCell::Hidden& hc, int64_t start, int64_t end) {
  return {rows(hc.first, start, end), rows(hc.second, start, end)};
}

Tensor concat_rows(const std::vector<Tensor>& hs) { return at::cat(hs, 0); }
LSTMCell::Hidden concat_rows(const std::vector<LSTMCell::Hidden>& hcs) {
  std::vector<Tensor> h, c;
  for (const auto& hc : hcs) h.push_back(hc.first), c.push_back(hc.second);
  return {at::cat(h, 0), at::cat(c, 0)};
}

// --- layers: one direction over a whole sequence

template <class Cell>
using LayerResult = std::pair<Tensor, typename Cell::Hidden>;  // (outputs, final hidden)

// A padded sequence [time, batch, features].
template <class Cell>
LayerResult<Cell> run_dense(const Cell& cell, const Tensor& input, typename Cell::Hidden h, const CellWeights& w,
                            bool reverse) {
  std::vector<Tensor> steps = w.project_input(input).unbind(0);
  if (reverse) std::reverse(steps.begin(), steps.end());
  std::vector<Tensor> outputs;
  for (const Tensor& x : steps) {
    h = cell(x, h, w, /*x_projected=*/true);
    outputs.push_back(output_of(h));
  }
  TORCH_CHECK(!outputs.empty(), "Expected sequence length to be larger than 0 in RNN");
  if (reverse) std::reverse(outputs.begin(), outputs.end());
  return {at::stack(outputs, 0), h};
}

// A packed sequence: `data` holds the steps one after another, step t has the
// first batch_sizes[t] sequences (batch sizes never grow). Forwards, finished
// sequences leave the hidden state as the batch shrinks; backwards, they join it.
template <class Cell>
LayerResult<Cell> run_packed(const Cell& cell, const Tensor& data, c10::ArrayRef<int64_t> batch_sizes,
                             const typename Cell::Hidden& h0, const CellWeights& w, bool reverse) {
  using Hidden = typename Cell::Hidden;
  const Tensor projected = w.project_input(data);
  const int64_t steps = static_cast<int64_t>(batch_sizes.size());
  std::vector<Tensor> outputs;
  if (!reverse) {
    std::vector<Hidden> finished;
    Hidden h = h0;
    int64_t offset = 0, last = batch_sizes.empty() ? 0 : batch_sizes[0];
    for (int64_t t = 0; t < steps; ++t) {
      const int64_t batch = batch_sizes[t];
      Tensor x = projected.narrow(0, offset, batch);
      offset += batch;
      if (batch < last) {
        finished.push_back(rows(h, batch, last));
        h = rows(h, 0, batch);
      }
      last = batch;
      h = cell(x, h, w, /*x_projected=*/true);
      outputs.push_back(output_of(h));
    }
    finished.push_back(h);
    std::reverse(finished.begin(), finished.end());
    return {at::cat(outputs, 0), concat_rows(finished)};
  }
  int64_t offset = data.size(0), last = batch_sizes[steps - 1];
  Hidden h = rows(h0, 0, last);
  for (int64_t t = steps - 1; t >= 0; --t) {
    const int64_t batch = batch_sizes[t];
    if (batch > last) h = concat_rows(std::vector<Hidden>{h, rows(h0, last, batch)});
    Tensor x = projected.narrow(0, offset - batch, batch);
    offset -= batch;
    last = batch;
    h = cell(x, h, w, /*x_projected=*/true);
    outputs.push_back(output_of(h));
  }
  std::reverse(outputs.begin(), outputs.end());
  return {at::cat(outputs, 0), h};
}

// --- stacks of layers, one or two directions each

struct Sequence {
  Tensor data;                         // [time, batch, features], or packed rows
  c10::ArrayRef<int64_t> batch_sizes;  // empty for a padded sequence
  bool packed;
};

template <class Cell>
std::pair<Tensor, std::vector<typename Cell::Hidden>> run_stack(const Cell& cell, Sequence input,
                                                                const std::vector<typename Cell::Hidden>& hiddens,
                                                                const std::vector<CellWeights>& weights,
                                                                int64_t num_layers, double dropout_p, bool train,
                                                                bool bidirectional) {
  const size_t directions = bidirectional ? 2 : 1;
  TORCH_CHECK(static_cast<size_t>(num_layers) * directions == hiddens.size(),
              "Expected more hidden states in stacked_rnn");
  TORCH_CHECK(static_cast<size_t>(num_layers) * directions == weights.size(), "Expected more weights in stacked_rnn");
  auto run = [&](size_t i, bool reverse) {
    return input.packed ? run_packed(cell, input.data, input.batch_sizes, hiddens[i], weights[i], reverse)
                        : run_dense(cell, input.data, hiddens[i], weights[i], reverse);
  };
  std::vector<typename Cell::Hidden> finals;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    const size_t i = layer * directions;
    auto forward = run(i, false);
    finals.push_back(forward.second);
    if (bidirectional) {
      auto backward = run(i + 1, true);
      finals.push_back(backward.second);
      input.data = at::cat({forward.first, backward.first}, forward.first.dim() - 1);
    } else {
      input.data = forward.first;
    }
    if (dropout_p != 0 && train && layer < num_layers - 1) input.data = at::dropout(input.data, dropout_p, true);
  }
  return {input.data, std::move(finals)};
}

// nn.RNN and nn.GRU: one hidden tensor [layers * directions, batch, hidden].
template <class Cell>
std::tuple<Tensor, Tensor> one_hidden_rnn(Sequence input, const Tensor& hx, TensorList params, bool has_biases,
                                          int64_t num_layers, double dropout_p, bool train, bool bidirectional) {
  at::native::check_attributes(input.data, params, hx);
  auto [output, finals] = run_stack(Cell{}, input, hx.unbind(0), unflatten(params, has_biases, false), num_layers,
                                    dropout_p, train, bidirectional);
  return {output, at::stack(finals, 0)};
}

template <class Cell>
std::tuple<Tensor, Tensor> one_hidden_rnn_padded(const Tensor& input, const Tensor& hx, TensorList params,
                                                 bool has_biases, int64_t num_layers, double dropout_p, bool train,
                                                 bool bidirectional, bool batch_first) {
  auto result = one_hidden_rnn<Cell>({batch_first ? input.transpose(0, 1) : input, {}, false}, hx, params,
                                     has_biases, num_layers, dropout_p, train, bidirectional);
  if (batch_first) std::get<0>(result).transpose_(0, 1);
  return result;
}

c10::ArrayRef<int64_t> batch_sizes_of(const Tensor& batch_sizes) {
  TORCH_CHECK(batch_sizes.device().is_cpu() && batch_sizes.scalar_type() == at::kLong && batch_sizes.dim() == 1,
              "batch_sizes of a packed sequence must be a 1-D int64 CPU tensor, got ", batch_sizes.scalar_type(),
              " on ", batch_sizes.device(), " with ", batch_sizes.dim(), " dimensions");
  TORCH_CHECK(batch_sizes.is_contiguous() && batch_sizes.numel() > 0,
              "batch_sizes of a packed sequence must be contiguous and not empty");
  return {batch_sizes.const_data_ptr<int64_t>(), static_cast<size_t>(batch_sizes.numel())};
}

template <class Cell>
std::tuple<Tensor, Tensor> one_hidden_rnn_packed(const Tensor& data, const Tensor& batch_sizes, const Tensor& hx,
                                                 TensorList params, bool has_biases, int64_t num_layers,
                                                 double dropout_p, bool train, bool bidirectional) {
  return one_hidden_rnn<Cell>({data, batch_sizes_of(batch_sizes), true}, hx, params, has_biases, num_layers,
                              dropout_p, train, bidirectional);
}

// --- LSTM

// Which LSTMs the CPU hands to oneDNN depends on the dtype, the grad mode, the
// host's instruction set and torch.backends.mkldnn; the rule lives in ATen and
// its CPU-feature checks are not public. Ask the CPU itself: run a tiny LSTM
// there once per case and watch whether it calls mkldnn_rnn_layer.
thread_local bool probe_saw_onednn = false;

bool cpu_lstm_uses_onednn(at::ScalarType dtype) {
  const auto key = std::make_tuple(dtype, at::GradMode::is_enabled(), at::globalContext().userEnabledMkldnn());
  static std::mutex mutex;
  static std::map<decltype(key), bool> verdicts;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = verdicts.find(key); it != verdicts.end()) return it->second;
  // Python modes (fake tensors while compiling) and CPU autocast must not see the probe.
  c10::impl::ExcludeDispatchKeyGuard plain(c10::DispatchKeySet(
      {c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::AutocastCPU}));
  probe_saw_onednn = false;
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        if (std::strcmp(fn.name(), "aten::mkldnn_rnn_layer") == 0) probe_saw_onednn = true;
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  try {
    const auto options = at::TensorOptions().dtype(dtype);
    const Tensor x = at::zeros({1, 1, 1}, options), h = at::zeros({1, 1, 1}, options);
    const Tensor w = at::zeros({4, 1}, options);
    at::lstm(x, {h, h}, {w, w}, /*has_biases=*/false, 1, 0., /*train=*/false, false, false);
  } catch (const c10::Error&) {
    probe_saw_onednn = false;  // the CPU has no LSTM for this dtype: the generic path reports it
  }
  at::removeCallback(handle);
  return verdicts[key] = probe_saw_onednn;
}

// oneDNN's LSTM, layer by layer as the CPU calls it (no projections, padded input).
std::tuple<Tensor, Tensor, Tensor> lstm_onednn(const Tensor& input, TensorList hx, TensorList params, bool has_biases,
                                               int64_t num_layers, double dropout_p, bool train, bool bidirectional,
                                               bool batch_first) {
  constexpr int64_t kLSTMMode = 2;  // ideep::rnn_kind::LSTM
  const Tensor x = (batch_first ? input.transpose(0, 1) : input).contiguous();
  const Tensor h0 = hx[0].contiguous(), c0 = hx[1].contiguous();
  const int64_t hidden_size = h0.size(2), directions = bidirectional ? 2 : 1, per_cell = has_biases ? 4 : 2;
  TORCH_CHECK(static_cast<int64_t>(params.size()) == num_layers * directions * per_cell,
              "got an incorrect number of RNN parameters");
  Tensor layer_input = x;
  std::vector<Tensor> outputs(directions), hy(num_layers * directions), cy(num_layers * directions);
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    for (int64_t d = 0; d < directions; ++d) {
      const int64_t i = layer * directions + d;
      const TensorList w = params.slice(i * per_cell, per_cell);
      const Tensor h = h0[i];
      const Tensor c = c0[i];
      const Tensor b_ih = has_biases ? w[2] : at::zeros(w[0].sizes(), w[0].options());
      const Tensor b_hh = has_biases ? w[3] : at::zeros(w[1].sizes(), w[1].options());
      auto result = at::mkldnn_rnn_layer(layer_input, w[0], w[1], b_ih, b_hh, h, c, /*reverse=*/d > 0, {}, kLSTMMode,
                                         hidden_size, num_layers, has_biases, bidirectional, batch_first, train);
      outputs[d] = std::get<0>(result);
      hy[i] = std::get<1>(result);
      cy[i] = std::get<2>(result);
    }
    layer_input = directions == 1 ? outputs[0] : at::cat(outputs, -1);
    if (dropout_p != 0 && train && layer < num_layers - 1) layer_input = at::dropout(layer_input, dropout_p, true);
  }
  Tensor output = batch_first ? layer_input.transpose(0, 1) : layer_input;
  return {output, at::stack(hy, 0), at::stack(cy, 0)};
}

void check_lstm_hidden(TensorList hx, int64_t num_layers, bool bidirectional) {
  TORCH_CHECK(hx.size() == 2, "lstm expects two hidden states");
  const int64_t expected = num_layers * (bidirectional ? 2 : 1);
  for (size_t k = 0; k < 2; ++k) {
    TORCH_CHECK(hx[k].dim() == 3, "lstm expects ", k == 0 ? "h" : "c", "x to be 3-dimensional, got ", hx[k].dim(),
                " dimensions");
    TORCH_CHECK(hx[k].size(0) == expected, "lstm expects ", k == 0 ? "h" : "c", "x.size(0) to be ", expected,
                " (num_layers * num_directions), got ", hx[k].size(0));
  }
}

std::tuple<Tensor, Tensor, Tensor> lstm_generic(Sequence input, TensorList hx, TensorList params, bool has_biases,
                                                int64_t num_layers, double dropout_p, bool train, bool bidirectional,
                                                bool has_projections) {
  at::native::check_attributes(input.data, params, hx);
  std::vector<Tensor> h0 = hx[0].unbind(0), c0 = hx[1].unbind(0);
  std::vector<LSTMCell::Hidden> hiddens;
  for (size_t i = 0; i < h0.size(); ++i) hiddens.emplace_back(h0[i], c0[i]);
  auto [output, finals] = run_stack(LSTMCell{}, input, hiddens, unflatten(params, has_biases, has_projections),
                                    num_layers, dropout_p, train, bidirectional);
  std::vector<Tensor> hy, cy;
  for (const auto& hc : finals) hy.push_back(hc.first), cy.push_back(hc.second);
  return {output, at::stack(hy, 0), at::stack(cy, 0)};
}

bool has_projections(TensorList hx) { return hx[0].sym_size(2) != hx[1].sym_size(2); }

// --- cells as operators: the CPU's cell without a precomputed projection

void check_cell(const Tensor& input, TensorList hiddens, const Tensor& w_ih, const Tensor& w_hh, int64_t gates) {
  TORCH_CHECK(w_ih.dim() == 2 && w_hh.dim() == 2, "RNN cell weights must be 2-dimensional");
  const int64_t hidden_size = w_hh.size(1);
  TORCH_CHECK(w_ih.size(0) == gates * hidden_size && w_hh.size(0) == gates * hidden_size, "RNN cell weights must have ",
              gates, " * hidden_size = ", gates * hidden_size, " rows, got ", w_ih.size(0), " and ", w_hh.size(0));
  TORCH_CHECK(input.size(-1) == w_ih.size(1), "input has inconsistent input_size: got ", input.size(-1),
              " expected ", w_ih.size(1));
  for (const Tensor& h : hiddens) {
    TORCH_CHECK(input.size(0) == h.size(0), "Input batch size ", input.size(0), " doesn't match hidden batch size ",
                h.size(0));
    TORCH_CHECK(h.size(1) == hidden_size, "hidden has inconsistent hidden_size: got ", h.size(1), ", expected ",
                hidden_size);
  }
}

} // namespace

std::tuple<Tensor, Tensor, Tensor> lstm_padded(const Tensor& input, TensorList hx, TensorList params, bool has_biases,
                                               int64_t num_layers, double dropout_p, bool train, bool bidirectional,
                                               bool batch_first) {
  check_lstm_hidden(hx, num_layers, bidirectional);
  const bool projections = has_projections(hx);
  if (!projections && input.numel() != 0 && !input.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
      cpu_lstm_uses_onednn(input.scalar_type())) {
    at::native::check_attributes(input, params, hx);
    return lstm_onednn(input, hx, params, has_biases, num_layers, dropout_p, train, bidirectional, batch_first);
  }
  auto result = lstm_generic({batch_first ? input.transpose(0, 1) : input, {}, false}, hx, params, has_biases,
                             num_layers, dropout_p, train, bidirectional, projections);
  if (batch_first) std::get<0>(result) = std::get<0>(result).transpose(0, 1);
  return result;
}

std::tuple<Tensor, Tensor, Tensor> lstm_packed(const Tensor& data, const Tensor& batch_sizes, TensorList hx,
                                               TensorList params, bool has_biases, int64_t num_layers,
                                               double dropout_p, bool train, bool bidirectional) {
  check_lstm_hidden(hx, num_layers, bidirectional);
  return lstm_generic({data, batch_sizes_of(batch_sizes), true}, hx, params, has_biases, num_layers, dropout_p, train,
                      bidirectional, has_projections(hx));
}

// The padded (`.input`) and packed (`.data`) overloads of one-hidden-state RNNs,
// as explicit_ops.h declares them.
#define TORCHNEURON_ONE_HIDDEN_RNN_KERNELS(name, Cell)                                                              \
  std::tuple<Tensor, Tensor> name##_padded(const Tensor& input, const Tensor& hx, TensorList params, bool has_biases, \
                                           int64_t num_layers, double dropout_p, bool train, bool bidirectional,     \
                                           bool batch_first) {                                                       \
    return one_hidden_rnn_padded<Cell>(input, hx, params, has_biases, num_layers, dropout_p, train, bidirectional,  \
                                       batch_first);                                                                 \
  }                                                                                                                  \
  std::tuple<Tensor, Tensor> name##_packed(const Tensor& data, const Tensor& batch_sizes, const Tensor& hx,         \
                                           TensorList params, bool has_biases, int64_t num_layers, double dropout_p, \
                                           bool train, bool bidirectional) {                                         \
    return one_hidden_rnn_packed<Cell>(data, batch_sizes, hx, params, has_biases, num_layers, dropout_p, train,     \
                                       bidirectional);                                                               \
  }
TORCHNEURON_ONE_HIDDEN_RNN_KERNELS(gru, GRUCell)
TORCHNEURON_ONE_HIDDEN_RNN_KERNELS(rnn_tanh, SimpleCell<tanh_of>)
TORCHNEURON_ONE_HIDDEN_RNN_KERNELS(rnn_relu, SimpleCell<relu_of>)
#undef TORCHNEURON_ONE_HIDDEN_RNN_KERNELS

std::tuple<Tensor, Tensor> lstm_cell(const Tensor& input, TensorList hx, const Tensor& w_ih, const Tensor& w_hh,
                                     const std::optional<Tensor>& b_ih, const std::optional<Tensor>& b_hh) {
  TORCH_CHECK(hx.size() == 2, "lstm_cell expects two hidden states");
  check_cell(input, hx, w_ih, w_hh, 4);
  auto [h, c] = LSTMCell{}(input, {hx[0], hx[1]}, {w_ih, w_hh, b_ih.value_or(Tensor()), b_hh.value_or(Tensor())},
                           /*x_projected=*/false);
  return {h, c};
}

Tensor gru_cell(const Tensor& input, const Tensor& hx, const Tensor& w_ih, const Tensor& w_hh,
                const std::optional<Tensor>& b_ih, const std::optional<Tensor>& b_hh) {
  check_cell(input, {hx}, w_ih, w_hh, 3);
  return GRUCell{}(input, hx, {w_ih, w_hh, b_ih.value_or(Tensor()), b_hh.value_or(Tensor())}, /*x_projected=*/false);
}

} // namespace torchneuron::ops
