// The _stoker module's loader: the dataset as a dict, _Loader (batches as
// batches.h makes them), decode options, and pack, inspect and verify.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "batches.h"
#include "binding.h"
#include "stoker/dataset.h"
#include "stoker/decode.h"
#include "stoker/format.h"
#include "stoker/loader.h"
#include "stoker/metrics.h"
#include "stoker/pack.h"
#include "stoker/store.h"

namespace stoker::python {
namespace {

// ---- the dataset as a dict ---------------------------------------------------

py::dict ManifestDict(std::string_view uri, const format::Manifest& m) {
  uint64_t bytes = 0;
  py::list shard_samples;
  for (size_t i = 0; i < m.shards.size(); ++i) {
    bytes += m.shards.bytes(i);
    shard_samples.append(m.shards.samples(i));
  }
  py::list fields;
  for (const auto& f : m.fields) {
    py::dict field;
    field["name"] = f.name;
    field["type"] = std::string(format::FieldTypeName(f.type));
    if (f.type == format::FieldType::kArray) {  // a variable dimension is None
      py::list shape;
      for (int64_t x : f.shape) {
        shape.append(x == format::kVariableDim ? py::object(py::none()) : py::int_(x));
      }
      field["dtype"] = std::string(format::DTypeName(f.dtype));
      field["shape"] = py::tuple(shape);
    }
    fields.append(field);
  }
  py::dict d;
  d["uri"] = std::string(uri);
  d["format_version"] = m.format_version;
  d["dataset_id"] = m.IdHex();
  d["samples"] = m.sample_count;
  d["shards"] = m.shards.size();
  d["shard_samples"] = shard_samples;
  d["bytes"] = bytes;
  d["payload_bytes"] = m.payload_bytes;
  d["max_sample_bytes"] = m.max_sample_bytes;
  d["fields"] = fields;
  d["classes"] = m.classes;
  d["created_by"] = m.created_by;
  if (m.table.key.empty()) {
    d["shard_table"] = py::none();  // format v1: the manifest lists the shards
  } else {
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", (unsigned long long)m.table.header_hash);
    py::dict t;
    t["key"] = m.table.key;
    t["records"] = m.table.records;
    t["bytes"] = m.table.bytes;
    t["header_hash"] = std::string(hash);
    d["shard_table"] = t;
  }
  return d;
}

// ---- the loader ---------------------------------------------------------------

class LoaderHandle {
 public:
  LoaderHandle(const std::string& uri, const LoaderOptions& options) : uri_(uri) {
    Result<std::unique_ptr<Loader>> r = [&] {
      py::gil_scoped_release release;
      return metrics::OpenLoader(uri, options);  // metered when metrics are on
    }();
    loader_ = Unwrap(std::move(r));
    info_ = ManifestDict(uri, loader_->manifest());
  }

  // The next batch as a dict of arrays, or None when the epoch is over.
  py::object Next() {
    Result<Batch> r = Locked([](Loader& l) { return l.Next(); });
    if (!r.ok()) {
      if (r.status().code() == Code::kOutOfRange) return py::none();
      Throw(r.status());
    }
    const auto buffer = r->buffer();
    last_buffer_ = {reinterpret_cast<uintptr_t>(buffer.data()), buffer.size()};
    return r->device() ? DeviceBatchDict(*r, output_) : BatchDict(*r, output_);
  }

  void SetOutput(py::object array, py::object bytes_column, bool signed_ids,
                 py::object from_dlpack, bool widen_unsigned) {
    output_ = {std::move(array), std::move(bytes_column), signed_ids, std::move(from_dlpack),
               widen_unsigned};
  }

  void StartEpoch(uint64_t epoch, uint64_t position) {
    Check(Locked([&](Loader& l) { return l.StartEpoch(epoch, position); }));
  }
  // Loader::Prefetch: `epoch` read ahead, kept for the next StartEpoch of it.
  void Prefetch(uint64_t epoch) {
    Check(Locked([&](Loader& l) { return l.Prefetch(epoch); }));
  }

