# ctest registry.layering (issue 30): which directory's code may include
# which, and which libraries a target may link (transitively). Run by ctest:
#   cmake -DROOT=<source dir> -DLINKS=<target=lib,lib;...> -P check_layering.cmake
# The implementations (reference/, simd/, blas_path/) stay independent; core/
# and include/ are the interface and know none of them; only registry/ knows
# all three; validation/ knows the reference only; cli/ links no test code.
set(ours "reference|simd|blas_path|registry|validation|mutants|property_tests|cli")
# dir (library code only: tests/ and tools/ below it are not checked) ->
# directories its #include "dir/..." may not name.
set(rules
  "include:${ours}"
  "core:${ours}"
  "reference:simd|blas_path|registry|validation|mutants|property_tests|cli"
  "simd:reference|blas_path|registry|validation|mutants|property_tests|cli"
  "blas_path:reference|simd|registry|validation|mutants|property_tests|cli"
  "registry:validation|mutants|property_tests|cli"
  "mutants:simd|blas_path|registry|validation|property_tests|cli"
  "validation:simd|blas_path|registry|mutants|property_tests|cli"
  "cli:simd|blas_path|property_tests")
set(bad "")
foreach(rule IN LISTS rules)
  string(REPLACE ":" ";" rule "${rule}")
  list(GET rule 0 dir)
  list(GET rule 1 forbidden)
  file(GLOB_RECURSE files ${ROOT}/${dir}/*.h ${ROOT}/${dir}/*.cc)
  foreach(f IN LISTS files)
    file(RELATIVE_PATH rel ${ROOT} ${f})
    if(rel MATCHES "^[^/]+/(tests|tools)/")
      continue()
    endif()
    file(STRINGS ${f} hits REGEX "^#include \"(${forbidden})/")
    foreach(h IN LISTS hits)
      string(APPEND bad "  ${rel}: ${h}\n")
    endforeach()
  endforeach()
endforeach()
# LINKS: "target=forbidden|forbidden" pairs, with the target's transitive
# qknorm_* link closure computed at configure time (CMakeLists.txt).
foreach(entry IN LISTS LINKS)
  string(REGEX MATCH "^([^=]+)=([^:]*):(.*)$" _ "${entry}")
  set(target ${CMAKE_MATCH_1})
  set(closure ${CMAKE_MATCH_2})
  set(forbidden ${CMAKE_MATCH_3})
  string(REPLACE "," ";" closure "${closure}")
  foreach(lib IN LISTS closure)
    if(lib MATCHES "^(${forbidden})$")
      string(APPEND bad "  ${target} links ${lib}\n")
    endif()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "layering broken:\n${bad}")
endif()
message(STATUS "layering: ok")
