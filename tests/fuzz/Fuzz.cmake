# vrdma_add_fuzzer(name SOURCES ... LIBS ...)
# The source defines LLVMFuzzerTestOneInput. With VRDMA_FUZZ (clang) it is a libFuzzer binary
# run for a bounded time by ctest (label "fuzz"); otherwise it links a small deterministic driver
# (tests/fuzz/driver.cpp) that replays the seed corpus plus bounded pseudo-random inputs, so the
# gcc and ASan builds keep every fuzz target compiling and regression-tested.
set(VRDMA_FUZZ_SECONDS 20 CACHE STRING "libFuzzer run time per target in CI")
# `cmake --build DIR --target fuzzers` builds every fuzz target and nothing else.
if(NOT TARGET fuzzers)
  add_custom_target(fuzzers)
endif()
function(vrdma_add_fuzzer name)
  cmake_parse_arguments(F "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${F_SOURCES})
  add_dependencies(fuzzers ${name})
  target_link_libraries(${name} PRIVATE ${F_LIBS})
  set(corpus ${CMAKE_CURRENT_SOURCE_DIR}/corpus/${name})
  if(VRDMA_FUZZ)
    target_compile_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined)
    file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/corpus-${name})
    set(dirs ${CMAKE_CURRENT_BINARY_DIR}/corpus-${name})
    if(EXISTS ${corpus})
      list(APPEND dirs ${corpus})
    endif()
    add_test(NAME fuzz_${name}
             COMMAND ${name} -max_total_time=${VRDMA_FUZZ_SECONDS} -timeout=10 -rss_limit_mb=2048 ${dirs})
    set_tests_properties(fuzz_${name} PROPERTIES LABELS fuzz TIMEOUT 300)
  else()
    target_sources(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/fuzz/driver.cpp)
    add_test(NAME fuzzdriver_${name} COMMAND ${name} ${corpus})
    set_tests_properties(fuzzdriver_${name} PROPERTIES LABELS unit TIMEOUT 300)
  endif()
endfunction()