  uint64_t NumBatches() {
    return Locked([](Loader& l) { return l.num_batches(); });
  }

  // The C++ plan's batch count for (epoch, position): len() and
  // num_batches in Python are this, never recomputed there.
  uint64_t BatchesFrom(uint64_t epoch, uint64_t position) {
    return Unwrap(Locked([&](Loader& l) { return l.BatchesFrom(epoch, position); }));
  }

  // Positions of one epoch: samples, or token windows (sequence_length).
  uint64_t EpochPositions() {
    return Locked([](Loader& l) { return l.epoch_positions(); });
  }

  std::pair<uint64_t, uint64_t> State() {
    const LoaderState s = Locked([](Loader& l) { return l.state(); });
    return {s.epoch, s.position};
  }

  // The state at (epoch, position) with this loader's identity (versioned;
  // what Loader.state_dict() saves).
  LoaderState Identified(uint64_t epoch, uint64_t position) const {
    return IdentifiedState(epoch, position, loader_->manifest(), loader_->options());
  }

  // Whether this loader may resume from `s` (CheckResumeState's error).
  void CheckResume(const LoaderState& s) const {
    Check(CheckResumeState(s, loader_->manifest(), loader_->options()).WithContext(uri_));
  }

  py::dict Stats() {
    const LoaderStats s = Locked([](Loader& l) { return l.stats(); });
    py::dict d;
    d["shards_read"] = s.shards_read;
    d["bytes_read"] = s.bytes_read;
    d["samples_delivered"] = s.samples_delivered;
    d["batches_delivered"] = s.batches_delivered;
    d["read_retries"] = s.read_retries;
    d["decode_skipped"] = s.decode_skipped;
    d["shared_batches"] = s.shared_batches;
    d["decoded_hardware"] = s.decoded_hardware;
    d["decoded_cuda"] = s.decoded_cuda;
    d["decoded_cpu"] = s.decoded_cpu;
    d["decode_path"] = s.decode_path;
    d["decode_cpu_share"] = s.decode_cpu_share;
    d["wait_seconds"] = std::chrono::duration<double>(s.wait_time).count();
    d["copier_wait_seconds"] = std::chrono::duration<double>(s.copier_wait_time).count();
    d["gpu_decode_seconds"] = std::chrono::duration<double>(s.gpu_decode_time).count();
    d["gpu_decode_wait_seconds"] = std::chrono::duration<double>(s.gpu_decode_wait_time).count();
    d["copier_cpu_seconds"] = std::chrono::duration<double>(s.copier_cpu_time).count();
    d["peak_buffer_bytes"] = s.peak_buffer_bytes;
    d["h2d_bytes"] = s.h2d_bytes;
    d["h2d_seconds"] = std::chrono::duration<double>(s.h2d_time).count();
    d["device_bytes"] = s.device_bytes;
    d["peak_device_bytes"] = s.peak_device_bytes;
    d["pinned_bytes"] = s.pinned_bytes;
    d["remote_bytes"] = s.remote_bytes;
    d["cache_bytes"] = s.cache_bytes;
    d["cache_hits"] = s.cache_hits;
    d["cache_misses"] = s.cache_misses;
    d["cache_fetch_waits"] = s.cache_fetch_waits;
    d["cache_evictions"] = s.cache_evictions;
    d["cache_refetches"] = s.cache_refetches;
    return d;
  }

  // Stops the workers and frees the buffers not held by batches. Idempotent.
  void Close() {
    py::gil_scoped_release release;
    std::lock_guard lock(mu_);
    loader_.reset();
  }

  // After fork(): the workers do not exist in the child, so the Loader can
  // neither be used nor destroyed (joining them would hang). Leak it.
  void Abandon() { (void)loader_.release(); }

