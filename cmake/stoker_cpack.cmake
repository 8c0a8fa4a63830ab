# Debian packages, one per install component (scripts/package.sh runs it):
#   stoker          the command and its bash completion
#   libstoker       libstoker.so.0
#   libstoker-dev   headers, libstoker.a, the .so link, CMake package, stoker.pc
#   python3-stoker  the Python package, in /usr/lib/python3/dist-packages
# Shared-library dependencies (librados2, liburing2, libturbojpeg0,
# libxxhash0, ...) come from dpkg-shlibdeps, so they follow the options the
# build was made with; what it cannot see (the interpreter, numpy) is listed.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME stoker)
set(CPACK_PACKAGE_VENDOR "stoker")
set(CPACK_PACKAGE_CONTACT "stoker maintainers <stoker@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "keeps GPUs fed: packed datasets, loader and checkpoints over local disk and Ceph")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL cli lib dev python)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS OFF)
# Executables and shared objects stripped (not libstoker.a: install/strip
# leaves static archives alone).
set(CPACK_STRIP_FILES ON)

set(CPACK_DEBIAN_CLI_PACKAGE_NAME stoker)
set(CPACK_DEBIAN_CLI_PACKAGE_SECTION utils)
set(CPACK_COMPONENT_CLI_DESCRIPTION "stoker command: pack, inspect, verify, bench, ckpt, demo\n The operator's command around stoker's data plane, with bash completion.")
set(CPACK_DEBIAN_LIB_PACKAGE_NAME libstoker)
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
set(CPACK_COMPONENT_LIB_DESCRIPTION "stoker shared library\n libstoker.so.0: packed datasets, the loader, checkpoints, stores.")
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libstoker-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEV_DESCRIPTION "stoker development files\n Headers, static library, CMake package (find_package(stoker)) and stoker.pc.")
set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-stoker)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3 (>= 3.9), python3-numpy")
set(CPACK_COMPONENT_PYTHON_DESCRIPTION "stoker for Python (import stoker)\n The binding and the PyTorch-facing package, for Debian's python3.")
# libstoker-dev pins libstoker of the same version: set when cpack runs, so
# a package made with `cpack -D CPACK_PACKAGE_VERSION=...` pins its own.
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_SOURCE_DIR}/cmake/stoker_cpack_project.cmake)
include(CPack)
