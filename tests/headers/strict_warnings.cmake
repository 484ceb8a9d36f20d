# The programs that use the most of specdec, compiled with a demanding user's warnings as errors and specdec's
# headers as -I (as add_subdirectory brings them in), by each compiler given and for each instruction set whose
# kernels the headers hold: none named (the portable kernels), Haswell (AVX2) and the build machine's own
# (AVX-512 where it has it). -fsyntax-only: the front end, where these warnings come from, at -O0, where some of
# GCC's intrinsics are macros expanded in specdec's code.
# Arguments: SOURCE_DIR; COMPILERS, MARCHES and EIGEN_INCLUDE, lists separated by '|'.
foreach(list COMPILERS MARCHES EIGEN_INCLUDE)
  string(REPLACE "|" ";" ${list} "${${list}}")
endforeach()
set(warnings -Wall -Wextra -Wpedantic -Wconversion -Wsign-conversion -Wshadow -Wold-style-cast -Wdouble-promotion
  -Wcast-align -Wnon-virtual-dtor -Woverloaded-virtual -Wnull-dereference -Wimplicit-fallthrough -Wformat=2)
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
      execute_process(COMMAND ${compiler} -std=c++20 -fsyntax-only -Werror ${warnings} ${arch_flag} ${includes}
                        ${SOURCE_DIR}/${program}
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
