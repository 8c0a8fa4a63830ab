// Built without MPI: kAuto always coordinates through the store, and kMpi
// says why it cannot.
#include "ckpt/coordinator.h"

namespace stoker::ckpt {

namespace {
Status NoMpi() { return Unsupported("this stoker was built without MPI (-DSTOKER_WITH_MPI=ON)"); }
}  // namespace

bool MpiUsable(uint32_t, uint32_t, bool, std::string* why) {
  *why = "this stoker was built without MPI (-DSTOKER_WITH_MPI=ON)";
  return false;
}
Status MpiSendPart(const MpiSaveId&, const Status&, const std::string&) { return NoMpi(); }
Status MpiGatherParts(const MpiSaveId&, uint32_t, Deadline, std::vector<std::string>*) {
  return NoMpi();
}
Status MpiSendOutcome(const MpiSaveId&, uint32_t, const Status&) { return NoMpi(); }
Status MpiReceiveOutcome(const MpiSaveId&, Deadline) { return NoMpi(); }

}  // namespace stoker::ckpt
