// _stoker._testing: hooks for the Python tests, built into test builds only
// (STOKER_BUILD_TESTS; python/CMakeLists.txt). A StoreGate holds the first
// metadata call a checkpointer makes into its store after gate.arm() (Stat,
// List or ReadAll: a save's first, §1.1 step 1's check of the name; a load's
// read of the manifest) until the test calls gate.release(), so a test can
// hold a save or a load inside C++ for as long as it needs, without a clock
// (tests/python/test_gil.py). A gate no one releases lets the call through
// after its deadman (a bound on a hang, not a speed) and says so (gave_up).
//
// Thread safety: a StoreGate is used from any threads; the store calls wait
// on it, the test's thread arms, waits for and releases it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "binding.h"
#include "stoker/checkpoint.h"
#include "stoker/store.h"

namespace stoker::python {
namespace {

class StoreGate {
 public:
  explicit StoreGate(double deadman_s) : deadman_(deadman_s) {}

  // The next gated call waits in Pass until Release (or the deadman).
  void Arm() {
    std::lock_guard lock(mu_);
    armed_ = true;
    released_ = false;
  }

  // Until a call waits in the gate, at most timeout_s: whether one does, and
  // which ("Stat KEY").
  std::pair<bool, std::string> WaitHeld(double timeout_s) {
    std::unique_lock lock(mu_);
    const bool held =
        cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return holding_; });
    return {held, held_what_};
  }

  void Release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

  bool gave_up() {
    std::lock_guard lock(mu_);
    return gave_up_;
  }

  // Called by the store before a gated call: waits there if armed.
  void Pass(std::string what) {
    std::unique_lock lock(mu_);
    if (!armed_) return;
    armed_ = false;
    holding_ = true;
    held_what_ = std::move(what);
    cv_.notify_all();
    if (!cv_.wait_for(lock, deadman_, [&] { return released_; })) gave_up_ = true;
    holding_ = false;
  }

 private:
  const std::chrono::duration<double> deadman_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false;
  bool released_ = false;
  bool holding_ = false;
  bool gave_up_ = false;
  std::string held_what_;
};

// The store behind a checkpointer, its metadata calls through the gate;
// everything else forwarded as it is.
class GatedStore final : public StoreWrapper {
 public:
  GatedStore(std::shared_ptr<Store> target, std::shared_ptr<StoreGate> gate)
      : StoreWrapper(std::move(target)), gate_(std::move(gate)) {}

  Result<ObjectInfo> Stat(std::string_view key) override {
    gate_->Pass("Stat " + std::string(key));
    return StoreWrapper::Stat(key);
  }
  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    gate_->Pass("List " + std::string(prefix));
    return StoreWrapper::List(prefix);
  }
  Result<std::vector<std::byte>> ReadAll(std::string_view key) override {
    gate_->Pass("ReadAll " + std::string(key));
    return StoreWrapper::ReadAll(key);
  }

 private:
  const std::shared_ptr<StoreGate> gate_;
};

}  // namespace

void BindTesting(py::module_& m) {
  py::module_ t = m.def_submodule("_testing", "hooks for stoker's tests (test builds only)");
  py::class_<StoreGate, std::shared_ptr<StoreGate>>(t, "StoreGate")
      .def(py::init<double>(), py::arg("deadman_s") = 60.0)
      .def("arm", &StoreGate::Arm, "the next gated store call waits for release()")
      .def("wait_held", &StoreGate::WaitHeld, py::arg("timeout_s"),
           py::call_guard<py::gil_scoped_release>(),
           "(held, what): whether a call waits in the gate within timeout_s, and which")
      .def("release", &StoreGate::Release)
      .def_property_readonly("gave_up", &StoreGate::gave_up,
                             "whether a held call went on by the deadman, not by release()");
  t.def(
      "gated_checkpointer",
      [](const std::string& uri, const CheckpointerOptions& options,
         std::shared_ptr<StoreGate> gate) {
        std::unique_ptr<Checkpointer> c;
        {
          py::gil_scoped_release release;
          auto store = OpenStore(uri, options.store);
          if (!store.ok()) Throw(store.status());
          c = NewCheckpointer(std::make_shared<GatedStore>(*store, gate), options);
        }
        return WrapCheckpointer(uri, std::move(c));
      },
      py::arg("uri"), py::arg("options"), py::arg("gate"),
      "A _Checkpointer of the root `uri` whose store's metadata calls pass `gate`.");
}

}  // namespace stoker::python
