// The version string, compiled into every module so each links on its own.
namespace stoker {
const char* VersionString();
}
