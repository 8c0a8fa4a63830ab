// stoker._stoker._Writer: DatasetWriter for Python (stoker.Writer). Values
// are taken from Python objects with the GIL held (bytes-like objects and
// contiguous numpy arrays without a copy, str as its UTF-8), then written with
// the GIL released: the record is copied into the shard being built and the
// checks (UTF-8, JSON, shapes) are C++'s.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "binding.h"
#include "stoker/writer.h"

namespace stoker::python {
namespace {

using format::FieldSpec;
using format::FieldType;

class WriterHandle {
 public:
  WriterHandle(const std::string& uri, const std::vector<std::pair<std::string, std::string>>& schema,
               uint64_t shard_bytes, uint32_t threads, std::vector<std::string> classes,
               std::optional<uint32_t> part, py::object progress) {
    std::vector<FieldSpec> fields;
    for (const auto& [name, type] : schema) fields.push_back(Unwrap(format::ParseFieldSpec(name, type)));
    WriterOptions o;
    if (shard_bytes != 0) o.shard_bytes = shard_bytes;
    o.threads = threads;
    o.classes = std::move(classes);
    o.created_by = std::string("stoker ") + STOKER_VERSION + " python writer";
    if (!progress.is_none()) {
      progress_ = progress;
      o.progress = [this](const WriterProgress& p) {
        py::gil_scoped_acquire gil;
        progress_(p.records, p.bytes, p.shards_stored);
      };
    }
    py::gil_scoped_release release;
    writer_ = part ? Unwrap(DatasetWriter::CreatePart(uri, *part, std::move(fields), o))
                   : Unwrap(DatasetWriter::Create(uri, std::move(fields), o));
  }

  ~WriterHandle() {
    py::gil_scoped_release release;
    writer_.reset();
  }

  std::vector<std::string> Names() const {
    std::vector<std::string> out;
    for (const FieldSpec& f : writer_->fields()) out.push_back(f.name);
    return out;
  }

  // One record: a sequence of values in schema order (stoker.Writer maps a
  // dict onto it).
  void Write(const py::sequence& values) {
    const auto& fields = writer_->fields();
    const size_t n = std::min<size_t>(values.size(), fields.size());
    std::vector<format::FieldValue> v(values.size());
    std::vector<py::object> keep(values.size());  // owners of the bytes below
    // Leaked on purpose: a static py::object would be released by exit()
    // after the interpreter is gone (an abort at exit once torch is loaded).
    static py::object& json_dumps = *new py::object(py::module_::import("json").attr("dumps"));
    static py::object& np = *new py::object(py::module_::import("numpy"));
    for (size_t f = 0; f < n; ++f) {
      py::object x = values[f];
      const FieldSpec& spec = fields[f];
      switch (spec.type) {
        case FieldType::kInt64:
          v[f].i64 = x.cast<int64_t>();
          continue;
        case FieldType::kFloat32:
        case FieldType::kFloat64:
          v[f].f64 = x.cast<double>();
          continue;
        case FieldType::kJson:
          if (!py::isinstance<py::str>(x) && !py::isinstance<py::bytes>(x)) x = json_dumps(x);
          break;
        case FieldType::kArray:
          if (!PyObject_CheckBuffer(x.ptr()) || py::isinstance<py::list>(x)) {
            if (spec.dtype == format::DType::kBFloat16) {
              Throw(InvalidArgument("field '" + spec.name +
                                    "' (bfloat16): give its bytes or a buffer, numpy has no "
                                    "bfloat16"));
            }
            x = np.attr("ascontiguousarray")(x, std::string(format::DTypeName(spec.dtype)));
          } else if (py::isinstance<py::array>(x)) {
            x = np.attr("ascontiguousarray")(x);
          }
          break;
        default:
          break;
      }
      if (py::isinstance<py::str>(x)) {
        Py_ssize_t size;
        const char* utf8 = PyUnicode_AsUTF8AndSize(x.ptr(), &size);
        if (utf8 == nullptr) throw py::error_already_set();
        v[f].bytes = {reinterpret_cast<const std::byte*>(utf8), size_t(size)};
      } else {
        py::buffer_info info = py::reinterpret_borrow<py::buffer>(x).request();
        if (!PyBuffer_IsContiguous(info.view(), 'C')) {
          Throw(InvalidArgument("field '" + spec.name + "': the buffer is not contiguous"));
        }
        v[f].bytes = {static_cast<const std::byte*>(info.ptr),
                      size_t(info.size) * size_t(info.itemsize)};
      }
      keep[f] = x;
    }
    py::gil_scoped_release release;
    std::lock_guard lock(mu_);
    Check(writer_->Write(v));
  }

  py::dict Close() {
    format::Manifest m;
    {
      py::gil_scoped_release release;
      std::lock_guard lock(mu_);
      m = Unwrap(writer_->Close());
    }
    py::dict d;
    d["uri"] = writer_->uri();
    d["dataset_id"] = m.IdHex();
    d["samples"] = m.sample_count;
    d["shards"] = m.shards.size();
    d["payload_bytes"] = m.payload_bytes;
    d["format_version"] = m.format_version;
    return d;
  }

  uint64_t Records() const { return writer_->records(); }

 private:
  std::mutex mu_;
  py::object progress_;
  std::unique_ptr<DatasetWriter> writer_;
};

}  // namespace

void BindWriter(py::module_& m) {
  py::class_<WriterHandle>(m, "_Writer")
      .def(py::init<const std::string&, const std::vector<std::pair<std::string, std::string>>&,
                    uint64_t, uint32_t, std::vector<std::string>, std::optional<uint32_t>,
                    py::object>(),
           py::arg("uri"), py::arg("fields"), py::arg("shard_bytes") = 0, py::arg("threads") = 0,
           py::arg("classes") = std::vector<std::string>{}, py::arg("part") = py::none(),
           py::arg("progress") = py::none())
      .def("names", &WriterHandle::Names)
      .def("write", &WriterHandle::Write, py::arg("values"))
      .def("close", &WriterHandle::Close)
      .def_property_readonly("records", &WriterHandle::Records);
  // The C++ writer's own rate, for bench/writer_rate.py: `n` records of
  // (payload, i) written from a C++ loop.
  m.def(
      "_write_repeated",
      [](const std::string& uri, const py::bytes& payload, uint64_t n) {
        const std::string data = payload;
        py::gil_scoped_release release;
        auto w = Unwrap(DatasetWriter::Create(
            uri, {{"image", FieldType::kBytes}, {"label", FieldType::kInt64}}, {}));
        format::FieldValue v[2];
        v[0].bytes = std::as_bytes(std::span(data.data(), data.size()));
        for (uint64_t i = 0; i < n; ++i) {
          v[1].i64 = int64_t(i);
          Check(w->Write(v));
        }
        Unwrap(w->Close());
      },
      py::arg("uri"), py::arg("payload"), py::arg("n"));
  m.def(
      "commit_parts",
      [](const std::string& uri, uint32_t parts) {
        format::Manifest mf;
        {
          py::gil_scoped_release release;
          mf = Unwrap(CommitParts(uri, parts));
        }
        py::dict d;
        d["uri"] = uri;
        d["samples"] = mf.sample_count;
        d["shards"] = mf.shards.size();
        d["parts"] = parts;
        return d;
      },
      py::arg("uri"), py::arg("parts"));
}

}  // namespace stoker::python
