# Warnings are errors in cellgate's own code; third-party headers are included as SYSTEM by
# their imported targets, so they do not trip these. (-Wnull-dereference is left out: g++ 12
# reports false positives from inlined libstdc++ code at -O2.)
function(cellgate_warnings target)
  target_compile_options(${target} PRIVATE
    -Wall -Wextra -Wpedantic -Werror
    -Wshadow -Wnon-virtual-dtor -Wold-style-cast -Wcast-align -Wunused -Woverloaded-virtual
    -Wimplicit-fallthrough -Wformat=2)
  # clang checks the locking annotations of cellgate/mutex.hpp (docs/STYLE.md); g++ has no such
  # analysis and ignores them.
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE -Wthread-safety)
  endif()
  # With CELLGATE_FUZZ, coverage for libFuzzer in the libraries the fuzz targets drive (top-level
  # CMakeLists.txt).
  if(CELLGATE_FUZZ AND target IN_LIST CELLGATE_FUZZED_LIBRARIES)
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer-no-link)
  endif()
endfunction()
