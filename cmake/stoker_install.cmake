# Install rules: the command, one combined library (shared libstoker.so.0 and
# static libstoker.a), the public headers, a CMake package, a pkg-config
# file, and the Debian packages CPack makes from them.
#
# The build keeps one static library per module (a folder is a module, see
# stoker_module() in the top-level CMakeLists.txt); users get one library made
# of every module's objects. stoker_module() records each module in the
# global property STOKER_MODULES, and the combined libraries are defined once
# the top-level CMakeLists.txt has been read (cmake_language(DEFER)), so a
# module added anywhere in that file is installed without touching this one.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Soname: libstoker.so.0 until the first ABI-stable release.
set(STOKER_SOVERSION 0)
# Debian's /usr/bin/python3 looks in /usr/lib/python3/dist-packages (not in
# the site-packages of a self-built Python), so the package goes to that
# place under whatever prefix is used.
set(STOKER_INSTALL_PYTHONDIR "lib/python3/dist-packages" CACHE STRING
    "Where the Python package is installed, relative to the prefix")

# The optional parts, as the CMake package's components and in
# `stoker --version`.
set(STOKER_BUILT_COMPONENTS)
foreach(part rados io_uring turbojpeg mpi cuda python)
  string(TOUPPER ${part} upper)
  if(STOKER_WITH_${upper})
    list(APPEND STOKER_BUILT_COMPONENTS ${part})
  endif()
endforeach()

