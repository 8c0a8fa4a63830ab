#include "core/thread_boundary.h"

#include <exception>
#include <new>
#include <string>

namespace stoker::internal {

Status CurrentExceptionStatus(std::string_view part) {
  const std::string where(part);
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return NoSpace(where + ": out of memory (std::bad_alloc)");
  } catch (const std::exception& e) {
    return Internal(where + ": unexpected exception: " + e.what());
  } catch (...) {
    return Internal(where + ": unexpected exception of an unknown type");
  }
}

}  // namespace stoker::internal
