# Writes OUTPUT (a header defining STOKER_GIT_REVISION) from the git revision
# of SOURCE_DIR, "unknown" outside git; rewritten only when it changes, so a
# build without a new commit recompiles nothing.
set(revision "unknown")
find_program(GIT git)
if(GIT)
  execute_process(COMMAND ${GIT} -C ${SOURCE_DIR} rev-parse --short=12 HEAD
    OUTPUT_VARIABLE rev RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(rc EQUAL 0 AND rev)
    set(revision ${rev})
    execute_process(COMMAND ${GIT} -C ${SOURCE_DIR} status --porcelain --untracked-files=no
      OUTPUT_VARIABLE dirty RESULT_VARIABLE rc ERROR_QUIET)
    if(rc EQUAL 0 AND dirty)
      string(APPEND revision "-dirty")
    endif()
  endif()
endif()
set(text "#define STOKER_GIT_REVISION \"${revision}\"\n")
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUTPUT} "${text}")
endif()