# _stoker_external_links(OUT modules...): what the modules link outside
# stoker, flattened to library paths and linker flags in link order, for the
# static library's users (CMake package and pkg-config's Libs.private).
# Imported targets are resolved to their files, since the targets that
# find_package/pkg_check_modules made here do not exist in the user's build.
function(_stoker_external_links out)
  set(modules ${ARGN})
  set(queue)
  foreach(m ${modules})
    get_target_property(deps ${m} INTERFACE_LINK_LIBRARIES)
    if(deps)
      list(APPEND queue ${deps})
    endif()
  endforeach()
  set(result)
  set(seen)
  while(queue)
    list(POP_FRONT queue item)
    if(item MATCHES "^\\$<LINK_ONLY:(.*)>$")
      set(item "${CMAKE_MATCH_1}")
    endif()
    if(item IN_LIST seen OR item IN_LIST modules OR item STREQUAL "")
      continue()
    endif()
    list(APPEND seen "${item}")
    if(item MATCHES "^\\$<")
      message(WARNING "stoker install: link item ${item} is not resolved for the static library")
      continue()
    endif()
    if(item STREQUAL "Threads::Threads")
      # Found again by the package's config (find_dependency(Threads)).
      list(APPEND result Threads::Threads)
      continue()
    endif()
    if(TARGET ${item})
      get_target_property(aliased ${item} ALIASED_TARGET)
      if(aliased)
        set(item ${aliased})
      endif()
      get_target_property(type ${item} TYPE)
      get_target_property(imported ${item} IMPORTED)
      if(imported AND NOT type STREQUAL "INTERFACE_LIBRARY")
        get_target_property(loc ${item} IMPORTED_LOCATION)
        if(NOT loc)
          get_target_property(configs ${item} IMPORTED_CONFIGURATIONS)
          foreach(c ${configs})
            get_target_property(loc ${item} IMPORTED_LOCATION_${c})
            if(loc)
              break()
            endif()
          endforeach()
        endif()
        if(loc)
          list(APPEND result "${loc}")
        endif()
      endif()
      get_target_property(deps ${item} INTERFACE_LINK_LIBRARIES)
      if(deps)
        list(APPEND queue ${deps})
      endif()
    elseif(IS_ABSOLUTE "${item}" OR item MATCHES "^-")
      list(APPEND result "${item}")
    else()
      list(APPEND result "-l${item}")
    endif()
  endwhile()
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# The deferred part: runs after the whole top-level CMakeLists.txt.
function(_stoker_define_install)
  get_property(modules GLOBAL PROPERTY STOKER_MODULES)
  set(objects)
  foreach(m ${modules})
    list(APPEND objects $<TARGET_OBJECTS:${m}>)
  endforeach()

  # The shared library: every module's objects; the modules themselves are
  # linked only for what they link outside stoker (their archives add
  # nothing, every symbol being defined by the objects already).
  add_library(stoker_shared SHARED ${objects})
  target_link_libraries(stoker_shared PRIVATE ${modules})
  set_target_properties(stoker_shared PROPERTIES OUTPUT_NAME stoker EXPORT_NAME stoker
    VERSION ${PROJECT_VERSION} SOVERSION ${STOKER_SOVERSION})
  add_library(stoker_static STATIC ${objects})
  set_target_properties(stoker_static PROPERTIES OUTPUT_NAME stoker EXPORT_NAME stoker_static)
  _stoker_external_links(external ${modules})
  target_link_libraries(stoker_static INTERFACE ${external})
  foreach(t stoker_shared stoker_static)
    target_include_directories(${t} INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
      $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
    target_compile_features(${t} INTERFACE cxx_std_20)
  endforeach()
  add_library(stoker::stoker ALIAS stoker_shared)
  add_library(stoker::stoker_static ALIAS stoker_static)

  install(TARGETS stoker_shared stoker_static EXPORT stokerTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT lib NAMELINK_COMPONENT dev
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
  install(EXPORT stokerTargets NAMESPACE stoker:: COMPONENT dev
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/stoker)

  # pkg-config: Libs.private carries what the static library needs; no
  # Requires.private, since pkg-config insists that those modules exist even
  # for a shared link, which would make every -dev package a dependency.
  set(libs_private)
  foreach(item ${external})
    if(item STREQUAL "Threads::Threads")
      list(APPEND libs_private -pthread)
    elseif(item MATCHES "^/(usr/)?lib[^/]*/(.*/)?lib([^/]+)\\.(so(\\.[0-9.]+)?|a)$")
      # A system library: by name, so that the linker picks what is there.
      list(APPEND libs_private "-l${CMAKE_MATCH_3}")
    else()
      list(APPEND libs_private "${item}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES libs_private)
  list(JOIN libs_private " " STOKER_PC_LIBS_PRIVATE)
  # Relative to the .pc file, so that `cmake --install --prefix` and CPack's
  # staging both give a file that points at where it lies.
  file(RELATIVE_PATH pc_up "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
  set(STOKER_PC_PREFIX "\${pcfiledir}/${pc_up}")
  string(REGEX REPLACE "/$" "" STOKER_PC_PREFIX "${STOKER_PC_PREFIX}")
  configure_file(${PROJECT_SOURCE_DIR}/cmake/stoker.pc.in ${PROJECT_BINARY_DIR}/stoker.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/stoker.pc COMPONENT dev
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endfunction()

# ---- what does not wait for the modules ------------------------------------
install(TARGETS stoker RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/stoker DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT dev FILES_MATCHING PATTERN "*.h")

# Bash completion, written by the command itself (`stoker completion bash`)
# so that it follows the subcommands and options.
add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/completion/stoker
  COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/completion
  COMMAND stoker completion bash > ${PROJECT_BINARY_DIR}/completion/stoker
  DEPENDS stoker COMMENT "bash completion for stoker" VERBATIM)
add_custom_target(stoker_completion ALL DEPENDS ${PROJECT_BINARY_DIR}/completion/stoker)
install(FILES ${PROJECT_BINARY_DIR}/completion/stoker COMPONENT cli
  DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions)

# `stoker --version`: the options now, the git revision at each build.
list(JOIN STOKER_BUILT_COMPONENTS " " STOKER_BUILD_OPTIONS)
if(NOT STOKER_BUILD_OPTIONS)
  set(STOKER_BUILD_OPTIONS "none")
endif()
add_custom_target(stoker_git_revision
  COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
    -DOUTPUT=${PROJECT_BINARY_DIR}/generated/stoker_git_revision.h
    -P ${PROJECT_SOURCE_DIR}/cmake/git_revision.cmake
  BYPRODUCTS ${PROJECT_BINARY_DIR}/generated/stoker_git_revision.h VERBATIM)
add_dependencies(stoker stoker_git_revision)
target_include_directories(stoker PRIVATE ${PROJECT_BINARY_DIR}/generated)
target_compile_definitions(stoker PRIVATE STOKER_BUILD_OPTIONS="${STOKER_BUILD_OPTIONS}")

# The CMake package; its components are written space-separated.
list(JOIN STOKER_BUILT_COMPONENTS " " STOKER_CONFIG_COMPONENTS)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/stokerConfig.cmake.in
  ${PROJECT_BINARY_DIR}/stokerConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/stoker)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/stokerConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/stokerConfig.cmake
  ${PROJECT_BINARY_DIR}/stokerConfigVersion.cmake COMPONENT dev
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/stoker)

cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL _stoker_define_install)

include(${PROJECT_SOURCE_DIR}/cmake/stoker_cpack.cmake)
