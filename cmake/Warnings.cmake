# One warning policy for every target in the project.
add_compile_options(-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
                    -Wcast-align -Wnull-dereference -Wimplicit-fallthrough -Wformat=2
                    $<$<COMPILE_LANGUAGE:CXX>:-Wnon-virtual-dtor> $<$<COMPILE_LANGUAGE:CXX>:-Wold-style-cast>
                    # C (the device contract's test, the C API's): what C++ checks by itself.
                    $<$<COMPILE_LANGUAGE:C>:-Wstrict-prototypes> $<$<COMPILE_LANGUAGE:C>:-Wmissing-prototypes>)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  add_compile_options(-Wno-missing-field-initializers)
endif()
if(VRDMA_WERROR)
  add_compile_options(-Werror)
endif()
if(VRDMA_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
if(VRDMA_FUZZ)
  # Coverage instrumentation for all code the fuzzers reach (the fuzz targets add the driver).
  # UBSan findings stop the program, as in the ASan build: a report that only goes to a log is
  # not seen (a misaligned reference in the event loop sat in the fuzzers' logs for months).
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
