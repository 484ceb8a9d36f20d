# The programs that use the most of specdec, compiled with a demanding user's warnings (warning_flags.cmake) as
# errors and specdec's headers as -I (as add_subdirectory brings them in), by each compiler given and for each
# -march given: none (the portable kernels), and on x86-64 haswell (AVX2), skylake-avx512 (AVX-512 without VNNI:
# the AVX2 block kernels), icelake-server (VNNI without BF16) and sapphirerapids (VNNI and BF16), whatever the
# build machine has. -fsyntax-only at -O0, where some of GCC's intrinsics are macros expanded in specdec's code;
# the warnings that need the optimiser (-Wnull-dereference, -Wmaybe-uninitialized) are left to the packaging test,
# whose consumer builds with the same list at -O2.
# Arguments: SOURCE_DIR; COMPILERS, MARCHES and EIGEN_INCLUDE, lists separated by '|'.
foreach(list COMPILERS MARCHES EIGEN_INCLUDE)
  string(REPLACE "|" ";" ${list} "${${list}}")
endforeach()
include(${CMAKE_CURRENT_LIST_DIR}/warning_flags.cmake)
set(programs examples/generate.cpp examples/quickstart.cpp tests/consumer/main.cpp)
set(includes -I${SOURCE_DIR}/include)
foreach(dir IN LISTS EIGEN_INCLUDE)
  list(APPEND includes -isystem ${dir})
endforeach()

set(failed "")
foreach(compiler IN LISTS COMPILERS)
  foreach(march IN LISTS MARCHES)
    set(arch_flag "")
    set(arch_label "(no -march)")
    if(NOT march STREQUAL "none")
      set(arch_flag -march=${march})
      set(arch_label -march=${march})
    endif()
    foreach(program IN LISTS programs)
      execute_process(COMMAND ${compiler} -std=c++20 -fsyntax-only -Werror ${specdec_strict_warnings} ${arch_flag}
                        ${includes} ${SOURCE_DIR}/${program}
                      RESULT_VARIABLE rc ERROR_VARIABLE errors OUTPUT_VARIABLE output)
      get_filename_component(name ${compiler} NAME)
      if(rc)
        message("${name} ${arch_label} ${program}: failed\n${output}${errors}")
        list(APPEND failed "${name} ${arch_label} ${program}")
      else()
        message(STATUS "${name} ${arch_label} ${program}: no warnings")
      endif()
    endforeach()
  endforeach()
endforeach()
if(failed)
  list(JOIN failed "\n  " failed)
  message(FATAL_ERROR "warnings or errors in:\n  ${failed}")
endif()
