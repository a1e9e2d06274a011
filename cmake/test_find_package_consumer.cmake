# ctest package.find_package_consumer (cmake/qknorm_package.cmake), run as
#   cmake -DQKNORM_SOURCE_DIR=... -DQKNORM_BUILD_DIR=... -DPREFIX=...
#         -DCONSUMER_BUILD_DIR=... -DGENERATOR=... -DCXX=...
#         -DINCLUDEDIR=... -DLIBDIR=... -DBINDIR=... -P <this file>
# 1. installs the (fully built) build tree into a fresh PREFIX and checks the
#    installed files: headers, libraries, binaries, the package config, and
#    no path into the source or build tree in any installed CMake file;
# 2. runs the installed qknorm_property_test (its PropertyTable test);
# 3. configures examples/find_package_consumer with CMAKE_PREFIX_PATH=PREFIX
#    alone, builds it and runs its conformance binary: the test passes iff
#    every conformance test passes (and at least kMinPassed ran, so that a
#    suite registering nothing cannot pass).
cmake_minimum_required(VERSION 3.25)
set(kMinPassed 17)

foreach(v QKNORM_SOURCE_DIR QKNORM_BUILD_DIR PREFIX CONSUMER_BUILD_DIR
          GENERATOR CXX INCLUDEDIR LIBDIR BINDIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "${v} is not set")
  endif()
endforeach()

function(step name)
  string(TIMESTAMP now "%s")
  math(EXPR secs "${now} - ${QKNORM_T0}")
  message(STATUS "[${secs} s] ${name}")
endfunction()
string(TIMESTAMP QKNORM_T0 "%s")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmd)
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

step("install ${QKNORM_BUILD_DIR} into ${PREFIX}")
file(REMOVE_RECURSE ${PREFIX} ${CONSUMER_BUILD_DIR})
run(${CMAKE_COMMAND} --install ${QKNORM_BUILD_DIR} --prefix ${PREFIX})

# The layout the package installed (the project's GNUInstallDirs values).
set(CMAKE_INSTALL_INCLUDEDIR ${INCLUDEDIR})
set(CMAKE_INSTALL_LIBDIR ${LIBDIR})
set(CMAKE_INSTALL_BINDIR ${BINDIR})
set(cmake_dir ${PREFIX}/${CMAKE_INSTALL_LIBDIR}/cmake/qknorm)
foreach(f
    ${CMAKE_INSTALL_INCLUDEDIR}/qknorm/backend.h
    ${CMAKE_INSTALL_INCLUDEDIR}/qknorm/conformance.h
    ${CMAKE_INSTALL_INCLUDEDIR}/qknorm/internal/validation/check.h
    ${CMAKE_INSTALL_INCLUDEDIR}/qknorm/internal/property_tests/support.h
    ${CMAKE_INSTALL_INCLUDEDIR}/qknorm/internal/reference/reference.h
    ${CMAKE_INSTALL_LIBDIR}/libqknorm_core.a
    ${CMAKE_INSTALL_LIBDIR}/libqknorm_validation.a
    ${CMAKE_INSTALL_LIBDIR}/libqknorm_conformance.a
    ${CMAKE_INSTALL_BINDIR}/qknorm-check
    ${CMAKE_INSTALL_BINDIR}/qknorm_property_test
    ${CMAKE_INSTALL_LIBDIR}/cmake/qknorm/qknormConfig.cmake
    ${CMAKE_INSTALL_LIBDIR}/cmake/qknorm/qknormConfigVersion.cmake
    ${CMAKE_INSTALL_LIBDIR}/cmake/qknorm/qknormTargets.cmake)
  if(NOT EXISTS ${PREFIX}/${f})
    message(FATAL_ERROR "not installed: ${PREFIX}/${f}")
  endif()
endforeach()
file(GLOB cmake_files ${cmake_dir}/*.cmake)
foreach(f IN LISTS cmake_files)
  file(READ ${f} text)
  foreach(tree ${QKNORM_SOURCE_DIR} ${QKNORM_BUILD_DIR})
    string(FIND "${text}" "${tree}/" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "${f} names the tree ${tree}")
    endif()
  endforeach()
endforeach()

step("installed qknorm_property_test --gtest_filter=PropertyTable.*")
run(${PREFIX}/${CMAKE_INSTALL_BINDIR}/qknorm_property_test
    --gtest_filter=PropertyTable.* --gtest_brief=1)

step("configure examples/find_package_consumer against ${PREFIX}")
run(${CMAKE_COMMAND} -S ${QKNORM_SOURCE_DIR}/examples/find_package_consumer
    -B ${CONSUMER_BUILD_DIR} -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${PREFIX}
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)

step("build")
run(${CMAKE_COMMAND} --build ${CONSUMER_BUILD_DIR} -j2)

step("run the conformance suite on the example's backend")
set(xml ${CONSUMER_BUILD_DIR}/conformance.xml)
execute_process(
  COMMAND ${CONSUMER_BUILD_DIR}/naive_conformance --gtest_output=xml:${xml}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the conformance suite failed (exit ${rc})")
endif()
if(NOT out MATCHES "\\[  PASSED  \\] ([0-9]+) test")
  message(FATAL_ERROR "no gtest summary in the output")
endif()
if(CMAKE_MATCH_1 LESS kMinPassed)
  message(FATAL_ERROR "only ${CMAKE_MATCH_1} tests passed (< ${kMinPassed})")
endif()
if(NOT EXISTS ${xml})
  message(FATAL_ERROR "--gtest_output=xml wrote no ${xml}")
endif()
step("passed: ${CMAKE_MATCH_1} conformance tests")
