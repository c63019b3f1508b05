# Man pages of the operator tools, made from their own --help at build time (man_page.sh,
# help2man: Debian's help2man package), and bash completion (completion/vrdma.bash). Included
# by the top-level CMakeLists.txt after every module, so that the tools are targets here.
include(GNUInstallDirs)
find_program(HELP2MAN help2man)
set(VRDMA_MAN_PAGES "")
if(HELP2MAN)
  # name, section, summary
  set(pages
      "vrdmad|8|the virtio RDMA device backend, one process per guest device"
      "vrdmactl|8|manage vrdma's virtio RDMA device for libvirt guests"
      "vrdma-perf|1|RDMA bandwidth and latency over any vrdma engine"
      "pvverbs-bind|8|give the virtio RDMA device's PCI function to libpvverbs inside a guest|guest")
  foreach(p IN LISTS pages)
    string(REPLACE "|" ";" f "${p}")
    list(GET f 0 tool)
    list(GET f 1 section)
    list(GET f 2 summary)
    set(component integration)  # the host's tools; the guest's go with them (component guest)
    list(LENGTH f n)
    if(n GREATER 3)
      list(GET f 3 component)
    endif()
    set(out ${CMAKE_BINARY_DIR}/man/${tool}.${section})
    add_custom_command(OUTPUT ${out}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
      COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=0
              sh ${CMAKE_CURRENT_LIST_DIR}/man_page.sh $<TARGET_FILE:${tool}> ${tool} "${summary}" ${out}
      DEPENDS ${tool} ${CMAKE_CURRENT_LIST_DIR}/man_page.sh
      COMMENT "Man page ${tool}(${section}) from ${tool} --help"
      VERBATIM)
    list(APPEND VRDMA_MAN_PAGES ${out})
    install(FILES ${out} DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section} COMPONENT ${component})
  endforeach()
  add_custom_target(man-pages ALL DEPENDS ${VRDMA_MAN_PAGES})
  if(TARGET host-deb)
    add_dependencies(host-deb man-pages)  # the package carries them
  endif()
else()
  message(STATUS "help2man not found: no man pages (scripts/setup.sh installs it)")
endif()
foreach(tool vrdmactl vrdmad vrdma-perf pvverbs-bind)
  set(component integration)
  if(tool STREQUAL "pvverbs-bind")
    set(component guest)
  endif()
  install(FILES ${CMAKE_CURRENT_LIST_DIR}/../completion/vrdma.bash DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
          RENAME ${tool} COMPONENT ${component})
endforeach()
