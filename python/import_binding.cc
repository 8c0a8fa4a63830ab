// stoker._stoker: the importers and the exporter (include/stoker/import.h)
// for Python (stoker.import_webdataset, import_jsonl, export_webdataset).
//
// They run with the GIL released. Progress is reported to a Python callable
// from the calling thread, with the GIL taken for the call; the same point
// asks whether to stop: an exception raised by the callable, or a signal
// (Ctrl-C) pending for Python, cancels the import (nothing is committed) and
// that exception is what the caller sees.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"
#include "stoker/import.h"

namespace stoker::python {
namespace {

// The Python side of a long C++ call: progress dicts to `callback`, and the
// first Python error (the callback's, or a signal's) kept to stop the call
// and to be raised once it returns.
class PythonProgress {
 public:
  explicit PythonProgress(py::object callback) : callback_(std::move(callback)) {}

  void Report(const py::dict& d) {
    if (error_ || callback_.is_none()) return;
    try {
      callback_(d);
    } catch (py::error_already_set& e) {
      error_.emplace(std::move(e));
    }
  }

  // Called with the GIL held.
  bool Cancelled() {
    if (!error_ && PyErr_CheckSignals() != 0) error_.emplace();
    return error_.has_value();
  }

  // After the call: its error, else the Python error that stopped it.
  template <typename T>
  T Finish(Result<T> r) {
    if (error_) throw std::move(*error_);
    return Unwrap(std::move(r));
  }

 private:
  py::object callback_;
  std::optional<py::error_already_set> error_;
};

py::dict ImportResultDict(const std::string& uri, const ImportResult& r) {
  py::dict d;
  d["uri"] = uri;
  d["dataset_id"] = r.manifest.IdHex();
  d["samples"] = r.samples;
  d["skipped"] = r.skipped;
  if (!r.last_skip_reason.empty()) d["last_skip_reason"] = r.last_skip_reason;
  d["shards"] = r.manifest.shards.size();
  d["source_bytes"] = r.source_bytes;
  d["payload_bytes"] = r.manifest.payload_bytes;
  py::list fields;
  for (const format::FieldSpec& f : r.manifest.fields) fields.append(f.Describe());
  d["fields"] = fields;
  d["sources"] = r.sources;
  return d;
}

ImportOptions MakeImportOptions(const std::vector<std::pair<std::string, std::string>>& fields,
                                bool skip_bad, uint64_t shard_bytes, uint32_t threads,
                                PythonProgress* py_progress) {
  ImportOptions o;
  for (const auto& [name, type] : fields) {
    o.fields.push_back(Unwrap(format::ParseFieldSpec(name, type)));
  }
  o.skip_bad = skip_bad;
  if (shard_bytes != 0) o.writer.shard_bytes = shard_bytes;
  o.writer.threads = threads;
  o.progress = [py_progress](const ImportProgress& p) {
    py::gil_scoped_acquire gil;
    py::dict d;
    d["samples"] = p.samples;
    d["bytes_read"] = p.bytes_read;
    d["bytes_total"] = p.bytes_total;
    d["shards"] = p.shards_stored;
    d["skipped"] = p.skipped;
    py_progress->Report(d);
  };
  o.cancelled = [py_progress] {
    py::gil_scoped_acquire gil;
    return py_progress->Cancelled();
  };
  return o;
}

using Fields = std::vector<std::pair<std::string, std::string>>;

py::dict ImportWebDatasetPy(const std::vector<std::string>& sources, const std::string& uri,
                            const Fields& fields, bool skip_bad, uint64_t shard_bytes,
                            uint32_t threads, py::object progress) {
  PythonProgress pp(std::move(progress));
  ImportOptions o = MakeImportOptions(fields, skip_bad, shard_bytes, threads, &pp);
  Result<ImportResult> r = [&]() -> Result<ImportResult> {
    py::gil_scoped_release release;
    STOKER_ASSIGN_OR_RETURN(std::vector<std::string> tars, ListTars(sources));
    return ImportWebDataset(tars, uri, o);
  }();
  return ImportResultDict(uri, pp.Finish(std::move(r)));
}

py::dict ImportJsonlPy(const std::vector<std::string>& paths, const std::string& uri,
                       const Fields& fields, bool skip_bad, uint64_t shard_bytes, uint32_t threads,
                       py::object progress) {
  PythonProgress pp(std::move(progress));
  ImportOptions o = MakeImportOptions(fields, skip_bad, shard_bytes, threads, &pp);
  Result<ImportResult> r = [&] {
    py::gil_scoped_release release;
    return ImportJsonl(paths, uri, o);
  }();
  return ImportResultDict(uri, pp.Finish(std::move(r)));
}

py::dict ImportMegatronPy(const std::vector<std::string>& paths, const std::string& uri,
                          const Fields& fields, uint64_t shard_bytes, uint32_t threads,
                          py::object progress) {
  PythonProgress pp(std::move(progress));
  ImportOptions o = MakeImportOptions(fields, false, shard_bytes, threads, &pp);
  Result<ImportResult> r = [&] {
    py::gil_scoped_release release;
    return ImportMegatron(paths, uri, o);
  }();
  return ImportResultDict(uri, pp.Finish(std::move(r)));
}

py::dict ExportWebDatasetPy(const std::string& uri, const std::string& out_dir,
                            uint64_t samples_per_tar, py::object progress) {
  PythonProgress pp(std::move(progress));
  ExportOptions o;
  if (samples_per_tar != 0) o.samples_per_tar = samples_per_tar;
  o.progress = [&pp](const ExportProgress& p) {
    py::gil_scoped_acquire gil;
    py::dict d;
    d["samples"] = p.samples;
    d["samples_total"] = p.samples_total;
    d["bytes"] = p.bytes;
    d["bytes_total"] = p.bytes_total;
    d["tars"] = p.tars;
    pp.Report(d);
  };
  o.cancelled = [&pp] {
    py::gil_scoped_acquire gil;
    return pp.Cancelled();
  };
  Result<ExportResult> r = [&] {
    py::gil_scoped_release release;
    return ExportWebDataset(uri, out_dir, o);
  }();
  ExportResult e = pp.Finish(std::move(r));
  py::dict d;
  d["samples"] = e.samples;
  d["tars"] = e.tars;
  d["bytes"] = e.bytes;
  d["paths"] = e.paths;
  return d;
}

}  // namespace

void BindImport(py::module_& m) {
  m.def("import_webdataset", &ImportWebDatasetPy, py::arg("sources"), py::arg("uri"),
        py::arg("fields") = Fields{}, py::arg("skip_bad") = false, py::arg("shard_bytes") = 0,
        py::arg("threads") = 0, py::arg("progress") = py::none());
  m.def("import_jsonl", &ImportJsonlPy, py::arg("paths"), py::arg("uri"),
        py::arg("fields") = Fields{}, py::arg("skip_bad") = false, py::arg("shard_bytes") = 0,
        py::arg("threads") = 0, py::arg("progress") = py::none());
  m.def("import_megatron", &ImportMegatronPy, py::arg("paths"), py::arg("uri"),
        py::arg("fields") = Fields{}, py::arg("shard_bytes") = 0, py::arg("threads") = 0,
        py::arg("progress") = py::none());
  m.def("export_webdataset", &ExportWebDatasetPy, py::arg("uri"), py::arg("out_dir"),
        py::arg("samples_per_tar") = 0, py::arg("progress") = py::none());
}

}  // namespace stoker::python
