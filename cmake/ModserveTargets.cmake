# Helpers shared by every CMakeLists.txt: warnings for our own targets and the test wrapper.

function(modserve_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-missing-field-initializers>)
endfunction()

# modserve_add_test(NAME name SRCS a.cc ... DEPS lib ... LABELS cpu ...)
function(modserve_add_test)
  cmake_parse_arguments(T "" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SRCS})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  target_compile_definitions(${T_NAME} PRIVATE
    MODSERVE_SOURCE_DIR="${PROJECT_SOURCE_DIR}" MODSERVE_BINARY_DIR="${PROJECT_BINARY_DIR}")
  set_target_properties(${T_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  modserve_warnings(${T_NAME})
  if(NOT T_LABELS)
    set(T_LABELS cpu)
  endif()
  gtest_discover_tests(${T_NAME} PROPERTIES LABELS "${T_LABELS}" DISCOVERY_TIMEOUT 60)
endfunction()
