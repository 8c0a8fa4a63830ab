// nvJPEG through dlopen (gpu/nvjpeg_api.h). Builds with or without CUDA:
// nothing here calls the CUDA runtime.
#include <dlfcn.h>
#include <glob.h>
#include <sys/stat.h>

#include <cstdlib>
#include <mutex>

#include "gpu/nvjpeg_api.h"
#include "stoker/gpu.h"

namespace stoker::gpu::nvj {
namespace {

constexpr const char* kSonames[] = {"libnvjpeg.so.13", "libnvjpeg.so.12"};

bool IsDir(const std::string& p) {
  struct stat st{};
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool Exists(const std::string& p) {
  struct stat st{};
  return stat(p.c_str(), &st) == 0;
}

// Files matching `pattern` (glob), sorted by glob.
std::vector<std::string> Glob(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  return out;
}

template <typename F>
stoker::Status Bind(void* lib, const char* name, F* fn, const std::string& path) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr) {
    return Unsupported("nvJPEG at " + path + " lacks " + name +
                       " (too old: stoker needs the nvJPEG of CUDA " + std::to_string(kMinMajor) +
                       " or later)");
  }
  return stoker::Status::Ok();
}

stoker::Status BindAll(void* lib, Api* a) {
  const std::string& p = a->path;
  STOKER_RETURN_IF_ERROR(Bind(lib, "nvjpegGetProperty", &a->GetProperty, p));
  STOKER_RETURN_IF_ERROR(Bind(lib, "nvjpegCreateExV2", &a->CreateExV2, p));
  STOKER_RETURN_IF_ERROR(Bind(lib, "nvjpegDestroy", &a->Destroy, p));
  STOKER_RETURN_IF_ERROR(Bind(lib, "nvjpegGetHardwareDecoderInfo", &a->GetHardwareDecoderInfo, p));
  STOKER_RETURN_IF_ERROR(Bind(lib, "nvjpegJpegStateCreate", &a->JpegStateCreate, p));
  STOKER_RETURN_IF_ERROR(Bind(lib, "nvjpegJpegStateDestroy", &a->JpegStateDestroy, p));
  STOKER_RETURN_IF_ERROR(Bind(lib, "nvjpegDecode", &a->Decode, p));
  STOKER_RETURN_IF_ERROR(
      Bind(lib, "nvjpegDecodeBatchedInitialize", &a->DecodeBatchedInitialize, p));
  STOKER_RETURN_IF_ERROR(Bind(lib, "nvjpegDecodeBatchedEx", &a->DecodeBatchedEx, p));
  STOKER_RETURN_IF_ERROR(
      Bind(lib, "nvjpegDecodeBatchedSupportedEx", &a->DecodeBatchedSupportedEx, p));
  STOKER_RETURN_IF_ERROR(Bind(lib, "nvjpegJpegStreamCreate", &a->JpegStreamCreate, p));
  STOKER_RETURN_IF_ERROR(Bind(lib, "nvjpegJpegStreamDestroy", &a->JpegStreamDestroy, p));
  STOKER_RETURN_IF_ERROR(Bind(lib, "nvjpegJpegStreamParseHeader", &a->JpegStreamParseHeader, p));
  STOKER_RETURN_IF_ERROR(Bind(lib, "nvjpegDecodeParamsCreate", &a->DecodeParamsCreate, p));
  STOKER_RETURN_IF_ERROR(Bind(lib, "nvjpegDecodeParamsDestroy", &a->DecodeParamsDestroy, p));
  STOKER_RETURN_IF_ERROR(
      Bind(lib, "nvjpegDecodeParamsSetOutputFormat", &a->DecodeParamsSetOutputFormat, p));
  STOKER_RETURN_IF_ERROR(Bind(lib, "nvjpegDecodeParamsSetROI", &a->DecodeParamsSetROI, p));
  if (a->GetProperty(kMajorVersion, &a->major) != kSuccess ||
      a->GetProperty(kMinorVersion, &a->minor) != kSuccess ||
      a->GetProperty(kPatchLevel, &a->patch) != kSuccess) {
    return Unsupported("nvJPEG at " + p + ": nvjpegGetProperty failed");
  }
  if (a->major < kMinMajor) {
    return Unsupported("nvJPEG at " + p + " is version " + std::to_string(a->major) + "." +
                       std::to_string(a->minor) + "; stoker needs " + std::to_string(kMinMajor) +
                       " or later");
  }
  return stoker::Status::Ok();
}

Result<const Api*> Load() {
  std::string tried;
  for (const std::string& c : NvjpegCandidates()) {
    void* lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      // A path that does not exist is not worth a line; a soname always is.
      if (c.find('/') == std::string::npos || Exists(c)) {
        tried += (tried.empty() ? "" : ", ") + c;
        if (c.find('/') != std::string::npos && e != nullptr) tried += std::string(" (") + e + ")";
      }
      continue;
    }
    auto* api = new Api();  // never freed: the library stays loaded too
    api->path = c;
    stoker::Status st = BindAll(lib, api);
    if (!st.ok()) {
      delete api;
      dlclose(lib);
      return st;
    }
    return static_cast<const Api*>(api);
  }
  return Unsupported("no nvJPEG (tried " + tried +
                     "): the GPU decode needs libnvjpeg from CUDA 12 or 13 (the toolkit's "
                     "lib64, or pip's nvidia-nvjpeg wheel that torch installs); set "
                     "STOKER_NVJPEG_PATH to the file or its folder");
}

}  // namespace