  const py::dict& info() const { return info_; }
  std::string read_unit() const { return std::string(loader_->read_unit()); }
  std::pair<uintptr_t, size_t> last_buffer() const { return last_buffer_; }

 private:
  // Runs f(loader) without the GIL, holding the loader's mutex. A closed
  // loader raises (Cancelled, "the loader is closed").
  template <typename F>
  auto Locked(F f) -> decltype(f(std::declval<Loader&>())) {
    std::optional<decltype(f(std::declval<Loader&>()))> result;
    {
      py::gil_scoped_release release;
      std::lock_guard lock(mu_);
      if (loader_) result.emplace(f(*loader_));
    }
    if (!result) Throw(Cancelled("the loader is closed"));
    return std::move(*result);
  }

  std::string uri_;  // for messages
  std::mutex mu_;
  std::unique_ptr<Loader> loader_;
  py::dict info_;
  Output output_;
  std::pair<uintptr_t, size_t> last_buffer_{0, 0};
};

// ---- decode options (stoker/decode.h), built by stoker/loader.py ------------

template <typename E>
void EnumProperty(py::class_<DecodeOptions>& c, const char* name, E DecodeOptions::*member) {
  c.def_property(
      name, [member](const DecodeOptions& o) { return int(o.*member); },
      [member](DecodeOptions& o, int v) { o.*member = E(v); });
}

void TripleProperty(py::class_<DecodeOptions>& c, const char* name,
                    float (DecodeOptions::*member)[3]) {
  c.def_property(
      name,
      [member](const DecodeOptions& o) {
        return std::array<float, 3>{(o.*member)[0], (o.*member)[1], (o.*member)[2]};
      },
      [member](DecodeOptions& o, std::array<float, 3> v) {
        std::copy(v.begin(), v.end(), o.*member);
      });
}

// DecodeSample on one JPEG into a new array (HWC or CHW): the loader's
// per-sample work without a dataset, for tests and bench/augment_bench.py.
py::array DecodeOne(const DecodeOptions& o, py::bytes jpeg, uint64_t seed, uint64_t epoch,
                    uint64_t sample_id) {
  Check(ValidateDecodeOptions(o));
  std::vector<py::ssize_t> shape{o.height, o.width, 3};
  if (o.layout == ImageLayout::kNCHW) shape = {3, o.height, o.width};
  py::array out(ImageNumpyDType(o.dtype), shape);
  const std::string_view data = jpeg;
  Status st;
  {
    py::gil_scoped_release release;
    thread_local DecodeScratch scratch;
    st = DecodeSample(
        o, {reinterpret_cast<const std::byte*>(data.data()), data.size()}, {seed, epoch, sample_id},
        {static_cast<std::byte*>(out.mutable_data()), size_t(out.nbytes())}, &scratch);
  }
  Check(st);
  return out;
}

// decode.h's Parse* and *Name: the one set of spellings, shared with the CLI.
template <typename E>
void BindNames(py::module_& m, const char* parse, Result<E> (*parser)(std::string_view),
               const char* name, std::string_view (*namer)(E)) {
  m.def(
      parse, [parser](const std::string& s) { return Unwrap(parser(s)); }, py::arg("name"));
  m.def(
      name, [namer](E v) { return std::string(namer(v)); }, py::arg("value"));
}

void BindDecode(py::module_& m) {
  py::enum_<CropMode>(m, "CropMode")
      .value("RESIZE", CropMode::kResize)
      .value("CENTER", CropMode::kCenter)
      .value("RANDOM_RESIZED", CropMode::kRandomResized);
  py::enum_<ImageDType>(m, "ImageDType")
      .value("UINT8", ImageDType::kUInt8)
      .value("FLOAT32", ImageDType::kFloat32)
      .value("FLOAT16", ImageDType::kFloat16)
      .value("BFLOAT16", ImageDType::kBFloat16);
  py::enum_<ImageLayout>(m, "ImageLayout")
      .value("NHWC", ImageLayout::kNHWC)
      .value("NCHW", ImageLayout::kNCHW);
  BindNames(m, "parse_crop_mode", ParseCropMode, "crop_mode_name", CropModeName);
  BindNames(m, "parse_image_dtype", ParseImageDType, "image_dtype_name", ImageDTypeName);
  BindNames(m, "parse_image_layout", ParseImageLayout, "image_layout_name", ImageLayoutName);
  py::class_<DecodeOptions> c(m, "_DecodeOptions");
  c.def(py::init<>())
      .def_readwrite("field", &DecodeOptions::field)
      .def_readwrite("height", &DecodeOptions::height)
      .def_readwrite("width", &DecodeOptions::width)
      .def_readwrite("scale_min", &DecodeOptions::scale_min)
      .def_readwrite("scale_max", &DecodeOptions::scale_max)
      .def_readwrite("ratio_min", &DecodeOptions::ratio_min)
      .def_readwrite("ratio_max", &DecodeOptions::ratio_max)
      .def_readwrite("resize_shorter", &DecodeOptions::resize_shorter)
      .def_readwrite("flip", &DecodeOptions::flip)
      .def_readwrite("normalize", &DecodeOptions::normalize)
      .def_readwrite("skip_corrupt", &DecodeOptions::skip_corrupt)
      .def_readwrite("device", &DecodeOptions::device)
      .def_readwrite("cpu_share", &DecodeOptions::cpu_share)
      .def_readwrite("cpu_share_balance", &DecodeOptions::cpu_share_balance)
      .def_readwrite("worker_nice", &DecodeOptions::worker_nice)
      .def_readwrite("crop", &DecodeOptions::crop)
      .def_readwrite("dtype", &DecodeOptions::dtype)
      .def_readwrite("layout", &DecodeOptions::layout)
      .def("validate", [](const DecodeOptions& o) { Check(ValidateDecodeOptions(o)); });
  EnumProperty(c, "extent", &DecodeOptions::extent);  // for bench/augment_bench.py, as an int
  TripleProperty(c, "mean", &DecodeOptions::mean);
  TripleProperty(c, "std", &DecodeOptions::std);
  m.def("_decode_sample", &DecodeOne, py::arg("options"), py::arg("jpeg"), py::arg("seed") = 0,
        py::arg("epoch") = 0, py::arg("sample_id") = 0);
  m.def(
      "_sample_crop",
      [](const DecodeOptions& o, uint32_t image_h, uint32_t image_w, uint64_t seed, uint64_t epoch,
         uint64_t sample_id) {
        const SampleCrop c = SampleCropFor(o, image_h, image_w, {seed, epoch, sample_id});
        return py::make_tuple(c.top, c.left, c.height, c.width, c.flip);
      },
      py::arg("options"), py::arg("image_h"), py::arg("image_w"), py::arg("seed") = 0,
      py::arg("epoch") = 0, py::arg("sample_id") = 0,
      "(top, left, height, width, flip) of a sample's crop, in source pixels");
}

// ---- pack, inspect, verify --------------------------------------------------

py::dict PackDataset(const std::string& src, const std::string& dst, uint64_t shard_bytes,
                     uint32_t threads, std::optional<py::function> progress, bool shuffle,
                     uint64_t seed) {
  PackOptions o;
  o.shard_bytes = shard_bytes;
  o.threads = threads;
  o.shuffle = shuffle;
  o.shuffle_seed = seed;
  // The callback runs on pack's workers (serialised by pack). Its first
  // exception is raised once Pack returns; later calls are skipped.
  std::optional<py::error_already_set> callback_error;
  if (progress) {
    o.progress = [&](const PackProgress& p) {
      py::gil_scoped_acquire acquire;
      if (callback_error) return;
      try {
        py::dict d;
        d["files_done"] = p.files_done;
        d["files_total"] = p.files_total;
        d["bytes_done"] = p.bytes_done;
        d["bytes_total"] = p.bytes_total;
        d["shards_written"] = p.shards_written;
        (*progress)(d);
      } catch (py::error_already_set& e) {
        callback_error.emplace(std::move(e));
      }
    };
  }
  Result<format::Manifest> r = [&] {
    py::gil_scoped_release release;
    return Pack(src, dst, o);
  }();
  if (callback_error) throw std::move(*callback_error);
  return ManifestDict(dst, Unwrap(std::move(r)));
}

py::dict Inspect(const std::string& uri) {
  Result<format::Manifest> r = [&]() -> Result<format::Manifest> {
    py::gil_scoped_release release;
    STOKER_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(uri));
    return ReadManifest(*store);
  }();
  return ManifestDict(uri, Unwrap(std::move(r)));
}

py::dict Verify(const std::string& uri, uint32_t reads_in_flight) {
  Result<VerifyReport> r = [&]() -> Result<VerifyReport> {
    py::gil_scoped_release release;
    STOKER_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(uri));
    VerifyOptions o;
    o.reads_in_flight = reads_in_flight;
    return VerifyDataset(*store, o);
  }();
  const VerifyReport report = Unwrap(std::move(r));
  py::list problems;
  for (const auto& p : report.problems) {
    py::dict d;
    d["shard"] = p.shard_key;
    d["sample"] = p.sample >= 0 ? py::object(py::int_(p.sample)) : py::object(py::none());
    d["code"] = std::string(CodeName(p.status.code()));
    d["message"] = p.status.message();
    problems.append(d);
  }
  py::dict d;
  d["uri"] = uri;
  d["ok"] = report.ok();
  d["shards_checked"] = report.shards_checked;
  d["samples_checked"] = report.samples_checked;
  d["bytes_read"] = report.bytes_read;
  d["problems"] = problems;
  return d;
}

