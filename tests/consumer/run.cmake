# Builds tests/consumer as a separate project twice and runs it: against specdec installed into a staging
# prefix (find_package), and with specdec's source tree added by add_subdirectory.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()

function(build_and_run name)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/${name} ${ARGN}
                  RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "${name}: configuring the consumer project failed: ${rc}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/${name} --target consumer RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "${name}: building the consumer project failed: ${rc}")
  endif()
  # With the model file fetched, the consumer also decodes with it through the installed llama headers.
  set(model ${SOURCE_DIR}/models/SmolLM2-135M-Instruct.Q4_1.gguf)
  if(NOT EXISTS ${model})
    set(model "")
  endif()
  execute_process(COMMAND ${WORK_DIR}/${name}/consumer ${model} RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  message(STATUS "${name}: ${out}")
  if(rc OR NOT out MATCHES "identical: yes")
    message(FATAL_ERROR "${name}: the consumer program failed: ${rc}")
  endif()
endfunction()

# RelWithDebInfo (-O2): GCC 12 reports the false positives that eigen_core.hpp silences at -O2, not at -O3.
build_and_run(find_package -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
# No build type: specdec must not pick one for its parent (it picks Release only as the top-level project).
# -O2 in the flags instead, for the same false positives.
build_and_run(add_subdirectory -DCMAKE_BUILD_TYPE= -DCMAKE_CXX_FLAGS=-O2 -DSPECDEC_SOURCE_TREE=${SOURCE_DIR})
