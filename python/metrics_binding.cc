// The _stoker module's metrics (stoker.metrics is the Python side).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "binding.h"
#include "stoker/metrics.h"

// ---- metrics (stoker.metrics is the Python side) ----
namespace stoker::python {

void RegisterMetrics(py::module_& m) {
  namespace sm = stoker::metrics;
  m.def(
      "_metrics_enable",
      [](std::string dir, double interval_s, std::string job, int64_t rank) {
        sm::Options o;
        o.dir = std::move(dir);
        o.interval = std::chrono::milliseconds(int64_t(interval_s * 1000));
        o.job = std::move(job);
        o.rank = rank;
        Check(sm::Enable(o));
      },
      py::arg("dir"), py::arg("interval_s"), py::arg("job"), py::arg("rank"));
  m.def("_metrics_disable", [] {
    py::gil_scoped_release release;
    sm::Disable();
  });
  m.def("_metrics_enabled", &sm::Enabled);
  m.def("_metrics_path", &sm::PublishedPath);
  m.def("_metrics_exposition", [] {
    py::gil_scoped_release release;
    return sm::Exposition();
  });
  // Checkpoints: _Checkpointer is metered (metrics::OpenCheckpointer), so
  // C++ counts every save.
  // `with _stoker._CheckpointSaveStarted(time.monotonic_ns()): impl.save(...)`:
  // the save's stall and seconds count from then, so the Python skin's
  // flattening and GPU-to-host copies are in them (metrics::SaveStartedAt).
  struct SaveStarted {
    explicit SaveStarted(int64_t ns) : begin(std::chrono::nanoseconds(ns)) {}
    Clock::time_point begin;
    std::optional<sm::SaveStartedAt> scope;
  };
  py::class_<SaveStarted>(m, "_CheckpointSaveStarted")
      .def(py::init<int64_t>(), py::arg("began_ns"))
      .def("__enter__", [](SaveStarted& s) { s.scope.emplace(s.begin); })
      .def("__exit__", [](SaveStarted& s, py::args) { s.scope.reset(); });
  m.def(
      "_timeline_start", [](std::string log) { Check(sm::StepTimeline::Get().Start(log)); },
      py::arg("log"));
  m.def("_timeline_stop", [] { sm::StepTimeline::Get().Stop(); });
  m.def("_timeline_active", [] { return sm::StepTimeline::Get().active(); });
  m.def(
      "_timeline_set_gpu", [](int i) { sm::StepTimeline::Get().SetGpu(i); }, py::arg("index"));
  // Intervals in time.monotonic_ns() (CLOCK_MONOTONIC, steady_clock's clock).
  m.def(
      "_timeline_add",
      [](int phase, int64_t begin_ns, int64_t end_ns) {
        if (phase < 0 || phase >= sm::kPhases) Check(InvalidArgument("no such phase"));
        sm::StepTimeline::Get().Add(sm::Phase(phase),
                                    Clock::time_point(std::chrono::nanoseconds(begin_ns)),
                                    Clock::time_point(std::chrono::nanoseconds(end_ns)));
      },
      py::arg("phase"), py::arg("begin_ns"), py::arg("end_ns"));
  auto record = [](const sm::StepRecord& r) {
    py::dict d;
    d["step"] = r.step;
    d["seconds"] = r.seconds;
    for (int p = 0; p < sm::kPhases; ++p)
      d[py::str(std::string(sm::PhaseName(sm::Phase(p))))] = r.phase[p];
    d["other"] = r.other;
    d["samples"] = r.samples;
    d["bytes"] = r.bytes;
    d["h2d_copy_seconds"] = r.h2d_copy_seconds;
    if (r.gpu_utilization >= 0) d["gpu_utilization"] = r.gpu_utilization;
    return d;
  };
  m.def("_timeline_mark", [record] { return record(sm::StepTimeline::Get().Mark()); });
  m.def("_timeline_totals", [record] { return record(sm::StepTimeline::Get().Totals()); });
  m.def("_timeline_phases", [] {
    py::list l;
    for (int p = 0; p < sm::kPhases; ++p) l.append(std::string(sm::PhaseName(sm::Phase(p))));
    return l;
  });
  m.def(
      "_write_report", [](std::string log, std::string out) { Check(sm::WriteReport(log, out)); },
      py::arg("run_log"), py::arg("html_path"));
}

}  // namespace stoker::python