// ---- a typed dataset for tests ---------------------------------------------

// Writes a dataset of `fields` ((name, type) as `stoker pack` users write
// types: "float32", "str", "uint32[*]", ...) holding `records` (a list of
// value lists: int for int64, float for float32/float64, bytes or str for
// the rest, an array's elements as bytes) in shards of about `shard_bytes`,
// with ShardBuilder, EncodeShardTable and EncodeManifest. For the tests of
// the loader's collation (tests/python/test_typed_fields.py), which need a
// format-3 dataset without the writer (stoker/writer.h).
py::dict WriteTestDataset(const std::string& uri,
                          const std::vector<std::pair<std::string, std::string>>& schema,
                          const py::list& records, uint64_t shard_bytes) {
  format::Manifest m;
  for (const auto& [name, type] : schema) {
    m.fields.push_back(Unwrap(format::ParseFieldSpec(name, type)));
  }
  Check(format::CheckSchema(m.fields));
  m.format_version = format::FormatVersionFor(m.fields);
  for (size_t b = 0; b < m.dataset_id.size(); ++b) m.dataset_id[b] = uint8_t(b + 1);
  m.created_by = "stoker tests";
  std::shared_ptr<Store> store = Unwrap(OpenStore(uri));
  auto builder = std::make_unique<format::ShardBuilder>(m.fields, m.dataset_id, 0);
  auto finish = [&] {
    const auto number = uint32_t(m.shards.size());
    format::ShardInfo info;
    info.key = format::ShardKey(number);
    info.samples = builder->sample_count();
    m.sample_count += info.samples;
    m.payload_bytes += builder->payload_bytes();
    m.max_sample_bytes = std::max(m.max_sample_bytes, builder->max_sample_bytes());
    const std::vector<std::byte> shard = builder->Finish(&info.index_hash);
    info.bytes = shard.size();
    Check(store->Put(info.key, shard));
    m.shards.push_back(info);
    builder = std::make_unique<format::ShardBuilder>(m.fields, m.dataset_id, number + 1);
  };
  for (const py::handle record : records) {
    const auto values = record.cast<std::vector<py::object>>();
    std::vector<std::string> bytes(values.size());
    std::vector<format::FieldValue> v(values.size());
    for (size_t f = 0; f < values.size() && f < m.fields.size(); ++f) {
      const format::FieldType t = m.fields[f].type;
      if (t == format::FieldType::kInt64) {
        v[f].i64 = values[f].cast<int64_t>();
      } else if (t == format::FieldType::kFloat32 || t == format::FieldType::kFloat64) {
        v[f].f64 = values[f].cast<double>();
      } else {
        bytes[f] = values[f].cast<std::string>();  // str as UTF-8
        v[f].bytes = {reinterpret_cast<const std::byte*>(bytes[f].data()), bytes[f].size()};
      }
    }
    if (builder->sample_count() > 0 && builder->SizeWith(v) > shard_bytes) finish();
    Check(builder->Add(v));
  }
  if (builder->sample_count() > 0) finish();
  const std::vector<std::byte> table = format::EncodeShardTable(m, &m.table);
  Check(store->Put(format::kShardTableKey, table));
  const std::string manifest = format::EncodeManifest(m);
  Check(store->Put(format::kManifestKey,
                   {reinterpret_cast<const std::byte*>(manifest.data()), manifest.size()}));
  return ManifestDict(uri, m);
}

}  // namespace

