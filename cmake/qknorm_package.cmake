# The installable package (issue 17): `cmake --install <build> --prefix P`
# installs the public headers, the internal headers the public targets'
# headers include, the static libraries, qknorm-check, qknorm_property_test
# and a CMake package config, so that an outside project writes
#   find_package(qknorm CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE qknorm::conformance)
# (examples/find_package_consumer/). Included at the end of the top-level
# CMakeLists.txt, once every target exists.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(QKNORM_PACKAGE_VERSION 0.17.0)
set(QKNORM_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/qknorm)
# Internal headers (validation/, reference/, mutants/, property_tests/) keep their
# relative include paths under this directory (core/CMakeLists.txt adds it
# to qknorm::core's installed include path).
set(QKNORM_INTERNAL_INCLUDE_DIR ${CMAKE_INSTALL_INCLUDEDIR}/qknorm/internal)

# Libraries: in-tree name -> package name (qknorm::<name>; the same alias
# exists in the tree, so both spell qknorm::core). Every static library the
# public three (core, validation, conformance) link, publicly or privately,
# is exported too: a static library's private dependencies are linked by
# its users.
set(QKNORM_PACKAGE_LIBRARIES
  qknorm_core:core
  qknorm_reference:reference
  qknorm_simd:simd
  qknorm_blas:blas
  qknorm_all:all
  qknorm_validation:validation
  qknorm_mutants:mutants
  qknorm_property_support:property_support
  qknorm_conformance:conformance)
set(QKNORM_PACKAGE_TARGETS)
foreach(pair IN LISTS QKNORM_PACKAGE_LIBRARIES)
  string(REPLACE ":" ";" pair "${pair}")
  list(GET pair 0 target)
  list(GET pair 1 export_name)
  if(TARGET ${target})
    add_library(qknorm::${export_name} ALIAS ${target})
    set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
    list(APPEND QKNORM_PACKAGE_TARGETS ${target})
  endif()
endforeach()
# Executables: qknorm::qknorm-check and qknorm::qknorm_property_test.
foreach(target qknorm-check qknorm_property_test)
  if(TARGET ${target})
    list(APPEND QKNORM_PACKAGE_TARGETS ${target})
  endif()
endforeach()

install(TARGETS ${QKNORM_PACKAGE_TARGETS}
  EXPORT qknormTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT qknormTargets
  NAMESPACE qknorm::
  DESTINATION ${QKNORM_CMAKE_INSTALL_DIR})

# Headers: include/qknorm/*.h as they are; the internal ones below
# include/qknorm/internal/<dir>/.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/qknorm
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
foreach(dir validation reference mutants property_tests)
  file(GLOB headers CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${dir}/*.h)
  install(FILES ${headers} DESTINATION ${QKNORM_INTERNAL_INCLUDE_DIR}/${dir})
endforeach()

# What qknormConfig.cmake finds before it imports the targets.
set(QKNORM_PACKAGE_WITH_SIMD OFF)
if(TARGET qknorm_simd)
  set(QKNORM_PACKAGE_WITH_SIMD ON)
endif()
set(QKNORM_PACKAGE_WITH_BLAS OFF)
if(TARGET qknorm_blas)
  set(QKNORM_PACKAGE_WITH_BLAS ON)
endif()
configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/qknormConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/qknormConfig.cmake
  INSTALL_DESTINATION ${QKNORM_CMAKE_INSTALL_DIR})
write_basic_package_version_file(
  ${CMAKE_CURRENT_BINARY_DIR}/qknormConfigVersion.cmake
  VERSION ${QKNORM_PACKAGE_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/qknormConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/qknormConfigVersion.cmake
  DESTINATION ${QKNORM_CMAKE_INSTALL_DIR})

# ctest: install this build into <build>/pkg-prefix, then configure, build
# and run examples/find_package_consumer against that prefix alone (label
# package; about a minute on 2 cores). Not in sanitizer or fuzzer builds,
# whose libraries need their instrumentation at the consumer's link.
if(NOT QKNORM_SANITIZE AND NOT QKNORM_BUILD_FUZZ AND TARGET qknorm_conformance)
  add_test(NAME package.find_package_consumer
    COMMAND ${CMAKE_COMMAND}
      -DQKNORM_SOURCE_DIR=${PROJECT_SOURCE_DIR}
      -DQKNORM_BUILD_DIR=${PROJECT_BINARY_DIR}
      -DPREFIX=${PROJECT_BINARY_DIR}/pkg-prefix
      -DCONSUMER_BUILD_DIR=${PROJECT_BINARY_DIR}/pkg-consumer
      -DGENERATOR=${CMAKE_GENERATOR}
      -DCXX=${CMAKE_CXX_COMPILER}
      -DINCLUDEDIR=${CMAKE_INSTALL_INCLUDEDIR}
      -DLIBDIR=${CMAKE_INSTALL_LIBDIR}
      -DBINDIR=${CMAKE_INSTALL_BINDIR}
      -P ${CMAKE_CURRENT_LIST_DIR}/test_find_package_consumer.cmake)
  set_tests_properties(package.find_package_consumer PROPERTIES
    LABELS package TIMEOUT 900)
endif()