const char* StatusName(int status) {
  switch (status) {
    case kSuccess:
      return "NVJPEG_STATUS_SUCCESS";
    case kNotInitialized:
      return "NVJPEG_STATUS_NOT_INITIALIZED";
    case kInvalidParameter:
      return "NVJPEG_STATUS_INVALID_PARAMETER";
    case kBadJpeg:
      return "NVJPEG_STATUS_BAD_JPEG";
    case kJpegNotSupported:
      return "NVJPEG_STATUS_JPEG_NOT_SUPPORTED";
    case kAllocatorFailure:
      return "NVJPEG_STATUS_ALLOCATOR_FAILURE";
    case kExecutionFailed:
      return "NVJPEG_STATUS_EXECUTION_FAILED";
    case kArchMismatch:
      return "NVJPEG_STATUS_ARCH_MISMATCH";
    case kInternalError:
      return "NVJPEG_STATUS_INTERNAL_ERROR";
    case kImplementationNotSupported:
      return "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED";
    case kIncompleteBitstream:
      return "NVJPEG_STATUS_INCOMPLETE_BITSTREAM";
  }
  return "NVJPEG_STATUS_UNKNOWN";
}

std::vector<std::string> NvjpegCandidates() {
  std::vector<std::string> out;
  const char* env = std::getenv("STOKER_NVJPEG_PATH");
  if (env != nullptr && *env != '\0') {
    const std::string p = env;
    if (IsDir(p)) {
      for (const char* s : kSonames) out.push_back(p + "/" + s);
      out.push_back(p + "/libnvjpeg.so");
    } else {
      out.push_back(p);
    }
  }
  for (const char* s : kSonames) out.emplace_back(s);
  std::vector<std::string> dirs;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') dirs.push_back(std::string(v) + "/lib64");
  }
  dirs.push_back("/usr/local/cuda/lib64");
  const char* venv = std::getenv("VIRTUAL_ENV");
  if (venv != nullptr && *venv != '\0') {
    for (const std::string& d : Glob(std::string(venv) + "/lib/python3*/site-packages/nvidia/*/lib")) {
      dirs.push_back(d);
    }
  }
  for (const std::string& d : dirs) {
    for (const char* s : kSonames) out.push_back(d + "/" + s);
  }
  return out;
}

Result<const Api*> LoadNvjpeg() {
  static std::once_flag once;
  static Result<const Api*>* result = nullptr;
  std::call_once(once, [] { result = new Result<const Api*>(Load()); });
  return *result;
}

stoker::Status NvjpegStatus(int device, const std::string& call, int status) {
  if (status == kSuccess) return stoker::Status::Ok();
  std::string msg = DeviceName(device) + ": " + call + ": " + StatusName(status);
  switch (status) {
    case kBadJpeg:
    case kIncompleteBitstream:
      return Corruption(std::move(msg));
    case kAllocatorFailure:
      return NoSpace(std::move(msg));
    case kJpegNotSupported:
    case kImplementationNotSupported:
    case kArchMismatch:
      return Unsupported(std::move(msg));
    case kInvalidParameter:
      return InvalidArgument(std::move(msg));
    default:
      return IoError(std::move(msg));
  }
}

}  // namespace stoker::gpu::nvj
