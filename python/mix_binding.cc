// Token windows and mixtures in Python (include/stoker/tokens.h, mix.h):
// the loader's sequence_* options and state field, and _Mix, the C++
// mixture behind stoker.Mix (python/stoker/mix.py). Part of the _stoker
// module.
#include <pybind11/stl.h>

#include "batches.h"
#include "binding.h"
#include "stoker/mix.h"

namespace stoker::python {
namespace {

py::dict StateDict(const MixState& s) {
  py::dict d;
  d["version"] = s.version;
  d["step"] = s.step;
  d["positions"] = s.positions;
  d["dataset_ids"] = s.dataset_ids;
  d["weights"] = s.weights;
  d["seed"] = s.seed;
  d["shuffle"] = s.shuffle;
  d["sequence_length"] = s.sequence_length;
  d["batch_size"] = s.batch_size;
  return d;
}

MixState StateFrom(const py::dict& d) {
  MixState s;
  try {
    s.version = d["version"].cast<uint32_t>();
    s.step = d["step"].cast<uint64_t>();
    s.positions = d["positions"].cast<std::vector<uint64_t>>();
    s.dataset_ids = d["dataset_ids"].cast<std::vector<std::string>>();
    s.weights = d["weights"].cast<std::vector<double>>();
    s.seed = d["seed"].cast<uint64_t>();
    s.shuffle = d["shuffle"].cast<bool>();
    s.sequence_length = d["sequence_length"].cast<uint32_t>();
    s.batch_size = d["batch_size"].cast<uint32_t>();
  } catch (const py::error_already_set& e) {
    Throw(InvalidArgument(std::string("not a stoker.Mix state_dict(): ") + e.what()));
  } catch (const py::cast_error& e) {
    Throw(InvalidArgument(std::string("not a stoker.Mix state_dict(): ") + e.what()));
  }
  return s;
}

class MixHandle {
 public:
  MixHandle(std::vector<MixSource> sources, const MixOptions& options, py::object start) {
    MixOptions o = options;
    if (!start.is_none()) o.start = StateFrom(start.cast<py::dict>());
    Result<std::unique_ptr<Mix>> r = [&] {
      py::gil_scoped_release release;
      return Mix::Open(std::move(sources), o);
    }();
    mix_ = Unwrap(std::move(r));
  }

  py::object Next() {
    Result<Batch> r = [&] {
      py::gil_scoped_release release;
      return mix_->Next();
    }();
    if (!r.ok()) Throw(r.status());
    return BatchDict(*r, output_);
  }

  void SetOutput(py::object array, bool signed_ids, bool widen_unsigned) {
    output_.array = std::move(array);
    output_.signed_ids = signed_ids;
    output_.widen_unsigned = widen_unsigned;
  }

  py::dict State() const { return StateDict(mix_->state()); }

  py::dict Stats() const {
    const MixStats s = mix_->stats();
    py::dict d;
    d["steps"] = s.steps;
    d["bytes_read"] = s.bytes_read;
    d["windows"] = s.windows;
    d["epoch_windows"] = s.epoch_windows;
    d["open_seconds"] = s.open_seconds;
    return d;
  }

  std::vector<double> WeightsAt(uint64_t step) const { return mix_->WeightsAt(step); }

 private:
  std::unique_ptr<Mix> mix_;
  Output output_;
};

}  // namespace

void BindTokens(py::module_& m) {
  // The loader's token-window options, next to the ones stoker_ext.cc binds.
  auto options = py::reinterpret_borrow<py::class_<LoaderOptions>>(m.attr("_LoaderOptions"));
  options.def_readwrite("sequence_length", &LoaderOptions::sequence_length)
      .def_readwrite("sequence_field", &LoaderOptions::sequence_field)
      .def_readwrite("sequence_dtype", &LoaderOptions::sequence_dtype)
      .def_readwrite("sequence_positions", &LoaderOptions::sequence_positions)
      .def_readwrite("sequence_verify", &LoaderOptions::sequence_verify);
  auto state = py::reinterpret_borrow<py::class_<LoaderState>>(m.attr("_LoaderState"));
  state.def_readwrite("sequence_length", &LoaderState::sequence_length);

  py::class_<MixSource>(m, "_MixSource")
      .def(py::init<>())
      .def_readwrite("uri", &MixSource::uri)
      .def_readwrite("weight", &MixSource::weight)
      .def_readwrite("sequence_length", &MixSource::sequence_length)
      .def_readwrite("field", &MixSource::field);
  py::class_<MixSchedulePoint>(m, "_MixSchedulePoint")
      .def(py::init<>())
      .def_readwrite("step", &MixSchedulePoint::step)
      .def_readwrite("weights", &MixSchedulePoint::weights);
  py::class_<MixOptions>(m, "_MixOptions")
      .def(py::init<>())
      .def_readwrite("batch_size", &MixOptions::batch_size)
      .def_readwrite("sequence_length", &MixOptions::sequence_length)
      .def_readwrite("sequence_dtype", &MixOptions::sequence_dtype)
      .def_readwrite("sequence_positions", &MixOptions::sequence_positions)
      .def_readwrite("sequence_verify", &MixOptions::sequence_verify)
      .def_readwrite("shuffle", &MixOptions::shuffle)
      .def_readwrite("seed", &MixOptions::seed)
      .def_readwrite("rank", &MixOptions::rank)
      .def_readwrite("world_size", &MixOptions::world_size)
      .def_readwrite("schedule", &MixOptions::schedule)
      .def_readwrite("prefetch_batches", &MixOptions::prefetch_batches)
      .def_readwrite("store", &MixOptions::store);
  py::class_<MixHandle>(m, "_Mix")
      .def(py::init<std::vector<MixSource>, const MixOptions&, py::object>(), py::arg("sources"),
           py::arg("options"), py::arg("start"))
      .def("next", &MixHandle::Next)
      .def("set_output", &MixHandle::SetOutput, py::arg("array"), py::arg("signed_ids"),
           py::arg("widen_unsigned"))
      .def("state", &MixHandle::State)
      .def("stats", &MixHandle::Stats)
      .def("weights_at", &MixHandle::WeightsAt, py::arg("step"));
  m.def(
      "mix_counts",
      [](std::vector<double> weights, uint32_t batch, uint64_t seed, uint64_t step) {
        return MixCounts(weights, batch, seed, step);
      },
      py::arg("weights"), py::arg("batch"), py::arg("seed"), py::arg("step"));
}

}  // namespace stoker::python
