// torchneuron._C's part of the NKI emulator (torchneuron/nki/): the loops of
// ../kernels/nki_host.h on NumPy arrays. torchneuron.nki.ops.tile_gemm decides
// which tiles go to the bfloat16 GEMM, torchneuron.nki.dtypes.from_compute
// which arrays are rounded here.
#include <torch/csrc/utils/pybind.h>
#include <pybind11/numpy.h>

#include <algorithm>
#include <optional>
#include <type_traits>

#include "../kernels/nki_host.h"
#include "bindings.h"

namespace py = pybind11;

namespace torchneuron {
namespace {

// A 2-D array of `itemsize`-byte elements whose rows are contiguous.
template <typename T>
nki_host::Matrix<T> matrix(const py::array& x, const char* name) {
  TORCH_CHECK(x.ndim() == 2 && x.itemsize() == sizeof(T) && x.strides(1) == sizeof(T) &&
                  x.strides(0) % static_cast<py::ssize_t>(sizeof(T)) == 0,
              "_nki_tile_gemm_bf16: ", name, " must be a 2-D array of ", sizeof(T),
              "-byte elements with contiguous rows");
  void* data = const_cast<void*>(x.data());
  if constexpr (!std::is_const_v<T>) {
    TORCH_CHECK(x.writeable(), "_nki_tile_gemm_bf16: ", name, " must be writeable");
  }
  return {static_cast<T*>(data), x.shape(0), x.shape(1), x.strides(0) / static_cast<py::ssize_t>(sizeof(T))};
}

// A tile staged for the matrix unit (nki_host::StagedOperand), with the array
// it was made from (what a float32 fallback multiplies instead; None once the
// holder lets go of that array and keeps only the storage to stage into).
struct StagedTile {
  nki_host::StagedOperand staged;
  py::object source;
};

// An operand given as an array (staged here, per thread) or as a StagedTile.
const nki_host::StagedOperand& operand(const py::object& x, bool stationary, nki_host::StagedOperand& scratch) {
  const char* role = stationary ? "stationary" : "moving";
  if (py::isinstance<StagedTile>(x)) {
    const auto& t = x.cast<const StagedTile&>().staged;
    TORCH_CHECK(t.stationary == stationary, "_nki_tile_gemm_bf16: ", role, " was staged as the other operand");
    return t;
  }
  TORCH_CHECK(py::isinstance<py::array>(x), "_nki_tile_gemm_bf16: ", role, " must be an array or a staged tile");
  nki_host::stage(matrix<const uint16_t>(x.cast<py::array>(), role), stationary, scratch);
  return scratch;
}

} // namespace

void bind_nki(py::module_& m) {
  m.def("_nki_tile_gemm_bf16_available", &nki_host::bf16_gemm_available);
  py::class_<StagedTile>(m, "_NkiStagedTile")
      .def_readwrite("source", &StagedTile::source)
      .def_property_readonly("cols", [](const StagedTile& t) { return t.staged.cols; });
  // (bf16 K x M or K x N, stationary, into) -> a _NkiStagedTile, for operands
  // used many times; `into`, a tile staged before, is staged again in place
  m.def("_nki_stage_bf16", [](const py::array& x, bool stationary, std::optional<py::object> into) {
    py::object t = into ? *into : py::cast(StagedTile{});
    auto& tile = t.cast<StagedTile&>();
    auto mx = matrix<const uint16_t>(x, stationary ? "stationary" : "moving");
    {
      py::gil_scoped_release no_gil;
      nki_host::stage(mx, stationary, tile.staged);
    }
    tile.source = x;
    return t;
  }, py::arg("x").noconvert(), py::arg("stationary"), py::arg("into") = py::none());
  // (stationary bf16 K x M, moving bf16 K x N, out float32 M x N, accumulate);
  // either operand may be a _NkiStagedTile instead
  m.def("_nki_tile_gemm_bf16", [](const py::object& stationary, const py::object& moving, py::array& out,
                                  bool accumulate) {
    thread_local nki_host::StagedOperand scratch_s, scratch_m;  // per thread: launches run on several threads
    const auto& s = operand(stationary, true, scratch_s);
    const auto& mv = operand(moving, false, scratch_m);
    auto o = matrix<float>(out, "out");
    py::gil_scoped_release no_gil;
    nki_host::bf16_gemm(s, mv, o, accumulate);
  }, py::arg("stationary"), py::arg("moving"), py::arg("out").noconvert(), py::arg("accumulate"));
  // ([(stationary, moving) _NkiStagedTile pairs], out float32 M x N,
  // accumulate): the pairs' GEMMs in turn into `out` (nki_host::bf16_gemm_chain)
  m.def("_nki_tile_gemm_chain_bf16", [](const std::vector<std::pair<py::object, py::object>>& pairs, py::array& out,
                                        bool accumulate) {
    std::vector<nki_host::GemmPair> chain;
    chain.reserve(pairs.size());
    for (const auto& [s, mv] : pairs) {
      TORCH_CHECK(py::isinstance<StagedTile>(s) && py::isinstance<StagedTile>(mv),
                  "_nki_tile_gemm_chain_bf16: every operand must be a staged tile");
      chain.push_back({&s.cast<const StagedTile&>().staged, &mv.cast<const StagedTile&>().staged});
    }
    auto o = matrix<float>(out, "out");
    py::gil_scoped_release no_gil;
    nki_host::bf16_gemm_chain(chain, o, accumulate);
  }, py::arg("pairs"), py::arg("out").noconvert(), py::arg("accumulate"));
  // (src float32, C-contiguous; dst bfloat16 of the same shape, C-contiguous
  // or 2-D with contiguous rows, such as a tile's view of HBM)
  m.def("_nki_round_to_bf16", [](const py::array& src, py::array& dst) {
    const bool rows = dst.ndim() == 2 && dst.strides(1) == 2 && dst.strides(0) % 2 == 0;
    TORCH_CHECK(src.itemsize() == 4 && dst.itemsize() == 2 && src.ndim() == dst.ndim() &&
                    std::equal(src.shape(), src.shape() + src.ndim(), dst.shape()) &&
                    (src.flags() & py::array::c_style) && ((dst.flags() & py::array::c_style) || rows) &&
                    dst.writeable(),
                "_nki_round_to_bf16: a C-contiguous float32 array and a writeable bfloat16 one of its shape, "
                "C-contiguous or with contiguous rows");
    const auto* s = static_cast<const float*>(src.data());
    auto* d = static_cast<uint16_t*>(dst.mutable_data());
    const bool whole = dst.flags() & py::array::c_style;
    const int64_t n_rows = whole ? 1 : dst.shape(0), row = whole ? src.size() : dst.shape(1);
    const int64_t stride = whole ? 0 : dst.strides(0) / 2;
    py::gil_scoped_release no_gil;
    for (int64_t i = 0; i < n_rows; ++i) nki_host::round_to_bf16(s + i * row, d + i * stride, row);
  }, py::arg("src").noconvert(), py::arg("dst").noconvert());
}

} // namespace torchneuron