void BindLoader(py::module_& m) {
  BindDecode(m);
  // LoaderOptions is bound with the other options (stoker_ext.cc); the
  // collation's own option is added here, next to the batches it shapes.
  auto options = py::reinterpret_borrow<py::class_<LoaderOptions>>(m.attr("_LoaderOptions"));
  options.def_readwrite("ragged", &LoaderOptions::ragged);

  py::class_<LoaderHandle>(m, "_Loader")
      .def(py::init<const std::string&, const LoaderOptions&>(), py::arg("uri"),
           py::arg("options"))
      .def("next", &LoaderHandle::Next)
      .def("set_output", &LoaderHandle::SetOutput, py::arg("array"), py::arg("bytes_column"),
           py::arg("signed_ids"), py::arg("from_dlpack") = py::none(),
           py::arg("widen_unsigned") = false)
      .def("start_epoch", &LoaderHandle::StartEpoch, py::arg("epoch"), py::arg("position"))
      .def("prefetch", &LoaderHandle::Prefetch, py::arg("epoch"))
      .def("num_batches", &LoaderHandle::NumBatches)
      .def("epoch_positions", &LoaderHandle::EpochPositions)
      .def("batches_from", &LoaderHandle::BatchesFrom, py::arg("epoch"), py::arg("position"))
      .def("state", &LoaderHandle::State)
      .def("identified_state", &LoaderHandle::Identified, py::arg("epoch"), py::arg("position"))
      .def("check_resume", &LoaderHandle::CheckResume, py::arg("state"))
      .def("stats", &LoaderHandle::Stats)
      .def("close", &LoaderHandle::Close)
      .def("abandon", &LoaderHandle::Abandon)
      .def_property_readonly("info", &LoaderHandle::info)
      .def_property_readonly("read_unit", &LoaderHandle::read_unit)
      .def_property_readonly("last_buffer", &LoaderHandle::last_buffer,
                             "(address, size) of the buffer of the last batch (for tests)");

  m.def("pack", &PackDataset, py::arg("src"), py::arg("dst"), py::arg("shard_bytes"),
        py::arg("threads"), py::arg("progress") = py::none(), py::arg("shuffle") = true,
        py::arg("seed") = 0);
  m.def("inspect", &Inspect, py::arg("uri"));
  m.def("_write_test_dataset", &WriteTestDataset, py::arg("uri"), py::arg("fields"),
        py::arg("records"), py::arg("shard_bytes") = 4096);
  m.def("verify", &Verify, py::arg("uri"), py::arg("reads_in_flight"));
}

}  // namespace stoker::python
